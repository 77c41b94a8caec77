# Shared by the image build scripts. Source it.
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/cluster/lib.sh"
IMAGES_SRC="$REPO_ROOT/images"
mkdir -p "$IMAGES_CACHE"

# short content key of files and strings: an image is rebuilt only when its inputs change
content_key() {
    local x
    for x in "$@"; do if [ -f "$x" ]; then sha256sum <"$x"; else echo "$x"; fi; done | sha256sum | cut -c1-12
}

# Unmount everything below $1 (deepest first), e.g. /proc left mounted by an interrupted debootstrap,
# then delete it without crossing into any other file system.
safe_rmtree() {
    local dir=$1 m
    [ -e "$dir" ] || return 0
    dir=$(readlink -f "$dir")
    for m in $(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m"
    done
    rm -rf --one-file-system "$dir"
}
