#!/usr/bin/env bash
# make kind-image: the kind node image taskherd.local/kind-node:<kubernetes version>, built here with
# no registry by kind's own builder (`kind build node-image --type file`), fed a Kubernetes server
# tarball assembled from this project's builds:
#   kubeadm, kubelet, kubectl                    e2e/cluster/build.sh (v1.34.4)
#   kube-apiserver, -controller-manager,         images of those binaries, tagged as kubeadm asks
#   -scheduler, kube-proxy, etcd, CoreDNS        (`kubeadm config images list`); etcd and CoreDNS are
#                                                the project's builds under kubeadm's names (their
#                                                org.opencontainers.image.version label says which)
#   pause                                        images/pause (containerd's sandbox image)
#   kube-router                                  the pod network (e2e/kind/manifests/kube-router.yaml)
#   local-path-provisioner and its helper        kind's default storage, under the tags kind expects
#   kindnetd                                     NOT built (the Go module proxy does not serve it):
#                                                a placeholder under kind's tag that exits saying so
# on a base image made like kind's (images/kind/node-base.sh).
# Prints the path of the saved node image (docker archive); rebuilt only when an input changes.
source "$(dirname "$0")/../lib.sh"
# shellcheck source=../../e2e/kind/lib.sh
source "$REPO_ROOT/e2e/kind/lib.sh"
need_root
take_lock kind-image
apt_install docker.io debootstrap debian-archive-keyring jq pigz

bash "$CLUSTER_SCRIPTS/build.sh" kubernetes etcd coredns crictl kind kubeadm kind-containerd kube-router \
    local-path-provisioner
KUBEADM_BIN="$BIN_ROOT/kubeadm-$KUBERNETES_VERSION"
KUBE_ROUTER_BIN="$BIN_ROOT/kube-router-$KUBE_ROUTER_VERSION"
LPP_BIN="$BIN_ROOT/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION"

go_env
module_dir() { (cd / && go mod download -json "$1" | jq -r .Dir); }
KIND_SRC=$(module_dir "sigs.k8s.io/kind@$KIND_VERSION")
KUBE_ROUTER_SRC=$(module_dir "github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION")

# ---- the image names the node needs: kubeadm's list, and kind's own (pkg/build/nodeimage/const_*.go)
mapfile -t KUBEADM_IMAGES < <("$KUBEADM_BIN/kubeadm" config images list --kubernetes-version "$KUBERNETES_VERSION")
kubeadm_image() {
    local i
    for i in "${KUBEADM_IMAGES[@]}"; do [[ "${i%:*}" == */"$1" ]] && { echo "$i"; return 0; }; done
    die "kubeadm $KUBERNETES_VERSION lists no $1 image: ${KUBEADM_IMAGES[*]}"
}
kind_const() {
    local v
    v=$(sed -n "s/^const $1 = \"\(.*\)\"\$/\1/p" "$KIND_SRC/pkg/build/nodeimage/$2")
    [ -n "$v" ] || die "no const $1 in kind $KIND_VERSION's pkg/build/nodeimage/$2"
    echo "$v"
}
KINDNETD_IMAGE=$(kind_const kindnetdImage const_cni.go)
LPP_IMAGE=$(kind_const storageProvisionerImage const_storage.go)
LPH_IMAGE=$(kind_const storageHelperImage const_storage.go)
KUBE_ROUTER_IMAGE="taskherd.local/kube-router:$KUBE_ROUTER_VERSION"
sandbox=$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$KIND_SRC/images/base/files/etc/containerd/config.toml")
[ "$sandbox" = "$PAUSE_IMAGE" ] || die "kind $KIND_VERSION's containerd config uses sandbox image $sandbox," \
    "the project builds $PAUSE_IMAGE (PAUSE_IMAGE in e2e/cluster/versions.env): make them agree"

# ---- root filesystems and the pause image (each cached on its own)
PAUSE_TAR=$(bash "$IMAGES_SRC/pause/build.sh")
NODE_BASE_ROOTFS=$(bash "$IMAGES_SRC/kind/node-base.sh" "$KIND_SRC")
NETBASE_ROOTFS=$(bash "$IMAGES_SRC/kind/netbase.sh" "$KUBE_ROUTER_SRC")

# image NAME TAG [mkimage.py options]: $work/img/NAME.tar from the root filesystem $work/NAME
image() {
    local name=$1 tag=$2
    shift 2
    python3 "$IMAGES_SRC/mkimage.py" --tag "$tag" --rootfs "$work/$name" "$@" -o "$work/img/$name.tar"
}
# rootfs NAME [netbase] FILE...: $work/NAME with FILE... in /usr/local/bin, on the netbase root if asked
rootfs() {
    local dir="$work/$1"
    shift
    mkdir -p "$dir/usr/local/bin" "$dir/tmp"
    chmod 1777 "$dir/tmp"
    if [ "${1:-}" = netbase ]; then tar -C "$dir" -xf "$NETBASE_ROOTFS"; shift; fi
    install -m 0755 "$@" "$dir/usr/local/bin/"
}
version_label() { echo "--label=org.opencontainers.image.version=$1"; }

# the component images (docker archives) in $work/img
component_images() {
    local c
    for c in kube-apiserver kube-controller-manager kube-scheduler; do
        rootfs "$c" "$K8S_BIN/$c"
        image "$c" "$(kubeadm_image "$c")" "$(version_label "$KUBERNETES_VERSION")"
    done
    rootfs kube-proxy netbase "$K8S_BIN/kube-proxy"
    image kube-proxy "$(kubeadm_image kube-proxy)" "$(version_label "$KUBERNETES_VERSION")"
    rootfs etcd "$ETCD_BIN/etcd"
    image etcd "$(kubeadm_image etcd)" "$(version_label "$ETCD_VERSION")"
    rootfs coredns "$COREDNS_BIN/coredns"
    mv "$work/coredns/usr/local/bin/coredns" "$work/coredns/coredns"   # where kubeadm's manifest expects it
    image coredns "$(kubeadm_image coredns)" --entrypoint /coredns "$(version_label "$COREDNS_VERSION")"
    rootfs kube-router netbase "$KUBE_ROUTER_BIN/kube-router"
    mkdir -p "$work/kube-router/var/lib/gobgp"
    image kube-router "$KUBE_ROUTER_IMAGE" --entrypoint /usr/local/bin/kube-router \
        "$(version_label "$KUBE_ROUTER_VERSION")"
    rootfs local-path-provisioner "$LPP_BIN/local-path-provisioner"
    image local-path-provisioner "$LPP_IMAGE" --entrypoint /usr/local/bin/local-path-provisioner \
        "$(version_label "$LOCAL_PATH_PROVISIONER_VERSION")"
    # the provisioner's helper pods run its setup and teardown scripts: sh, mkdir, rm
    python3 "$IMAGES_SRC/mkimage.py" --tag "$LPH_IMAGE" --rootfs-tar "$NETBASE_ROOTFS" -o "$work/img/local-path-helper.tar"
    cat >"$work/kindnetd-placeholder.sh" <<'SH'
#!/bin/sh
echo "kindnetd is not in this node image (the Go module proxy does not serve it): create the cluster" \
     "with networking.disableDefaultCNI: true and install kube-router, as e2e/kind/up.sh does" >&2
exit 1
SH
    rootfs kindnetd-placeholder netbase "$work/kindnetd-placeholder.sh"
    image kindnetd-placeholder "$KINDNETD_IMAGE" --entrypoint /usr/local/bin/kindnetd-placeholder.sh
}

# the server tarball kind's builder reads (kubernetes/version, kubernetes/server/bin/...); prints its path
server_tarball() {
    local s="$work/server/kubernetes" c tgz="$work/kubernetes-server-linux-amd64.tar.gz"
    mkdir -p "$s/server/bin"
    echo "$KUBERNETES_VERSION" >"$s/version"
    install -m 0755 "$KUBEADM_BIN/kubeadm" "$K8S_BIN/kubelet" "$K8S_BIN/kubectl" "$s/server/bin/"
    for c in kube-apiserver kube-controller-manager kube-scheduler; do mv "$work/img/$c.tar" "$s/server/bin/"; done
    python3 "$IMAGES_SRC/kind/merge_archives.py" -o "$s/server/bin/kube-proxy.tar" "$work/img/kube-proxy.tar" \
        "$work/img/etcd.tar" "$work/img/coredns.tar" "$PAUSE_TAR" "$work/img/kube-router.tar" \
        "$work/img/local-path-provisioner.tar" "$work/img/local-path-helper.tar" "$work/img/kindnetd-placeholder.tar"
    tar -C "$work/server" -cf - kubernetes | pigz -1 >"$tgz"
    echo "$tgz"
}

# build_node_image OUT: the node image, built by kind in kind's docker daemon and saved to OUT; the
# image ID goes to <OUT without .partial>.id
build_node_image() {
    local out=$1 id="${1%.partial}.id" tgz base_tag started=
    work="$IMAGES_CACHE/kind-node-work"
    safe_rmtree "$work"
    mkdir -p "$work/img" "$work/tmp"
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "safe_rmtree $(printf %q "$work")" EXIT
    component_images
    tgz=$(server_tarball)
    echo "server tarball: $tgz ($(du -h "$tgz" | cut -f1))"
    kind_dockerd_pid >/dev/null || started=1
    start_kind_dockerd
    # shellcheck disable=SC2064
    [ -z "$started" ] || trap "stop_kind_dockerd; safe_rmtree $(printf %q "$work")" EXIT
    base_tag="taskherd.local/kind-base:${NODE_BASE_ROOTFS##*/kind-base-}"
    base_tag=${base_tag%.rootfs.tar}
    if ! docker image inspect "$base_tag" >/dev/null 2>&1; then
        # the image configuration of kind's base; docker 20.10's import cannot set STOPSIGNAL, a build can
        docker import "$NODE_BASE_ROOTFS" "$base_tag-rootfs"
        mkdir -p "$work/base-context"
        cat >"$work/base-context/Dockerfile" <<EOF
FROM $base_tag-rootfs
ENV container=docker PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# systemd exits on SIGRTMIN+3, not SIGTERM
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
EOF
        DOCKER_BUILDKIT=0 docker build --network none -t "$base_tag" "$work/base-context"
        docker rmi "$base_tag-rootfs"
    fi
    # kind extracts the tarball under TMPDIR and leaves it there
    TMPDIR="$work/tmp" "$KIND" build node-image --type file --base-image "$base_tag" --image "$KIND_BUILT_IMAGE" "$tgz"
    docker save -o "$out" "$KIND_BUILT_IMAGE"
    rm -f "${id%-*}"-*.id
    docker image inspect -f '{{.Id}}' "$KIND_BUILT_IMAGE" >"$id"
    docker image prune -f   # superseded builds of the same tag
}

key=$(content_key "$0" "$IMAGES_SRC/kind/merge_archives.py" "$IMAGES_SRC/mkimage.py" \
    "$CLUSTER_SCRIPTS/versions.env" "${PAUSE_TAR##*/}" "${NODE_BASE_ROOTFS##*/}" "${NETBASE_ROOTFS##*/}")
out="$IMAGES_CACHE/kind-node-$KUBERNETES_VERSION-$key.tar"
[ -f "$out.id" ] || rm -f "$out"   # an archive without its image ID is from an interrupted run
cached_image kind-node "$out" build_node_image
