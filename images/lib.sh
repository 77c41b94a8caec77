# shellcheck shell=bash
# Shared by the image build scripts. Source it.
LOG_TAG=images
# shellcheck source=../e2e/cluster/lib.sh
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
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    rm -rf --one-file-system "$dir"
}

# cached_image NAME OUT BUILD ARGS...: the image tarball OUT ($IMAGES_CACHE/<name>-<content key>.tar)
# is reused when it exists; otherwise `BUILD ARGS... OUT.partial` writes it (a step of its own, with
# its log), it is renamed to OUT, and tarballs of the same name with another key are removed.
# Prints OUT.
cached_image() {
    local name=$1 out=$2
    shift 2
    if [ -f "$out" ]; then
        step_done "$name image" reused 0
    else
        run_step "$name image" "image-$name" write_image "$out" "$@"
    fi
    echo "$out"
}
write_image() {  # OUT BUILD ARGS...: runs BUILD ARGS... OUT.partial
    local out=$1 old
    shift
    "$@" "$out.partial"
    mv "$out.partial" "$out"
    for old in "${out%-*}"-*.tar; do [ "$old" = "$out" ] || rm -f "$old"; done  # superseded
}

# rootfs_image FILL MKIMAGE_ARGS... OUT: FILL DIR puts the image's files into an empty directory,
# mkimage.py writes the image (its last argument, as cached_image passes it) from that directory.
rootfs_image() {
    local fill=$1 work
    shift
    local out=${*: -1} args=("${@:1:$#-1}")
    work=$(mktemp -d "$IMAGES_CACHE/rootfs.XXXXXX")
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "rm -rf $(printf %q "$work")" EXIT
    mkdir -p "$work/rootfs"
    "$fill" "$work/rootfs"
    python3 "$IMAGES_SRC/mkimage.py" --rootfs "$work/rootfs" "${args[@]}" -o "$out"
}

# The Debian mirror apt uses on this machine: the first http(s) URI of a deb source for $BASE_SUITE
# with component main (one-line or deb822 format); TASKHERD_DEBIAN_MIRROR where apt has none (a
# machine that is not Debian bookworm, e.g. a hosted CI runner).
debian_mirror() {
    if [ -n "${TASKHERD_DEBIAN_MIRROR:-}" ]; then echo "$TASKHERD_DEBIAN_MIRROR"; return 0; fi
    python3 - "$BASE_SUITE" <<'PY'
import glob, re, sys
suite = sys.argv[1]
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*")):
    try:
        text = open(path).read()
    except OSError:
        continue
    if path.endswith(".sources"):
        for stanza in re.split(r"\n\s*\n", text):
            f = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                k, v = line.split(":", 1)
                f[k.strip().lower()] = v.split()
            if "deb" in f.get("types", []) and suite in f.get("suites", []) and "main" in f.get("components", []):
                if f.get("enabled", ["yes"])[0] != "no" and f.get("uris"):
                    print(f["uris"][0]); sys.exit(0)
    elif path.endswith(".list"):
        for line in text.splitlines():
            w = re.sub(r"\[[^]]*\]", "", line).split()
            if len(w) >= 4 and w[0] == "deb" and w[2] == suite and "main" in w[3:]:
                print(w[1]); sys.exit(0)
sys.exit("no apt source for suite %s with component main" % suite)
PY
}

# debootstrap_rootfs DIR PACKAGES: a minbase $BASE_SUITE root filesystem in DIR with PACKAGES
# (comma-separated) from the mirror apt uses here. Apt lists and caches are removed and resolv.conf
# is left empty: the kubelet (or docker) provides one.
debootstrap_rootfs() {
    local dir=$1 include=$2 mirror
    mirror=$(debian_mirror)
    echo "debootstrap $BASE_SUITE (minbase, $include) from $mirror"
    debootstrap --variant=minbase --include="$include" "$BASE_SUITE" "$dir" "$mirror"
    rm -rf "$dir/var/lib/apt/lists/"* "$dir/var/cache/apt/"*.bin "$dir/var/cache/apt/archives/"*.deb \
        "$dir/var/log/"*.log
    : >"$dir/etc/resolv.conf"
}

# ---- the private builder: a dockerd of the image builds' own (data root, exec root and socket under
# $TASKHERD_HOME/docker, no bridge, no iptables), started for a build and stopped again by PID. Hold
# `take_lock images` around it: builds share its data root.
BUILDER_HOME="$TASKHERD_HOME/docker"
BUILDER_SOCK="$BUILDER_HOME/docker.sock"
builder() { docker -H "unix://$BUILDER_SOCK" "$@"; }
start_builder() {
    apt_install docker.io
    stop_builder   # a leftover of an interrupted build
    mkdir -p "$BUILDER_HOME/data" "$BUILDER_HOME/exec"
    echo '{}' >"$BUILDER_HOME/daemon.json"
    setsid dockerd --config-file "$BUILDER_HOME/daemon.json" -H "unix://$BUILDER_SOCK" \
        --data-root "$BUILDER_HOME/data" --exec-root "$BUILDER_HOME/exec" --pidfile "$BUILDER_HOME/dockerd.pid" \
        --bridge none --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
        --storage-driver overlay2 >"$BUILDER_HOME/dockerd.log" 2>&1 </dev/null 9>&- &
    wait_for dockerd 60 builder version || { tail -20 "$BUILDER_HOME/dockerd.log" >&2; die "dockerd did not start"; }
}
stop_builder() {
    local m
    stop_pidfile dockerd "$BUILDER_HOME/dockerd.pid" 20 "$(readlink -f "$(command -v dockerd)")"
    # overlay mounts a stopped (or killed) dockerd left under its data root
    awk -v d="$(readlink -f "$BUILDER_HOME")" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
