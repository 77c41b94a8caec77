#!/usr/bin/env bash
# make kind-cluster: the `taskherd` kind cluster (e2e/kind/cluster.yaml: one control-plane node, two
# workers), with kube-router as its pod network and the project's images loaded into every node.
# Idempotent: when the cluster is healthy it only loads images that changed; otherwise whatever is
# left of it is deleted and it is created afresh.
#
# Node image: taskherd.local/kind-node:<version>, built here (images/kind/build.sh) and run in a
# docker daemon of our own; or TASKHERD_KIND_NODE_IMAGE=kindest/node:<tag> with the environment's
# docker (needs a registry). Kubeconfig: $TASKHERD_HOME/kind/kubeconfig.
source "$(dirname "$0")/lib.sh"
T0=$SECONDS
take_lock kind-cluster
mkdir -p "$KIND_HOME"
CLUSTER_CONFIG="$KIND_SCRIPTS/cluster.yaml"
LOADED="$KIND_HOME/loaded-images"   # "archive size mtime" of each archive loaded into this cluster

[ -x "$KIND" ] || bash "$CLUSTER_SCRIPTS/build.sh" kind
[ -n "${TASKHERD_KUBECTL:-}" ] || [ -x "$KUBECTL" ] || bash "$CLUSTER_SCRIPTS/build.sh" kubernetes

if kind_built_here; then
    need_root
    NODE_TAR=$(bash "$REPO_ROOT/images/kind/build.sh" | tail -1)
    mount_cgroup_v1_controllers "$KIND_CGROUP_MOUNTS"
    start_kind_dockerd
    if [ "$(docker image inspect -f '{{.Id}}' "$KIND_NODE_IMAGE" 2>/dev/null)" != "$(cat "$NODE_TAR.id")" ]; then
        run_step_as installed "$KIND_NODE_IMAGE into kind's docker" kind-docker-load docker load -q -i "$NODE_TAR"
    fi
    ROUTER_IMAGE="taskherd.local/kube-router:$KUBE_ROUTER_VERSION"
    node_image_id=$(cat "$NODE_TAR.id")
else
    docker version >/dev/null 2>&1 || die "docker is not reachable (DOCKER_HOST=${DOCKER_HOST:-default}):" \
        "the pulled-image path uses the environment's docker"
    ROUTER_IMAGE="docker.io/cloudnativelabs/kube-router:$KUBE_ROUTER_VERSION"
    node_image_id=$KIND_NODE_IMAGE
fi
# What the running cluster was made from (its configuration, add-ons and images): a change recreates it.
CONFIG_KEY=$(cat "$CLUSTER_CONFIG" "$KIND_SCRIPTS"/manifests/*.yaml | { cat; echo "$node_image_id $ROUTER_IMAGE"; } |
    sha256sum | cut -c1-16)

kc() { "$KUBECTL" --kubeconfig "$KIND_KUBECONFIG" "$@"; }
nodes_ready() {
    [ "$(kc get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
        grep -c True)" = "$(grep -c -- '- role:' "$CLUSTER_CONFIG")" ]
}
rolled_out() { kc -n "$1" rollout status "$2" --timeout=5s; }
# made from the same inputs, and every node container running: then it is (or is about to be) healthy
intact() {
    [ "$(cat "$KIND_HOME/ready" 2>/dev/null)" = "$CONFIG_KEY" ] || return 1
    [ "$(docker ps -q --filter "label=io.x-k8s.kind.cluster=$KIND_CLUSTER_NAME" | wc -l)" = \
        "$(grep -c -- '- role:' "$CLUSTER_CONFIG")" ]
}
healthy() {
    [ "$(kc get --raw /readyz 2>/dev/null)" = ok ] && nodes_ready &&
        rolled_out kube-system daemonset/kube-router && rolled_out kube-system deployment/coredns
}

# load_images: every archive of make images' list (worker, operator, in-cluster services) and the
# debootstrap base (the smoke tests' pods), each once per cluster and again when it changes.
load_images() {
    local archives=() a stamp
    [ -f "$APP_IMAGES_LIST" ] && mapfile -t archives <"$APP_IMAGES_LIST"
    [ ${#archives[@]} -gt 0 ] || log "no $APP_IMAGES_LIST yet: run \`make images\` to get the worker and operator images"
    # this checkout's base (another checkout's may sit beside it under the same tag: loading both
    # would leave the tag on whichever came last)
    archives+=("$(bash "$REPO_ROOT/images/base/build.sh" | tail -1)")
    touch "$LOADED"
    for a in "${archives[@]}"; do
        [ -f "$a" ] || { log "WARNING: $a (listed in $APP_IMAGES_LIST) does not exist"; continue; }
        stamp="$a $(stat -c '%s %Y' "$a")"
        grep -qxF "$stamp" "$LOADED" && continue
        run_step_as installed "${a##*/} into the kind nodes" kind-load "$KIND" load image-archive "$a" --name "$KIND_CLUSTER_NAME"
        grep -v -F "$a " "$LOADED" >"$LOADED.new" || true
        echo "$stamp" >>"$LOADED.new"
        mv "$LOADED.new" "$LOADED"
    done
}

# route_pods: each node's pod range is routed from this host through the node, so that processes here
# reach pods by their IP as they do on the local cluster (the operator's cluster tests run the
# operator on this host and read its workers' metrics). Only with root, and never over a route
# this host already has to an address in those ranges.
route_pods() {
    [ "$(id -u)" = 0 ] || { log "not root: pod addresses are not routed from this host"; return 0; }
    local node cidr node_ip via
    : >"$KIND_HOME/routes.new"
    while read -r node cidr node_ip; do
        if [ -z "$cidr" ] || [ -z "$node_ip" ]; then continue; fi
        via=$(ip -4 route show exact "$cidr" | awk '{for (i = 1; i < NF; i++) if ($i == "via") print $(i + 1)}')
        if [ -z "$via" ] && ip -4 route show match "${cidr%/*}" | grep -qv '^default'; then
            log "WARNING: this host already routes $cidr elsewhere: pods of $node are not routed from it"
            continue
        fi
        [ "$via" = "$node_ip" ] || ip route replace "$cidr" via "$node_ip"
        echo "$cidr" >>"$KIND_HOME/routes.new"
    done < <(kc get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
    mv "$KIND_HOME/routes.new" "$KIND_HOME/routes"
}

# An intact cluster may be settling (a node just restarted): it gets time before being recreated.
if intact && wait_for "kind cluster $KIND_CLUSTER_NAME healthy" 180 healthy; then
    log "kind cluster $KIND_CLUSTER_NAME is up and healthy (kubeconfig: $KIND_KUBECONFIG)"
    route_pods
    load_images
    exit 0
fi

if "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER_NAME"; then
    log "kind cluster $KIND_CLUSTER_NAME is not healthy or was made from other inputs: recreating it"
    "$KIND" delete cluster --name "$KIND_CLUSTER_NAME" >&2
fi
rm -f "$KIND_HOME/ready" "$LOADED" "$KIND_KUBECONFIG"
unroute_pods

log "kind create cluster --name $KIND_CLUSTER_NAME --image $KIND_NODE_IMAGE"
# No --wait: with the default CNI disabled the nodes become Ready only once kube-router runs.
run_step_as started "kind cluster $KIND_CLUSTER_NAME" kind-create "$KIND" create cluster --name "$KIND_CLUSTER_NAME" \
    --image "$KIND_NODE_IMAGE" --config "$CLUSTER_CONFIG" --kubeconfig "$KIND_KUBECONFIG" --retain ||
    die "kind create cluster failed; its nodes are kept for inspection (\`$KIND export logs --name" \
        "$KIND_CLUSTER_NAME\`) until the next make kind-cluster or make kind-cluster-down"
chmod 600 "$KIND_KUBECONFIG"

sed "s|@IMAGE@|$ROUTER_IMAGE|g" "$KIND_SCRIPTS/manifests/kube-router.yaml" | kc apply -f - >/dev/null
kc replace -f "$KIND_SCRIPTS/manifests/coredns-config.yaml" >/dev/null   # kubeadm's, replaced
kc -n kube-system rollout restart deployment/coredns >/dev/null
wait_for "every node Ready (kube-router running)" 240 nodes_ready ||
    { kc get nodes -o wide >&2; kc -n kube-system get pods -o wide >&2; die "nodes not Ready"; }
wait_for "kube-router on every node" 120 rolled_out kube-system daemonset/kube-router || die "kube-router not ready"
wait_for "CoreDNS" 120 rolled_out kube-system deployment/coredns || die "CoreDNS not ready"
route_pods
load_images
echo "$CONFIG_KEY" >"$KIND_HOME/ready"
log "kind cluster up in $((SECONDS - T0)) s; kubeconfig: $KIND_KUBECONFIG"
log "  $KUBECTL --kubeconfig $KIND_KUBECONFIG get nodes"
