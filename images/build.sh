#!/usr/bin/env bash
# Build the worker and operator images from images/{worker,operator}/Dockerfile on the debootstrap
# base, save them as tarballs in $TASKHERD_HOME/images, and import them into the local cluster's
# containerd (namespace k8s.io) when it is running (up.sh also imports them when it starts).
#
# Python wheels (the repository's own distribution and its dependencies) are resolved on the host
# by Debian's /usr/bin/python3 (3.11.2, the same as the image's) and put into the build context:
# containers do not trust this machine's CA, and the build runs with --network none.
#
# docker: a private dockerd is started for the build (own data root, exec root and socket under
# $TASKHERD_HOME/docker, no bridge, no iptables) and stopped again by PID afterwards.
source "$(dirname "$0")/lib.sh"
need_root
take_lock images
apt_install docker.io python3-pip
APP_LIST="$IMAGES_CACHE/app-images.list"   # tarballs up.sh imports
PY=/usr/bin/python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' ||
    die "$PY must be Python 3.11 (the images' Python)"

BASE_TAR=$(bash "$IMAGES_SRC/base/build.sh")

# ---- the e2e services image (Redis, RabbitMQ, PostgreSQL, Alertmanager, Prometheus): built, listed
# in $APP_LIST and imported by its own script (cached: a no-op when its inputs are unchanged)
SERVICES_TAR=$(bash "$IMAGES_SRC/services/build.sh")
# ----

# Skip the build when nothing that goes into the images changed since the last one (the sources
# of the distribution, the Dockerfiles, this script, the base image); FORCE=1 rebuilds anyway.
src_key=$( (cd "$REPO_ROOT" && find worker operator \
        images/worker images/operator images/build.sh -type f \
        ! -path '*/__pycache__/*' ! -path '*.egg-info/*' ! -path '*/build/*' -print0 2>/dev/null |
        sort -z | xargs -0 sha256sum; echo "$BASE_TAR $WORKER_IMAGE $OPERATOR_IMAGE") | sha256sum | cut -c1-16)
if [ "${FORCE:-}" != 1 ] && [ -f "$APP_LIST" ] && [ "$(cat "$IMAGES_CACHE/app-images.key" 2>/dev/null)" = "$src_key" ] &&
    [ -f "$IMAGES_CACHE/worker.tar" ] && [ -f "$IMAGES_CACHE/operator.tar" ]; then
    log "worker and operator images: reused (sources unchanged; FORCE=1 rebuilds)"
    step_done "worker image" reused 0
    step_done "operator image" reused 0
    if proc_pid containerd >/dev/null && [ "$(cat "$STATE/app-images.key" 2>/dev/null)" != "$src_key" ]; then
        for t in "$IMAGES_CACHE/worker.tar" "$IMAGES_CACHE/operator.tar"; do ctr_ images import --no-unpack "$t" >/dev/null; done
        echo "$src_key" >"$STATE/app-images.key"
        log "imported ${WORKER_IMAGE} and ${OPERATOR_IMAGE} into the cluster's containerd (k8s.io)"
    fi
    exit 0
fi

# ---- wheels: copy the distribution's sources (not .venv, not build leftovers) and resolve
work=$(mktemp -d "$IMAGES_CACHE/app.XXXXXX")
started_dockerd=
cleanup() {
    if [ -n "$started_dockerd" ]; then stop_builder; fi
    rm -rf "$work"
}
trap cleanup EXIT
build_wheels() {
    mkdir -p "$work/src" "$work/wheels"
    cp -r "$REPO_ROOT/worker" "$REPO_ROOT/operator" "$work/src/"
    find "$work/src" \( -name '*.egg-info' -o -name __pycache__ -o -name build \) -prune -exec rm -rf {} +
    echo "resolving wheels for taskherd and taskherd-operator with $("$PY" --version)"
    "$PY" -m pip wheel --cache-dir "$TASKHERD_HOME/pip-cache" --wheel-dir "$work/wheels" \
        "$work/src/worker" "$work/src/operator"
    ls "$work/wheels"/taskherd-0*.whl "$work/wheels"/taskherd_operator-*.whl
}
run_step "wheels for the images" image-wheels build_wheels

# ---- private dockerd (images/lib.sh)
start_builder
started_dockerd=1

builder load -q -i "$BASE_TAR" >/dev/null
imported=()
# docker_image NAME TAG: docker build of images/NAME/Dockerfile, saved to $IMAGES_CACHE/NAME.tar
docker_image() {
    local name=$1 tag=$2 ctx="$work/ctx-$1" out="$IMAGES_CACHE/$1.tar"
    mkdir -p "$ctx"
    cp "$IMAGES_SRC/$name/Dockerfile" "$ctx/"
    cp -r "$work/wheels" "$ctx/wheels"
    DOCKER_BUILDKIT=0 builder build --network none --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$tag" "$ctx"
    builder save -o "$out.partial" "$tag"
    mv "$out.partial" "$out"
}
for name in worker operator; do
    var="${name^^}_IMAGE"
    run_step "$name image" "image-$name" docker_image "$name" "${!var}"
    imported+=("$IMAGES_CACHE/$name.tar")
done
builder image prune -f >/dev/null   # superseded builds of the same tags
printf '%s\n' "${imported[@]}" "$SERVICES_TAR" >"$APP_LIST"
echo "$src_key" >"$IMAGES_CACHE/app-images.key"

if proc_pid containerd >/dev/null; then
    for t in "${imported[@]}"; do ctr_ images import --no-unpack "$t" >/dev/null; done
    echo "$src_key" >"$STATE/app-images.key"
    log "imported ${WORKER_IMAGE} and ${OPERATOR_IMAGE} into the cluster's containerd (k8s.io)"
else
    log "cluster not running: up.sh will import the images when it starts"
fi
