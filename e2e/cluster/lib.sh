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
CRICTL_BIN="$BIN_ROOT/crictl-$CRICTL_VERSION"
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

# Go environment for reproducible builds from the module proxy. Uses a go >= GO_MIN_VERSION from
# PATH or /usr/local/go, else fetches $GO_TOOLCHAIN from the module proxy (golang.org/toolchain).
go_ok() {
    local v
    v=$("$1" env GOVERSION 2>/dev/null) || return 1
    v=${v#go}
    [ "$(printf '%s\n%s\n' "$GO_MIN_VERSION" "$v" | sort -V | head -1)" = "$GO_MIN_VERSION" ]
}
go_env() {
    export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
    local cand dir="$TASKHERD_HOME/toolchain/$GO_TOOLCHAIN"
    for cand in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go "$dir/bin/go"; do
        if [ -n "$cand" ] && [ -x "$cand" ] && go_ok "$cand"; then
            export PATH="$(dirname "$cand"):$PATH"
            return 0
        fi
    done
    local proxy=${GOPROXY:-https://proxy.golang.org}
    proxy=${proxy%%,*}
    local url="$proxy/golang.org/toolchain/@v/v0.0.1-$GO_TOOLCHAIN.linux-amd64.zip"
    log "no go >= $GO_MIN_VERSION found: fetching $GO_TOOLCHAIN from $url"
    ensure_apt curl unzip
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    curl -fsSL -o "$dir.partial/toolchain.zip" "$url"
    unzip -q "$dir.partial/toolchain.zip" -d "$dir.partial/x"
    rm -rf "$dir"
    mv "$dir.partial/x/golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-amd64" "$dir"
    rm -rf "$dir.partial"
    go_ok "$dir/bin/go" || die "fetched toolchain $dir does not work"
    export PATH="$dir/bin:$PATH"
}

# ---- processes this project starts: one pid file per component, "PID EXE", in $STATE/run ----
RUN_DIR="$STATE/run"
LOG_DIR="$STATE/logs"

# PID of component $1 if its pid file names a live process still running the recorded binary
# (guards against a stale pid file whose PID was reused by something else).
proc_pid() {
    local f="$RUN_DIR/$1.pid" pid exe
    [ -f "$f" ] || return 1
    read -r pid exe <"$f" || true
    [ -n "${pid:-}" ] && [ -d "/proc/$pid" ] || return 1
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null | sed 's/ (deleted)$//')" = "$exe" ] || return 1
    echo "$pid"
}

# start_proc NAME BINARY ARGS...: detached (own session), logs to $LOG_DIR/NAME.log
start_proc() {
    local name=$1 exe
    shift
    exe=$(readlink -f "$1")
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null 9>&- &
    local pid=$!
    echo "$pid $exe" >"$RUN_DIR/$name.pid"
    sleep 0.2
    proc_pid "$name" >/dev/null || { tail -20 "$LOG_DIR/$name.log" >&2; die "$name exited at once (log: $LOG_DIR/$name.log)"; }
    log "started $name (pid $pid)"
}

# stop_proc NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS; removes the pid file
stop_proc() {
    local name=$1 grace=${2:-15} pid i
    if pid=$(proc_pid "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < grace * 10; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        if [ -d "/proc/$pid" ]; then
            log "$name (pid $pid) ignored SIGTERM for ${grace}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        fi
        log "stopped $name (pid $pid)"
    fi
    rm -f "$RUN_DIR/$name.pid"
}

# wait_for DESCRIPTION SECONDS COMMAND...: poll every 0.5 s, log progress every 10 s, fail loudly
wait_for() {
    local what=$1 limit=$2 start=$SECONDS next=10
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS - start >= limit)); then
            log "timed out after ${limit}s waiting for $what; last attempt said:"
            "$@" 2>&1 | tail -5 >&2 || true
            return 1
        fi
        if ((SECONDS - start >= next)); then log "waiting for $what ($((SECONDS - start))s)"; next=$((next + 10)); fi
        sleep 0.5
    done
}

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
ctr_() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# One cluster operation at a time per $TASKHERD_HOME (several clones share it). Re-entrant for
# child scripts through TASKHERD_LOCK_HELD.
take_lock() {
    local name=$1
    [ "${TASKHERD_LOCK_HELD:-}" = "$name" ] && return 0
    mkdir -p "$TASKHERD_HOME"
    # fd 9; start_proc closes it for the daemons so that they do not hold the lock
    exec 9>"$TASKHERD_HOME/$name.lock"
    if ! flock -n 9; then
        log "waiting for another $name operation to finish ($TASKHERD_HOME/$name.lock)"
        flock 9
    fi
    export TASKHERD_LOCK_HELD=$name
}

# The host-level pieces (bridge taskherd0, iptables chains, the kubelet's kubepods cgroups, sysctls)
# exist once per machine. This file names the TASKHERD_HOME whose cluster owns them, so that a
# second checkout with another TASKHERD_HOME neither starts a colliding cluster nor tears down
# the pieces of a running one.
HOST_OWNER_FILE=/run/taskherd-cluster.owner
# Print the other TASKHERD_HOME if a cluster started from it is alive.
other_cluster_home() {
    local other f pid exe me
    [ -f "$HOST_OWNER_FILE" ] || return 1
    other=$(cat "$HOST_OWNER_FILE")
    me=$(readlink -f "$TASKHERD_HOME" 2>/dev/null || echo "$TASKHERD_HOME")
    [ -n "$other" ] && [ "$other" != "$me" ] || return 1
    for f in "$other"/cluster/run/*.pid; do
        [ -f "$f" ] || continue
        read -r pid exe <"$f" || true
        if [ -n "${pid:-}" ] && [ -d "/proc/$pid" ] &&
            [ "$(readlink "/proc/$pid/exe" 2>/dev/null | sed 's/ (deleted)$//')" = "$exe" ]; then
            echo "$other"
            return 0
        fi
    done
    return 1
}
