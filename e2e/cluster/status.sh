#!/usr/bin/env bash
# What the local cluster runs, by PID, and how much memory it uses (RSS and the pods' cgroup).
source "$(dirname "$0")/lib.sh"
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
total=0
printf '%-24s %8s %10s\n' COMPONENT PID RSS_MiB
for c in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    if pid=$(proc_pid "$c"); then
        rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
        total=$((total + rss))
        printf '%-24s %8s %10s\n' "$c" "$pid" "$(mib "$rss")"
    else
        printf '%-24s %8s %10s\n' "$c" - "not running"
    fi
done
shims=0
for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    case "$cmd" in *containerd-shim*"$CONTAINERD_SOCK"*)
        shims=$((shims + $(awk '/^VmRSS/ {print $2}' "$p/status" 2>/dev/null || echo 0))) ;;
    esac
done
pods=0
[ -f /sys/fs/cgroup/memory/kubepods/memory.usage_in_bytes ] &&
    pods=$(( $(cat /sys/fs/cgroup/memory/kubepods/memory.usage_in_bytes) / 1024 ))
printf '%-24s %8s %10s\n' "containerd shims" - "$(mib "$shims")"
printf '%-24s %8s %10s\n' "pods (kubepods cgroup)" - "$(mib "$pods")"
printf '%-24s %8s %10s\n' TOTAL - "$(mib $((total + shims + pods)))"
[ -f "$KUBECONFIG_PATH" ] && echo "kubeconfig: $KUBECONFIG_PATH"
