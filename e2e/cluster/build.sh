#!/usr/bin/env bash
# Build the cluster's binaries from the Go module proxy into $TASKHERD_HOME/bin/<component>-<version>/.
# Each component is rebuilt only when its pinned version (versions.env) changes: a finished build
# leaves a .complete stamp; a half-written output directory (no stamp) is rebuilt from scratch.
#
#   build.sh                 kubernetes etcd helm coredns crictl (what `make cluster` needs)
#   build.sh kind            also: sigs.k8s.io/kind (see docs/cluster.md)
#   build.sh kubeadm kind-containerd kube-router local-path-provisioner   what the kind node image adds (images/kind)
#   build.sh kubernetes etcd only those
source "$(dirname "$0")/lib.sh"
go_env
take_lock build

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kubernetes etcd helm coredns crictl)

# Module path to require, its version, and the packages to build, per component. A new component
# is one more case here (and a first-run estimate "go-<component>" in scripts/lib.sh).
spec() {
    case "$1" in
    kubernetes)
        MOD=k8s.io/kubernetes VER=$KUBERNETES_VERSION OUT=$K8S_BIN
        PKGS=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
              k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet
              k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl) ;;
    etcd)     MOD=go.etcd.io/etcd/server/v3 VER=$ETCD_VERSION OUT=$ETCD_BIN PKGS=(go.etcd.io/etcd/server/v3) ;;
    helm)     MOD=helm.sh/helm/v3 VER=$HELM_VERSION OUT=$HELM_BIN PKGS=(helm.sh/helm/v3/cmd/helm) ;;
    coredns)  MOD=github.com/coredns/coredns VER=$COREDNS_VERSION OUT=$COREDNS_BIN PKGS=(github.com/coredns/coredns) ;;
    crictl)   MOD=sigs.k8s.io/cri-tools VER=$CRICTL_VERSION OUT=$CRICTL_BIN PKGS=(sigs.k8s.io/cri-tools/cmd/crictl) ;;
    kind)     MOD=sigs.k8s.io/kind VER=$KIND_VERSION OUT=$KIND_BIN PKGS=(sigs.k8s.io/kind) ;;
    # ---- the kind node image (images/kind/build.sh) and its workflow linter
    kubeadm)  MOD=k8s.io/kubernetes VER=$KUBERNETES_VERSION OUT=$BIN_ROOT/kubeadm-$KUBERNETES_VERSION
              PKGS=(k8s.io/kubernetes/cmd/kubeadm) ;;
    kube-router) MOD=github.com/cloudnativelabs/kube-router/v2 VER=$KUBE_ROUTER_VERSION
              OUT=$BIN_ROOT/kube-router-$KUBE_ROUTER_VERSION PKGS=(github.com/cloudnativelabs/kube-router/v2/cmd/kube-router) ;;
    local-path-provisioner) MOD=github.com/rancher/local-path-provisioner VER=$LOCAL_PATH_PROVISIONER_VERSION
              OUT=$BIN_ROOT/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION PKGS=(github.com/rancher/local-path-provisioner) ;;
    kind-containerd) MOD=github.com/containerd/containerd/v2 VER=$KIND_CONTAINERD_VERSION
              OUT=$BIN_ROOT/containerd-$KIND_CONTAINERD_VERSION PKGS=(github.com/containerd/containerd/v2/cmd/containerd
              github.com/containerd/containerd/v2/cmd/ctr github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2) ;;
    actionlint) MOD=github.com/rhysd/actionlint VER=$ACTIONLINT_VERSION OUT=$BIN_ROOT/actionlint-$ACTIONLINT_VERSION
              PKGS=(github.com/rhysd/actionlint/cmd/actionlint) ;;
    *) die "unknown component $1" ;;
    esac
}

# Write go.mod for the wrapper module in $1 (the current directory).
generate_gomod() {
    local c=$1
    rm -f go.mod go.sum
    go mod init "taskherd.local/e2e/$c" >/dev/null 2>&1
    go mod edit -require "$MOD@$VER"
    if [ "$c" = kubernetes ] || [ "$c" = kubeadm ]; then
        # k8s.io/kubernetes replaces every staging module with ./staging/src/...; a module that
        # requires it must replace them with their published versions itself.
        local kmod staging
        kmod=$(go mod download -json "k8s.io/kubernetes@$VER" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
        awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$kmod" | while read -r staging; do
            go mod edit -replace "$staging=$staging@$KUBERNETES_STAGING_VERSION"
        done
    fi
}

ldflags() {
    local c=$1 date
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    case "$c" in
    kubernetes | kubeadm)
        local major minor f=() p
        major=${VER#v}; major=${major%%.*}
        minor=${VER#v*.}; minor=${minor%%.*}
        for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            # The module proxy does not carry the git commit; leave it empty rather than invent one.
            f+=("-X $p.gitVersion=$VER" "-X $p.gitMajor=$major" "-X $p.gitMinor=$minor"
                "-X $p.gitCommit=" "-X $p.gitTreeState=clean" "-X $p.buildDate=$date")
        done
        echo "-s -w ${f[*]}" ;;
    helm)
        # helm's own Makefile sets the Kubernetes version `helm template`/`lint` assume; without it
        # they assume v1.20 and refuse charts with kubeVersion ">=1.29". Assume the cluster's.
        local kube_minor=${KUBERNETES_VERSION#v1.}; kube_minor=${kube_minor%%.*}
        echo "-s -w -X helm.sh/helm/v3/internal/version.version=$VER -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
             "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kube_minor" \
             "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kube_minor" ;;
    coredns)
        echo "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$VER" ;;
    crictl) echo "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$VER" ;;
    kube-router) echo "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$VER" ;;
    kind-containerd) echo "-s -w -X github.com/containerd/containerd/v2/version.Version=$VER" \
        "-X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2" ;;
    local-path-provisioner) echo "-s -w -X main.VERSION=$VER" ;;
    actionlint) echo "-s -w -X github.com/rhysd/actionlint.version=${VER#v}" ;;
    *) echo "-s -w" ;;
    esac
}

# Build component $1 into $OUT; runs under run_step, so its output goes to the step's log.
build_component() {
    local c=$1
    spec "$c"
    local src="$TASKHERD_HOME/src/$c-$VER" repo_mod="$CLUSTER_SCRIPTS/gomod/$c"
    echo "building ${PKGS[*]} ($MOD $VER) -> $OUT with $(go version)"
    rm -rf "$OUT" "$src"
    mkdir -p "$src" "$OUT"
    cd "$src"
    cp "$repo_mod/tools.go" .
    # Use the committed go.mod/go.sum when they pin this exact version; otherwise generate them.
    if [ -f "$repo_mod/go.mod" ] && grep -qE "^[[:space:]]*(require )?$MOD $VER\$" "$repo_mod/go.mod"; then
        cp "$repo_mod/go.mod" .
        [ -f "$repo_mod/go.sum" ] && cp "$repo_mod/go.sum" .
    else
        echo "generating a wrapper go.mod for $MOD@$VER (commit gomod/$c/go.mod+go.sum to pin it)"
        generate_gomod "$c"
    fi
    go mod tidy
    go build -trimpath -ldflags "$(ldflags "$c")" -o "$OUT/" "${PKGS[@]}"
    case "$c" in  # name the binaries after what they are
    etcd) mv "$OUT/v3" "$OUT/etcd" 2>/dev/null || true; [ -x "$OUT/etcd" ] || mv "$OUT"/server "$OUT/etcd" ;;
    esac
    cp go.mod go.sum "$OUT/"
    touch "$OUT/.complete"
}

for c in "${components[@]}"; do
    spec "$c"
    if [ -f "$OUT/.complete" ]; then
        log "$c $VER: reused (built $(date -r "$OUT/.complete" +%F), $OUT)"
        step_done "$c $VER" reused 0
    else
        run_step "$c $VER" "go-$c" build_component "$c"
    fi
done
