#!/usr/bin/env bash
# make kind-cluster-down: delete the `taskherd` kind cluster and, on the built-here path, stop the
# docker daemon it ran in. The daemon's data root ($TASKHERD_HOME/kind/docker/data) keeps the node
# image, so the next make kind-cluster does not load it again; the image archives stay cached.
source "$(dirname "$0")/lib.sh"
take_lock kind-cluster
if kind_built_here; then
    need_root
    use_kind_docker
    kind_dockerd_pid >/dev/null || {
        unroute_pods; stop_kind_dockerd; unmount_kind_cgroups
        rm -f "$KIND_HOME/ready" "$KIND_HOME/loaded-images"; exit 0
    }
fi
if [ -x "$KIND" ] && "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER_NAME"; then
    "$KIND" delete cluster --name "$KIND_CLUSTER_NAME" >&2
fi
rm -f "$KIND_HOME/ready" "$KIND_HOME/loaded-images" "$KIND_KUBECONFIG"
unroute_pods
if kind_built_here; then stop_kind_dockerd; unmount_kind_cgroups; fi
log "kind cluster $KIND_CLUSTER_NAME deleted"
