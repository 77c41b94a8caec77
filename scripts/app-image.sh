#!/usr/bin/env bash
# Build your app's image — a Dockerfile starting FROM the taskherd worker image — and put it where the
# cluster of the e2e entry point (e2e/lib/cluster.py: E2E_CLUSTER, else an explicit kubeconfig, kind,
# or the local cluster) can run it:
#
#   local     imported into the local cluster's containerd (namespace k8s.io); listed, so that
#             `make cluster` imports it again whenever the cluster starts;
#   kind      loaded into every node of the kind cluster (`kind load`); listed, so that a recreated
#             kind cluster gets it again;
#   explicit  (your cluster, TASKHERD_KUBECONFIG / KUBECONFIG): pushed to the registry IMAGE names
#             (`docker login` to it first).
#
#   scripts/app-image.sh [-f DOCKERFILE] CONTEXT IMAGE   build and load (or push)
#   scripts/app-image.sh --list                           the images kept across cluster restarts
#   scripts/app-image.sh --forget IMAGE                   no longer import IMAGE at cluster start
#
# IMAGE is name:tag, the tag not `latest` (Kubernetes would try to pull it on every start). Nothing is
# downloaded during the build (no registry here; it runs with --network none): put the wheels your
# app needs into CONTEXT (docs/your-app.md says how). The build runs in the project's private dockerd
# (images/lib.sh), so it needs root, as `make images` does. A build whose inputs (CONTEXT, the
# Dockerfile, the worker image) did not change is reused.
source "$(dirname "$0")/../images/lib.sh"
LOG_TAG=app-image
USER_LIST="$IMAGES_CACHE/user-images.list"   # "IMAGE ARCHIVE KEY" per line; e2e/cluster/up.sh reads it
USER_ARCHIVES="$IMAGES_CACHE/user"

usage() { sed -n '13,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

listed() { [ -f "$USER_LIST" ] && awk -v i="$1" '$1 == i' "$USER_LIST"; }
unlist() {  # IMAGE: drop its line (and its archive)
    local line
    line=$(listed "$1") || true
    [ -n "$line" ] || return 0
    rm -f "$(echo "$line" | awk '{print $2}')"
    awk -v i="$1" '$1 != i' "$USER_LIST" >"$USER_LIST.new" || true
    mv "$USER_LIST.new" "$USER_LIST"
}

dockerfile=
while [ $# -gt 0 ]; do
    case "$1" in
    -f | --file) dockerfile=${2:-}; shift 2 ;;
    --list) [ -f "$USER_LIST" ] && awk '{print $1 "  " $2}' "$USER_LIST"; exit 0 ;;
    --forget) [ -n "${2:-}" ] || usage; unlist "$2"; log "forgot $2: clusters started from now on do not import it"; exit 0 ;;
    -h | --help) usage ;;
    -*) die "unknown option $1 (valid: -f DOCKERFILE, --list, --forget IMAGE)" ;;
    *) break ;;
    esac
done
[ $# -eq 2 ] || usage
context=$1 image=$2
[ -d "$context" ] || die "CONTEXT=$context is not a directory (the build context: your app's code and its Dockerfile)"
context=$(cd "$context" && pwd)
dockerfile=${dockerfile:-$context/Dockerfile}
[ -f "$dockerfile" ] || die "no Dockerfile at $dockerfile (give one with -f)"
dockerfile=$(readlink -f "$dockerfile")
[[ "$image" =~ ^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9._-]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] ||
    die "IMAGE=$image is not name:tag (lower-case repository, a tag of letters, digits, '.', '_' or '-'), e.g. taskherd.local/payments:1"
[ "${image##*:}" != latest ] ||
    die "IMAGE=$image: use a tag other than latest (Kubernetes pulls :latest on every start, and this cluster has no registry)"
grep -qiE '^[[:space:]]*FROM[[:space:]]' "$dockerfile" || die "$dockerfile has no FROM line (it starts FROM $WORKER_IMAGE)"

cluster=$(cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" python3 -c \
    'from e2e.lib.cluster import selected_source; print(selected_source())') ||
    die "could not tell which cluster the e2e entry point resolves (e2e/lib/cluster.py)"
log "cluster: $cluster; image $image from $dockerfile"
need_root "the build runs in the project's private dockerd, as make images does"

# The worker image it starts FROM (reused when its sources did not change).
bash "$REPO_ROOT/images/build.sh"
worker_tar="$IMAGES_CACHE/worker.tar"
[ -f "$worker_tar" ] || die "$worker_tar is missing after images/build.sh"

take_lock images   # the private builder is shared with make images
key=$( (cd "$context" && find . -type f ! -path '*/.git/*' ! -path '*/__pycache__/*' -print0 | sort -z |
    xargs -0 sha256sum; sha256sum <"$dockerfile"; stat -c '%s %Y' "$worker_tar"; echo "$image $WORKER_IMAGE") |
    sha256sum | cut -c1-16)
mkdir -p "$USER_ARCHIVES"
archive="$USER_ARCHIVES/$(echo "$image" | tr '/:' '__').tar"

build() {
    builder load -q -i "$worker_tar"
    DOCKER_BUILDKIT=0 builder build --network none --build-arg "WORKER_IMAGE=$WORKER_IMAGE" \
        -f "$dockerfile" -t "$image" "$context"
    if [ "$cluster" = explicit ]; then
        builder push "$image"
    else
        builder save -o "$archive.partial" "$image"
        mv "$archive.partial" "$archive"
    fi
}
if [ "$cluster" != explicit ] && [ -f "$archive" ] && [ "$(listed "$image" | awk '{print $3}')" = "$key" ]; then
    step_done "image $image" reused 0
    log "$image: reused (CONTEXT, Dockerfile and worker image unchanged)"
else
    start_builder
    trap stop_builder EXIT
    run_step "image $image" app-image build
    stop_builder
    trap - EXIT
fi
[ "$cluster" = explicit ] && { log "pushed $image: set the pool's image.repository and image.tag to it"; exit 0; }

# Listed: whatever starts the cluster imports it again. One archive per repository (a new tag
# replaces the old one).
for other in $( [ -f "$USER_LIST" ] && awk -v r="${image%:*}" -v i="$image" 'index($1, r ":") == 1 && $1 != i {print $1}' "$USER_LIST"); do
    unlist "$other"
    log "replaced $other in the list of images kept across cluster restarts"
done
{ [ -f "$USER_LIST" ] && awk -v i="$image" '$1 != i' "$USER_LIST"; echo "$image $archive $key"; } >"$USER_LIST.new"
mv "$USER_LIST.new" "$USER_LIST"

case "$cluster" in
local)
    if proc_pid containerd >/dev/null; then
        ctr_ images import --no-unpack "$archive" >/dev/null
        # containerd names a short docker name docker.io/library/NAME
        ctr_ images ls -q | awk -v i="$image" '$0 == i || substr($0, length($0) - length(i)) == "/" i {found=1}
            END {exit !found}' || die "$image is not in the cluster's containerd after the import"
        log "$image imported into the local cluster's containerd (k8s.io); make cluster imports it again after a restart"
    else
        log "the local cluster is not running: make cluster imports $image when it starts"
    fi
    ;;
kind)
    [ -f "$REPO_ROOT/e2e/kind/up.sh" ] || die "E2E_CLUSTER resolved to kind, but this checkout has no e2e/kind/up.sh"
    bash "$REPO_ROOT/e2e/kind/up.sh"   # brings the kind cluster up if needed, loads what changed
    ;;
*) die "unknown cluster source $cluster" ;;
esac
