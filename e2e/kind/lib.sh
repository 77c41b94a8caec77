# shellcheck shell=bash disable=SC2034  # the settings below are for the scripts that source it
# Common settings for the kind cluster (e2e/kind) and its node image (images/kind). Source it.
#
# Two ways to run kind, chosen by the node image:
#   built here  taskherd.local/kind-node:<kubernetes version> (make kind-image), in a docker daemon of
#               our own (below), with the kube-router image built into the node image;
#   pulled      TASKHERD_KIND_NODE_IMAGE=kindest/node:<tag> (needs a registry), in the docker daemon
#               of the environment (DOCKER_HOST or the default socket), kube-router's public image.
# Either way the pod network is kube-router, which enforces NetworkPolicy.
LOG_TAG=kind
# shellcheck source=../cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

KIND_SCRIPTS="$REPO_ROOT/e2e/kind"
KIND="$KIND_BIN/kind"
KIND_HOME="$TASKHERD_HOME/kind"
KIND_CLUSTER_NAME=taskherd
KIND_KUBECONFIG="$KIND_HOME/kubeconfig"
# the cgroup v1 controllers make kind-cluster mounted on the host (make kind-cluster-down unmounts them)
KIND_CGROUP_MOUNTS="$KIND_HOME/host-cgroup-mounts"
KIND_BUILT_IMAGE="taskherd.local/kind-node:$KUBERNETES_VERSION"
KIND_NODE_IMAGE="${TASKHERD_KIND_NODE_IMAGE:-$KIND_BUILT_IMAGE}"
KUBECTL="${TASKHERD_KUBECTL:-$KUBECTL}"
# The image archives kind loads into every node: images/build.sh (make images) lists the worker and
# operator images there, and the in-cluster services' images when they are built; the debootstrap
# base is added for the smoke tests' pods.
APP_IMAGES_LIST="$IMAGES_CACHE/app-images.list"

kind_built_here() { [[ "$KIND_NODE_IMAGE" == taskherd.local/* ]]; }

# The cgroup controllers make kind-cluster mounted go with the cluster, unless the local cluster
# runs on this host: its kubelet may have started since, with them (unmounting one under it would
# break its next pod).
unmount_kind_cgroups() {
    if [ -f "$HOST_OWNER_FILE" ]; then
        [ -f "$KIND_CGROUP_MOUNTS" ] && log "the local cluster runs here: the cgroup controllers kind mounted stay mounted"
        return 0
    fi
    unmount_recorded_cgroups "$KIND_CGROUP_MOUNTS"
}

# ---- the docker daemon of the built-here path
# Its own data root, exec root, socket and pid file. Unlike images/build.sh's daemon it has
# networking, because kind needs a bridge network with docker's embedded DNS (nodes join the
# control plane by container name). It touches the host as little as that allows:
# - no default bridge (docker0): only the "kind" network below, on a fixed subnet and bridge name;
# - ip-forward=false: docker neither sets net.ipv4.ip_forward nor the FORWARD policy to DROP (it
#   does both by default, which would cut the local cluster's pods off the host);
# - ip-masq=false, and DOCKER-USER rules that keep forwarded traffic on the kind bridge: the nodes
#   reach each other and this host, nothing beyond it;
# - its runtime is e2e/kind/runc-within-bounds: privileged containers (kind's nodes) get the
#   capabilities this machine's root has, not more.
KIND_DOCKER_HOME="$KIND_HOME/docker"
KIND_DOCKER_SOCK="$KIND_DOCKER_HOME/docker.sock"
KIND_NETWORK=kind
KIND_BRIDGE=taskherd-kind
KIND_SUBNET=172.30.0.0/24
KIND_GATEWAY=172.30.0.1

DOCKERD_EXE=$(readlink -f "$(command -v dockerd 2>/dev/null || echo /usr/sbin/dockerd)")
kind_dockerd_pid() { pidfile_pid "$KIND_DOCKER_HOME/dockerd.pid" "$DOCKERD_EXE"; }

# Use the private daemon for every docker and kind command of this shell.
use_kind_docker() { export DOCKER_HOST="unix://$KIND_DOCKER_SOCK"; }

start_kind_dockerd() {
    apt_install docker.io iptables
    use_kind_docker
    if kind_dockerd_pid >/dev/null; then
        ensure_kind_network
        return 0
    fi
    stop_kind_dockerd   # leftovers of a crashed daemon: mounts, stale pid file
    mkdir -p "$KIND_DOCKER_HOME/data" "$KIND_DOCKER_HOME/exec"
    # The host's FORWARD policy before the daemon: checked after start, restored at stop.
    iptables -w -S FORWARD | awk '$1 == "-P" {print $3}' >"$KIND_DOCKER_HOME/forward-policy.orig"
    # runc, asked only for capabilities this machine's root has (see the script); a copy, so that
    # the daemon does not depend on this checkout
    install -m 0755 "$KIND_SCRIPTS/runc-within-bounds" "$KIND_DOCKER_HOME/runc-within-bounds"
    cat >"$KIND_DOCKER_HOME/daemon.json" <<EOF
{
  "runtimes": {"runc-within-bounds": {"path": "$KIND_DOCKER_HOME/runc-within-bounds"}},
  "default-runtime": "runc-within-bounds",
  "bridge": "none",
  "iptables": true,
  "ip-forward": false,
  "ip-masq": false,
  "storage-driver": "overlay2",
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m", "max-file": "2"},
  "default-address-pools": [{"base": "$KIND_SUBNET", "size": 24}]
}
EOF
    setsid dockerd --config-file "$KIND_DOCKER_HOME/daemon.json" -H "$DOCKER_HOST" \
        --data-root "$KIND_DOCKER_HOME/data" --exec-root "$KIND_DOCKER_HOME/exec" \
        --pidfile "$KIND_DOCKER_HOME/dockerd.pid" >>"$KIND_DOCKER_HOME/dockerd.log" 2>&1 </dev/null 9>&- &
    wait_for "kind's dockerd" 60 docker version ||
        { tail -20 "$KIND_DOCKER_HOME/dockerd.log" >&2; die "dockerd did not start (log: $KIND_DOCKER_HOME/dockerd.log)"; }
    step_done "kind's dockerd" started 0
    log "started dockerd (pid $(kind_dockerd_pid), socket $KIND_DOCKER_SOCK)"
    local before after
    before=$(cat "$KIND_DOCKER_HOME/forward-policy.orig")
    after=$(iptables -w -S FORWARD | awk '$1 == "-P" {print $3}')
    [ "$before" = "$after" ] || log "WARNING: the FORWARD policy changed from $before to $after while dockerd started"
    ensure_kind_network
}

# The "kind" network, created before kind does (kind uses an existing network of that name) so that
# its subnet and bridge name are fixed, and the rules that keep its traffic on the bridge.
ensure_kind_network() {
    if ! docker network inspect "$KIND_NETWORK" >/dev/null 2>&1; then
        docker network create -d bridge --subnet "$KIND_SUBNET" --gateway "$KIND_GATEWAY" \
            -o com.docker.network.bridge.name="$KIND_BRIDGE" \
            -o com.docker.network.bridge.enable_ip_masquerade=false "$KIND_NETWORK" >/dev/null
        log "created docker network $KIND_NETWORK ($KIND_SUBNET on bridge $KIND_BRIDGE)"
    fi
    local rule
    for rule in "-i $KIND_BRIDGE ! -o $KIND_BRIDGE -j DROP" "! -i $KIND_BRIDGE -o $KIND_BRIDGE -j DROP"; do
        # shellcheck disable=SC2086
        iptables -w -C DOCKER-USER $rule 2>/dev/null || iptables -w -I DOCKER-USER 1 $rule
    done
}

stop_kind_dockerd() {
    local m
    # it stops the containers in it (the kind nodes) first
    stop_pidfile "kind's dockerd" "$KIND_DOCKER_HOME/dockerd.pid" 60 "$DOCKERD_EXE"
    # overlay and netns mounts a stopped (or killed) daemon left under its roots
    if [ -d "$KIND_DOCKER_HOME" ]; then
        awk -v d="$(readlink -f "$KIND_DOCKER_HOME")" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
            while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    fi
    if command -v iptables >/dev/null; then
        # ours in DOCKER-USER, and docker's own for the kind bridge, which it keeps when it stops
        # (the network outlives the daemon); a new daemon writes them again
        local table args
        for table in filter nat; do
            iptables -w -t "$table" -S | { grep -e "-[io] $KIND_BRIDGE\b" || true; } | sed 's/^-A /-D /' |
                while read -ra args; do iptables -w -t "$table" "${args[@]}" || true; done
        done
        local orig
        orig=$(cat "$KIND_DOCKER_HOME/forward-policy.orig" 2>/dev/null || true)
        if [ -n "$orig" ] && [ "$(iptables -w -S FORWARD | awk '$1 == "-P" {print $3}')" != "$orig" ]; then
            iptables -w -P FORWARD "$orig"
            log "restored the FORWARD policy to $orig"
        fi
    fi
    if ip link show "$KIND_BRIDGE" >/dev/null 2>&1; then ip link delete "$KIND_BRIDGE" || true; fi
}

# Remove the routes to pod ranges e2e/kind/up.sh added (listed in $KIND_HOME/routes).
unroute_pods() {
    local cidr
    [ -f "$KIND_HOME/routes" ] || return 0
    while read -r cidr; do ip route del "$cidr" 2>/dev/null || true; done <"$KIND_HOME/routes"
    rm -f "$KIND_HOME/routes"
}
