# Common settings for the taskherd local cluster scripts. Source it; do not execute it.
set -euo pipefail

CLUSTER_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CLUSTER_SCRIPTS/../.." && pwd)"
# shellcheck source=versions.env
source "$CLUSTER_SCRIPTS/versions.env"

export TASKHERD_HOME="${TASKHERD_HOME:-$HOME/.cache/taskherd}"
BIN_ROOT="$TASKHERD_HOME/bin"
K8S_BIN="$BIN_ROOT/kubernetes-$KUBERNETES_VERSION"
ETCD_BIN="$BIN_ROOT/etcd-$ETCD_VERSION"
HELM_BIN="$BIN_ROOT/helm-$HELM_VERSION"
COREDNS_BIN="$BIN_ROOT/coredns-$COREDNS_VERSION"
KIND_BIN="$BIN_ROOT/kind-$KIND_VERSION"
STATE="$TASKHERD_HOME/cluster"
IMAGES_CACHE="$TASKHERD_HOME/images"
KUBECONFIG_PATH="$STATE/admin.kubeconfig"
KUBECTL="$K8S_BIN/kubectl"

# Network plan: nothing here may overlap this machine's routes (eth0 192.0.2.0/24, resolver
# 10.255.255.53). Checked at start-up by up.sh.
POD_CIDR=172.28.0.0/16
SERVICE_CIDR=172.29.0.0/16
API_SERVICE_IP=172.29.0.1
DNS_SERVICE_IP=172.29.0.10
CLUSTER_DOMAIN=cluster.local
API_PORT=6443
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
NODE_NAME="${TASKHERD_NODE_NAME:-taskherd-node}"
NODE_IP=127.0.0.1
CONTAINERD_SOCK="$STATE/containerd/containerd.sock"
CNI_BIN_DIR=/usr/lib/cni

log() { printf '%s [cluster] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (kubelet and containerd need it)"; }

# Install Debian packages that are missing; apt-get update only when something is missing.
ensure_apt() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Go environment for reproducible builds from the module proxy.
go_env() {
    export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
    command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || die "go toolchain not found"
    command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
}
