#!/usr/bin/env bash
# Bring up a single-node Kubernetes cluster on this machine, the way hack/local-up-cluster.sh does:
# containerd, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy
# as host processes, CoreDNS as a pod. Idempotent: a no-op when the cluster is healthy; otherwise
# whatever is left of a previous run is cleaned up (down.sh) and the cluster is started afresh.
#
# State (certs, etcd data, pid files, logs, kubeconfig): $TASKHERD_HOME/cluster
# Kubeconfig: $TASKHERD_HOME/cluster/admin.kubeconfig
source "$(dirname "$0")/lib.sh"
need_root
T0=$SECONDS
take_lock cluster

API_HOST=172.28.0.1          # the bridge's address: node IP and the API's advertise address
API_URL="https://$API_HOST:$API_PORT"
BRIDGE=taskherd0
PKI="$STATE/pki"
VERSIONS_KEY=$(cat "$CLUSTER_SCRIPTS/versions.env" "$CLUSTER_SCRIPTS/up.sh" | sha256sum | cut -c1-16)

healthy() {
    local c
    [ -f "$STATE/ready" ] && [ "$(cat "$STATE/ready")" = "$VERSIONS_KEY" ] || return 1
    for c in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
        proc_pid "$c" >/dev/null || return 1
    done
    kc get --raw /readyz >/dev/null 2>&1 || return 1
    [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] || return 1
    [ "$(kc -n kube-system get deploy coredns -o jsonpath='{.status.readyReplicas}' 2>/dev/null)" = 1 ] || return 1
}

if healthy; then
    log "cluster is up and healthy; reused (kubeconfig: $KUBECONFIG_PATH)"
    step_done "cluster start" reused 0
    exit 0
fi

if other=$(other_cluster_home); then
    die "another taskherd cluster (TASKHERD_HOME=$other) is running on this machine; stop it first: TASKHERD_HOME=$other make cluster-down"
fi

# ---------------------------------------------------------------- prerequisites
apt_install containerd runc containernetworking-plugins conntrack iptables openssl iproute2 curl util-linux \
    ca-certificates gcc libc6-dev debootstrap
for plugin in bridge host-local loopback; do
    [ -x "$CNI_BIN_DIR/$plugin" ] || die "CNI plugin $plugin missing in $CNI_BIN_DIR"
done
bash "$CLUSTER_SCRIPTS/build.sh" kubernetes etcd coredns crictl helm
PAUSE_TAR=$(bash "$REPO_ROOT/images/pause/build.sh")
COREDNS_TAR=$(bash "$REPO_ROOT/images/coredns/build.sh")
BASE_TAR=$(bash "$REPO_ROOT/images/base/build.sh")
T_START=$SECONDS   # the start itself, after the prerequisites (steps of their own)

# ---------------------------------------------------------------- leftovers of a previous run
if [ -e "$STATE" ] || ip link show "$BRIDGE" >/dev/null 2>&1 || iptables -w -S TASKHERD-FORWARD >/dev/null 2>&1; then
    log "cluster not healthy or not complete: cleaning up what a previous run left"
    bash "$CLUSTER_SCRIPTS/down.sh"
fi

# ---------------------------------------------------------------- host checks
# The pod and service ranges must not overlap any route or address of this machine.
python3 - "$POD_CIDR" "$SERVICE_CIDR" <<'PY'
import ipaddress, subprocess, sys
mine = [ipaddress.ip_network(c) for c in sys.argv[1:]]
routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
addrs = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
seen = set()
for line in routes.splitlines():
    w = line.split()
    if not w:
        continue
    dst = w[1] if w[0] in ("local", "broadcast", "unicast", "multicast") else w[0]
    if dst == "default":
        continue
    seen.add(dst)
for line in addrs.splitlines():
    seen.add(line.split()[3])
for r in sorted(seen):
    try:
        net = ipaddress.ip_network(r, strict=False)
    except ValueError:
        continue
    for m in mine:
        if net.overlaps(m) and net.prefixlen > 0:
            sys.exit(f"cluster range {m} overlaps this machine's route or address {r}")
for ns in open("/etc/resolv.conf").read().split("\n"):
    w = ns.split()
    if len(w) >= 2 and w[0] == "nameserver":
        try:
            if any(ipaddress.ip_address(w[1]) in m for m in mine):
                sys.exit(f"resolver {w[1]} is inside a cluster range")
        except ValueError:
            pass
PY
for port in "$API_PORT" "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" 10248 10249 10250 10256 10257 10259; do
    if port_in_use "$port"; then
        die "port $port is already in use by something else: $(ss -Htlnp "sport = :$port" | head -1)"
    fi
done

mkdir -p "$STATE" "$RUN_DIR" "$LOG_DIR" "$PKI" "$STATE/cni/net.d" "$STATE/cni/ipam" "$STATE/host"
readlink -f "$TASKHERD_HOME" >"$HOST_OWNER_FILE"

mount_cgroup_v1_controllers "$STATE/host/cgroup-mounts"

# Forwarding is needed for pod -> Service -> pod traffic; remember the old values to restore them.
for s in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables; do
    [ -e "/proc/sys/${s//.//}" ] || die "sysctl $s not available (br_netfilter?)"
    echo "$s=$(sysctl -n "$s")" >>"$STATE/host/sysctl.orig"
    sysctl -qw "$s=1"
done

# The pod bridge, created up front so its address can be the node IP and the API address.
ip link add "$BRIDGE" type bridge
ip addr add "$API_HOST/${POD_CIDR#*/}" dev "$BRIDGE"
ip link set "$BRIDGE" up
# Pod traffic stays on the bridge: nothing is forwarded between the pods and any other interface.
iptables -w -N TASKHERD-FORWARD
iptables -w -A TASKHERD-FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
iptables -w -A TASKHERD-FORWARD -i "$BRIDGE" -j DROP
iptables -w -A TASKHERD-FORWARD -o "$BRIDGE" -j DROP
iptables -w -I FORWARD 1 -m comment --comment "taskherd cluster" -j TASKHERD-FORWARD

# ---------------------------------------------------------------- certificates and kubeconfigs
log "generating certificates"
(
    cd "$PKI"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -keyout ca.key -out ca.crt -subj "/CN=taskherd-cluster-ca" 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # cert NAME SUBJECT USAGE [SAN]
    cert() {
        openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
        {
            echo "basicConstraints=critical,CA:FALSE"
            echo "keyUsage=critical,digitalSignature,keyEncipherment"
            echo "extendedKeyUsage=$3"
            [ -z "${4:-}" ] || echo "subjectAltName=$4"
        } >"$1.ext"
        openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
            -extfile "$1.ext" -out "$1.crt" 2>/dev/null
        rm -f "$1.csr" "$1.ext"
    }
    cert apiserver "/CN=kube-apiserver" serverAuth \
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:$API_HOST,IP:$API_SERVICE_IP,IP:127.0.0.1"
    cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client/O=system:masters" clientAuth
    cert admin "/CN=taskherd-admin/O=system:masters" clientAuth
    cert controller-manager "/CN=system:kube-controller-manager" clientAuth
    cert scheduler "/CN=system:kube-scheduler" clientAuth
    cert kube-proxy "/CN=system:kube-proxy" clientAuth
    cert kubelet "/CN=system:node:$NODE_NAME/O=system:nodes" clientAuth
    cert kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,IP:$API_HOST,IP:127.0.0.1"
)
write_kubeconfig() { # FILE CERTNAME
    cat >"$1.partial" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: taskherd
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: taskherd
  context:
    cluster: taskherd
    user: $2
current-context: taskherd
EOF
    chmod 600 "$1.partial"
    mv "$1.partial" "$1"
}
for n in controller-manager scheduler kube-proxy kubelet; do write_kubeconfig "$PKI/$n.kubeconfig" "$n"; done

# ---------------------------------------------------------------- containerd
cat >"$STATE/cni/net.d/10-taskherd.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "taskherd",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "172.28.1.0", "gateway": "$API_HOST"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
mkdir -p "$STATE/containerd"
RESTRICT_OOM=false
(( (0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24) & 1 )) || RESTRICT_OOM=true
cat >"$STATE/containerd/config.toml" <<EOF
# Written by e2e/cluster/up.sh: this cluster's own containerd (own root, state and socket).
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[debug]
  address = ""
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # without CAP_SYS_RESOURCE (as on this machine) oom_score_adj cannot go below the current value:
  # runc would fail every sandbox ("failed to update /proc/self/oom_score_adj: Permission denied")
  restrict_oom_score_adj = $RESTRICT_OOM
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$STATE/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1
EOF
start_proc containerd "$(command -v containerd)" --config "$STATE/containerd/config.toml"
wait_for "containerd" 30 ctr_ version || die "containerd did not start (log: $LOG_DIR/containerd.log)"

log "importing images into containerd (namespace k8s.io)"
APP_TARS=()   # worker and operator images, when images/build.sh (make images) has built them
[ -f "$IMAGES_CACHE/app-images.list" ] && mapfile -t APP_TARS <"$IMAGES_CACHE/app-images.list"
USER_TARS=()  # your apps' images, built and listed by scripts/app-image.sh
[ -f "$IMAGES_CACHE/user-images.list" ] && mapfile -t USER_TARS < <(awk '{print $2}' "$IMAGES_CACHE/user-images.list")
for tar in "$PAUSE_TAR" "$COREDNS_TAR" "$BASE_TAR" "${APP_TARS[@]}" "${USER_TARS[@]}"; do
    [ -f "$tar" ] || continue
    ctr_ images import --no-unpack "$tar" >/dev/null || die "import of $tar failed"
done
[ ${#APP_TARS[@]} -eq 0 ] || cp "$IMAGES_CACHE/app-images.key" "$STATE/app-images.key" 2>/dev/null || true
# Pin the sandbox image so that image garbage collection never removes it.
ctr_ images label "$PAUSE_IMAGE" io.cri-containerd.pinned=pinned >/dev/null

# ---------------------------------------------------------------- etcd
start_proc etcd "$ETCD_BIN/etcd" --name taskherd --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "taskherd=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn
wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health" || die "etcd not healthy (log: $LOG_DIR/etcd.log)"

# ---------------------------------------------------------------- control plane
start_proc kube-apiserver "$K8S_BIN/kube-apiserver" \
    --bind-address="$API_HOST" --advertise-address="$API_HOST" --secure-port="$API_PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --profiling=false --v=1
write_kubeconfig "$KUBECONFIG_PATH" admin
wait_for "kube-apiserver /readyz" 90 kc get --raw /readyz || die "kube-apiserver not ready (log: $LOG_DIR/kube-apiserver.log)"

start_proc kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 --cert-dir="$PKI/kcm" \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_CIDR" \
    --use-service-account-credentials --leader-elect=false --profiling=false --v=1
start_proc kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig="$PKI/scheduler.kubeconfig" \
    --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false --v=1

# ---------------------------------------------------------------- node
mkdir -p "$STATE/kubelet" "$STATE/pod-logs"
: >"$STATE/resolv.conf"   # pods inherit no nameserver or search path from the host
cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $API_HOST
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
podLogsDir: $STATE/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
rotateCertificates: false
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: $STATE/resolv.conf
# image garbage collection off: the imported images cannot be pulled again
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
EOF
start_proc kubelet "$K8S_BIN/kubelet" --config="$STATE/kubelet.yaml" \
    --kubeconfig="$PKI/kubelet.kubeconfig" --root-dir="$STATE/kubelet" \
    --hostname-override="$NODE_NAME" --node-ip="$API_HOST" --v=1
wait_for "node $NODE_NAME to register" 60 kc get node "$NODE_NAME" || die "kubelet did not register (log: $LOG_DIR/kubelet.log)"

cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $PKI/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: $API_HOST
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$API_HOST/32"]
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
start_proc kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml" --v=1

# ---------------------------------------------------------------- add-ons
sed -e "s|@DNS_IP@|$DNS_SERVICE_IP|g" -e "s|@DOMAIN@|$CLUSTER_DOMAIN|g" \
    -e "s|@IMAGE@|taskherd.local/coredns:$COREDNS_VERSION|g" \
    "$CLUSTER_SCRIPTS/manifests/coredns.yaml" | kc apply -f - >/dev/null
node_ready() { [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_for "node $NODE_NAME Ready" 90 node_ready || die "node not Ready (log: $LOG_DIR/kubelet.log)"
coredns_ready() { [ "$(kc -n kube-system get deploy coredns -o jsonpath='{.status.readyReplicas}')" = 1 ]; }
wait_for "CoreDNS ready" 120 coredns_ready ||
    { kc -n kube-system get pods -o wide >&2 || true; die "CoreDNS not available"; }

echo "$VERSIONS_KEY" >"$STATE/ready"
step_done "cluster start" started $((SECONDS - T_START))
log "cluster up in $(fmt_duration $((SECONDS - T0))) (the start itself $(fmt_duration $((SECONDS - T_START)))); kubeconfig: $KUBECONFIG_PATH"
log "  $KUBECTL --kubeconfig $KUBECONFIG_PATH get nodes"
