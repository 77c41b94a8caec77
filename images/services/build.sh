#!/usr/bin/env bash
# The e2e services image: Debian's Redis, RabbitMQ (management plugin), PostgreSQL 15 and
# Alertmanager, and Prometheus, on the project's debootstrap base (images/base/build.sh), with tini
# as PID 1 and the entrypoint images/services/taskherd-service. One image; each pod runs one of the five.
#
# The packages are installed by apt-get in a chroot of the base's root filesystem, on this host:
# the Debian mirror the base came from, over the host's network (no docker build, no registry, no
# certificate the container would have to trust). Nothing is started in the chroot (policy-rc.d).
# Prometheus is built from the Go module proxy instead: Debian builds its package without
# Kubernetes service discovery, which is how Prometheus finds pods to scrape.
#
# Prints the path of the docker-archive tarball. Its tag, taskherd.local/services:<key>, is the
# content key of the inputs (this script, the entrypoint, the base, the package list, Prometheus'
# version): a change makes a new tag, and the pods roll to it. The tarball is listed in
# $IMAGES_CACHE/app-images.list (what the local cluster imports when it starts and what kind loads)
# and imported into the local cluster's containerd when that runs.
source "$(dirname "$0")/../lib.sh"
need_root
take_lock services-image
PACKAGES=(tini redis-server rabbitmq-server postgresql-15 prometheus-alertmanager)
# Prometheus 3.x: module versions v0.3MM.P are Prometheus 3.MM.P
PROMETHEUS_MODULE=github.com/prometheus/prometheus
PROMETHEUS_MODULE_VERSION=v0.316.0
PROMETHEUS_BIN_DIR="$BIN_ROOT/prometheus-$PROMETHEUS_MODULE_VERSION"
SERVICES_UID=10002   # the pods' runAsUser; initdb needs it to have a passwd entry
HERE="$IMAGES_SRC/services"
APP_LIST="$IMAGES_CACHE/app-images.list"

# The prometheus binary with the service discovery mechanisms the e2e suite uses (Kubernetes; file
# and HTTP are always in): the build tags leave out the cloud providers' SDKs.
build_prometheus() {
    local minor patch
    minor=${PROMETHEUS_MODULE_VERSION#v0.3}; minor=$((10#${minor%%.*})); patch=${PROMETHEUS_MODULE_VERSION##*.}
    go_env
    rm -rf "$PROMETHEUS_BIN_DIR"
    mkdir -p "$PROMETHEUS_BIN_DIR"
    # `go install pkg@version` builds with the module's own go.mod and go.sum; -mod must be unset
    GOFLAGS='' GOBIN="$PROMETHEUS_BIN_DIR" go install -trimpath -tags remove_all_sd,enable_kubernetes_sd \
        -ldflags "-s -w -X github.com/prometheus/common/version.Version=3.$minor.$patch -X github.com/prometheus/common/version.Branch=$PROMETHEUS_MODULE_VERSION" \
        "$PROMETHEUS_MODULE/cmd/prometheus@$PROMETHEUS_MODULE_VERSION"
    touch "$PROMETHEUS_BIN_DIR/.complete"
}

# services_image OUT: the base's root filesystem, the packages, the binaries, then the image.
services_image() {
    local out=$1 work="$IMAGES_CACHE/services-work" layer
    local root="$work/rootfs"
    safe_rmtree "$work"   # an interrupted run's (it may have left /proc mounted in the chroot)
    mkdir -p "$root"
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "safe_rmtree $(printf %q "$work")" EXIT
    layer=$(tar -xOf "$BASE_TAR" manifest.json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["Layers"][0])')
    tar -xOf "$BASE_TAR" "$layer" | tar -C "$root" --numeric-owner -xpf -
    cp /etc/resolv.conf "$root/etc/resolv.conf"   # for apt in the chroot; emptied again below
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    mount -t proc proc "$root/proc"
    echo "apt-get install ${PACKAGES[*]} into the base"
    chroot "$root" apt-get update -q
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
    umount "$root/proc"
    chroot "$root" apt-get clean
    # what the packages' maintainer scripts set up for a system service, which the pods do not use:
    # Debian's default PostgreSQL cluster (the entrypoint runs initdb on the pod's volume)
    rm -rf "$root/var/lib/postgresql/15/main" "$root/etc/postgresql/15/main" "$root/usr/sbin/policy-rc.d" \
        "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin "$root/var/log/"*.log "$root/var/log/apt/"*
    # files no server here reads (they halve the image): documentation, translations, and
    # PostgreSQL's JIT with the LLVM it loads (the entrypoint runs PostgreSQL with jit=off)
    rm -rf "$root/usr/share/doc/"* "$root/usr/share/man/"* "$root/usr/share/locale/"* \
        "$root/usr/lib/postgresql/15/lib/llvmjit"* \
        "$root/usr/lib/x86_64-linux-gnu/libLLVM-14.so"* "$root/usr/lib/x86_64-linux-gnu/libz3.so"*
    : >"$root/etc/resolv.conf"   # the kubelet provides the pod's
    echo "taskherd-services:x:$SERVICES_UID:$SERVICES_UID:taskherd services:/data:/usr/sbin/nologin" >>"$root/etc/passwd"
    echo "taskherd-services:x:$SERVICES_UID:" >>"$root/etc/group"
    install -m 755 "$HERE/taskherd-service" "$root/usr/local/bin/taskherd-service"
    install -m 755 "$PROMETHEUS_BIN_DIR/prometheus" "$root/usr/local/bin/prometheus"
    install -d -m 775 -o "$SERVICES_UID" -g "$SERVICES_UID" "$root/data"
    tar -C "$root" --numeric-owner -cf "$work/rootfs.tar" .
    python3 "$IMAGES_SRC/mkimage.py" --tag "$tag" --rootfs-tar "$work/rootfs.tar" \
        --entrypoint /usr/bin/tini /usr/local/bin/taskherd-service --user "$SERVICES_UID:$SERVICES_UID" \
        --workdir /data -o "$out"
}

BASE_TAR=$(bash "$IMAGES_SRC/base/build.sh")
if [ -f "$PROMETHEUS_BIN_DIR/.complete" ]; then
    step_done "prometheus $PROMETHEUS_MODULE_VERSION" reused 0
else
    run_step "prometheus $PROMETHEUS_MODULE_VERSION" go-prometheus build_prometheus
fi
key=$(content_key "$HERE/build.sh" "$HERE/taskherd-service" "$IMAGES_SRC/mkimage.py" \
    "$(basename "$BASE_TAR")" "${PACKAGES[*]}" "$PROMETHEUS_MODULE_VERSION" "$SERVICES_UID")
tag="taskherd.local/services:$key"
out="$IMAGES_CACHE/services-$key.tar"
# Like cached_image, except that superseded builds go only beyond the last three: checkouts sharing
# $TASKHERD_HOME build different versions, and each would otherwise delete the other's and rebuild.
keep_last_three() {
    services_image "$out.partial"
    mv "$out.partial" "$out"
    find "$IMAGES_CACHE" -maxdepth 1 -name 'services-*.tar' -printf '%T@ %p\n' | sort -rn | tail -n +4 |
        cut -d' ' -f2- | xargs -r rm -f
}
if [ -f "$out" ]; then
    step_done "services image" reused 0
else
    run_step "services image" image-services keep_last_three
fi

# One line per image in the list the local cluster imports at start-up and kind loads.
if ! grep -qxF "$out" "$APP_LIST" 2>/dev/null; then
    { grep -v '/services-[^/]*\.tar$' "$APP_LIST" 2>/dev/null || true; echo "$out"; } >"$APP_LIST.new"
    mv "$APP_LIST.new" "$APP_LIST"
fi
if proc_pid containerd >/dev/null && ! ctr_ images ls -q | grep -qxF "$tag"; then
    ctr_ images import --no-unpack "$out" >/dev/null
    # Older tags stay: pods of another checkout's `up` may still run them, and a restarted
    # container needs its image (the tags are content keys: a handful, half a gigabyte each).
    log "imported $tag into the local cluster's containerd (k8s.io)"
fi
echo "$out"
