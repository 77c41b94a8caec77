#!/usr/bin/env bash
# Stop the local cluster and remove its state. Stops exactly what up.sh started (by the PIDs in
# $TASKHERD_HOME/cluster/run), then removes what those processes left behind: pod sandboxes and
# their network namespaces, mounts below the state directory, the pod bridge, iptables chains, the
# kubelet's cgroups, and restores the sysctls up.sh changed. Safe to run at any time, repeatedly,
# and after a crash or a half-finished up.sh. The last run's logs are kept in
# $TASKHERD_HOME/cluster-logs.last.
source "$(dirname "$0")/lib.sh"
need_root
take_lock cluster
BRIDGE=taskherd0
CRICTL=("$CRICTL_BIN/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 30s)

HOST_MINE=1
if other=$(other_cluster_home); then
    HOST_MINE=
    log "the bridge, iptables chains and pod cgroups belong to the running cluster of TASKHERD_HOME=$other: left alone"
fi
stop_proc kubelet 30
if proc_pid containerd >/dev/null && [ -x "$CRICTL_BIN/crictl" ]; then
    # Stop and remove every pod sandbox the normal way: CNI DEL, network namespace, mounts.
    if [ -n "$("${CRICTL[@]}" pods -q 2>/dev/null)" ]; then
        run_step_as removed "pod sandboxes" crictl-rmp timeout 120 "${CRICTL[@]}" rmp -fa ||
            log "crictl rmp -fa failed; cleaning up by hand"
    fi
fi
stop_proc kube-proxy
if [ -x "$K8S_BIN/kube-proxy" ] && iptables -w -t nat -S 2>/dev/null | grep -q 'KUBE-SERVICES'; then
    "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || log "kube-proxy --cleanup reported errors"
fi
# The kubelet's own chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) and anything
# kube-proxy left: KUBE-* belongs to Kubernetes, and the only Kubernetes on this machine is ours.
if [ -n "$HOST_MINE" ] && ! proc_pid kubelet >/dev/null && ! proc_pid kube-proxy >/dev/null; then
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null || continue
        for table in filter nat mangle raw; do
            rules=$("$ipt" -w -t "$table" -S 2>/dev/null) || continue
            echo "$rules" | grep -E '^-A [^ ]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | sed 's/^-A /-D /' |
                while read -r rule; do eval "$ipt -w -t $table $rule" 2>/dev/null || true; done || true
            for chain in $(echo "$rules" | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
                "$ipt" -w -t "$table" -F "$chain" 2>/dev/null || true
            done
            for chain in $(echo "$rules" | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
                "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || true
            done
        done
    done
fi
stop_proc kube-scheduler
stop_proc kube-controller-manager
stop_proc kube-apiserver
stop_proc etcd
stop_proc containerd

# Shims of our containerd (identified by our socket in their arguments) outlive it by design.
for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    case "$cmd" in
    *containerd-shim*"$CONTAINERD_SOCK"*) log "killing leftover shim ${p#/proc/}"; kill -KILL "${p#/proc/}" 2>/dev/null || true ;;
    esac
done
# Container processes still in our kubelet's pod cgroups (only after a crash): kill them, then
# remove the cgroups, deepest first.
if [ -n "$HOST_MINE" ] && { [ -d /sys/fs/cgroup/pids/kubepods ] || [ -d /sys/fs/cgroup/memory/kubepods ]; }; then
    for i in 1 2 3; do
        mapfile -t pids < <(find /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
        [ ${#pids[@]} -gt 0 ] || break
        log "killing leftover pod processes: ${pids[*]}"
        kill -KILL "${pids[@]}" 2>/dev/null || true
        sleep 1
    done
    for d in /sys/fs/cgroup/*/kubepods; do
        if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
    done
fi

# Network namespaces of our pod sandboxes that were not removed through the CRI.
if [ -d "$STATE/containerd" ]; then
    python3 - "$STATE/containerd" <<'PY' | while read -r ns; do umount "$ns" 2>/dev/null || true; rm -f "$ns"; log "removed netns $ns"; done
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/state/io.containerd.runtime.v2.task/*/*/config.json"):
    try:
        for n in json.load(open(f)).get("linux", {}).get("namespaces", []):
            if n.get("type") == "network" and n.get("path", "").startswith("/var/run/netns/cni-"):
                print(n["path"])
    except (OSError, ValueError):
        pass
PY
fi

# Mounts below the state directory (overlay rootfs, pod volumes, ...), deepest first.
if [ -d "$STATE" ]; then
    st=$(readlink -f "$STATE")
    awk -v d="$st" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
    done
fi

# Host network set-up.
if [ -n "$HOST_MINE" ]; then
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; log "deleted bridge $BRIDGE"; fi
    while iptables -w -D FORWARD -m comment --comment "taskherd cluster" -j TASKHERD-FORWARD 2>/dev/null; do :; done
    if iptables -w -S TASKHERD-FORWARD >/dev/null 2>&1; then
        iptables -w -F TASKHERD-FORWARD && iptables -w -X TASKHERD-FORWARD
    fi
    if [ "$(cat "$HOST_OWNER_FILE" 2>/dev/null)" = "$(readlink -f "$TASKHERD_HOME")" ]; then rm -f "$HOST_OWNER_FILE"; fi
fi
if [ -n "$HOST_MINE" ] && [ -f "$STATE/host/sysctl.orig" ]; then
    # the first value recorded for each key is the one before the cluster
    awk -F= '!seen[$1]++' "$STATE/host/sysctl.orig" | while IFS='=' read -r k v; do sysctl -qw "$k=$v" || true; done
fi
unmount_recorded_cgroups "$STATE/host/cgroup-mounts"

if [ -d "$STATE" ]; then
    if [ -d "$LOG_DIR" ]; then
        rm -rf "$TASKHERD_HOME/cluster-logs.last"
        mv "$LOG_DIR" "$TASKHERD_HOME/cluster-logs.last"
    fi
    rm -rf --one-file-system "$STATE" || die "could not remove $STATE (mount still busy?)"
    log "cluster stopped; state removed (logs of that run: $TASKHERD_HOME/cluster-logs.last)"
fi
