# shellcheck shell=bash disable=SC2034  # the settings below are for the scripts that source it
# Settings and helpers of the local cluster scripts (and the image builds), on top of the project's
# shell library scripts/lib.sh. Source it; do not execute it.
set -euo pipefail

CLUSTER_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CLUSTER_SCRIPTS/../.." && pwd)"
LOG_TAG="${LOG_TAG:-cluster}"
# shellcheck source=../../scripts/lib.sh
source "$REPO_ROOT/scripts/lib.sh"
# shellcheck source=versions.env
source "$CLUSTER_SCRIPTS/versions.env"

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
            PATH="$(dirname "$cand"):$PATH"
            export PATH
            return 0
        fi
    done
    local proxy=${GOPROXY:-https://proxy.golang.org}
    proxy=${proxy%%,*}
    local url="$proxy/golang.org/toolchain/@v/v0.0.1-$GO_TOOLCHAIN.linux-amd64.zip"
    log "no go >= $GO_MIN_VERSION found: fetching $GO_TOOLCHAIN from $url"
    apt_install curl unzip
    run_step "Go toolchain $GO_TOOLCHAIN" go-toolchain fetch_go_toolchain "$url" "$dir"
    go_ok "$dir/bin/go" || die "fetched toolchain $dir does not work"
    export PATH="$dir/bin:$PATH"
}
fetch_go_toolchain() {  # URL DIR
    local url=$1 dir=$2
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    curl -fsSL -o "$dir.partial/toolchain.zip" "$url"
    unzip -q "$dir.partial/toolchain.zip" -d "$dir.partial/x"
    rm -rf "$dir"
    mv "$dir.partial/x/golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-amd64" "$dir"
    rm -rf "$dir.partial"
}

# ---- processes this project starts: one pid file per component, "PID EXE", in $STATE/run ----
RUN_DIR="$STATE/run"
LOG_DIR="$STATE/logs"

# PID of component $1 if its pid file ("PID EXE") names a live process still running the recorded
# binary (a stale pid file whose PID was reused by something else names nothing).
proc_pid() { pidfile_pid "$RUN_DIR/$1.pid"; }

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
stop_proc() { stop_pidfile "$1" "$RUN_DIR/$1.pid" "${2:-15}"; }

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
        local t0=$SECONDS
        until flock -w 20 9; do log "still waiting for the other $name operation: $(fmt_duration $((SECONDS - t0)))"; done
    fi
    export TASKHERD_LOCK_HELD=$name
}

# mount_cgroup_v1_controllers RECORD: on a cgroup v1 host, mounts the controllers a kubelet needs
# (cpu, cpuacct, cpuset, memory; pids and hugetlb when the kernel has them) that the host has not
# mounted, and appends each mount point to RECORD for unmount_recorded_cgroups. Both clusters need
# it: the local kubelet runs on the host; a kind node's systemd mounts every controller of
# /proc/cgroups, and kind's entrypoint prepares the kubelet's cgroup only in those mounted on the
# host when the node starts (without hugetlb on the host: "cgroup ["kubelet"] has some missing
# paths: /sys/fs/cgroup/hugetlb/kubelet.slice", and kubeadm init waits forever).
mount_cgroup_v1_controllers() {
    local record=$1 ctl
    [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] || return 0
    for ctl in cpu cpuacct cpuset memory pids hugetlb; do
        if ! awk -v c="$ctl" '$1 == c && $4 == 1 {f=1} END {exit !f}' /proc/cgroups; then
            [ "$ctl" = hugetlb ] || [ "$ctl" = pids ] || die "cgroup controller $ctl is not available"
            continue
        fi
        if ! awk '$3 == "cgroup" {print $4}' /proc/mounts | tr ',' '\n' | grep -qx "$ctl"; then
            log "mounting missing cgroup v1 controller $ctl"
            mkdir -p "/sys/fs/cgroup/$ctl"
            mount -t cgroup -o "$ctl" cgroup "/sys/fs/cgroup/$ctl"
            mkdir -p "$(dirname "$record")"
            echo "/sys/fs/cgroup/$ctl" >>"$record"
        fi
    done
}

# unmount_recorded_cgroups RECORD: undoes mount_cgroup_v1_controllers (a mount still in use stays).
unmount_recorded_cgroups() {
    local record=$1 m
    [ -f "$record" ] || return 0
    while read -r m; do
        if umount "$m" 2>/dev/null; then rmdir "$m" 2>/dev/null || true; fi
    done <"$record"
    rm -f "$record"
}

# The host-level pieces (bridge taskherd0, iptables chains, the kubelet's kubepods cgroups, sysctls)
# exist once per machine. This file names the TASKHERD_HOME whose cluster owns them, so that a
# second checkout with another TASKHERD_HOME neither starts a colliding cluster nor tears down
# the pieces of a running one.
HOST_OWNER_FILE=/run/taskherd-cluster.owner
# Print the other TASKHERD_HOME if a cluster started from it is alive.
other_cluster_home() {
    local other f me
    [ -f "$HOST_OWNER_FILE" ] || return 1
    other=$(cat "$HOST_OWNER_FILE")
    me=$(readlink -f "$TASKHERD_HOME" 2>/dev/null || echo "$TASKHERD_HOME")
    [ -n "$other" ] && [ "$other" != "$me" ] || return 1
    for f in "$other"/cluster/run/*.pid; do
        if pidfile_pid "$f" >/dev/null; then
            echo "$other"
            return 0
        fi
    done
    return 1
}
