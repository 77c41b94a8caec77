#!/usr/bin/env bash
# Debian base image from debootstrap (minbase + python3 + pip), for the worker and operator
# Dockerfiles (their BASE_IMAGE build argument) and the cluster smoke tests.
# The Debian mirror is the one apt uses on this machine, read from its sources at run time.
# Prints the path of the docker-archive tarball (cached by content of its inputs).
source "$(dirname "$0")/../lib.sh"
need_root
take_lock base-image
apt_install debootstrap debian-archive-keyring
INCLUDE=python3,python3-pip,ca-certificates,procps

# First http(s) URI of a deb source for $BASE_SUITE with component main (one-line or deb822 format).
mirror() {
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

# debootstrap into a work directory (left mounted by an interrupted run: safe_rmtree), then the
# image tarball $1 from the root filesystem.
debootstrap_image() {
    local out=$1 work="$IMAGES_CACHE/base-work" from
    from=$(mirror)
    safe_rmtree "$work"
    mkdir -p "$work"
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "safe_rmtree $(printf %q "$work")" EXIT
    echo "debootstrap $BASE_SUITE (minbase, $INCLUDE) from $from"
    debootstrap --variant=minbase --include="$INCLUDE" "$BASE_SUITE" "$work/rootfs" "$from"
    rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin \
        "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/log/"*.log
    : > "$work/rootfs/etc/resolv.conf"   # the kubelet provides the pod's resolv.conf
    tar -C "$work/rootfs" --numeric-owner -cf "$work/rootfs.tar" .
    python3 "$IMAGES_SRC/mkimage.py" --tag "$BASE_IMAGE" --rootfs-tar "$work/rootfs.tar" --cmd /bin/bash -o "$out"
}

key=$(content_key "$IMAGES_SRC/base/build.sh" "$IMAGES_SRC/mkimage.py" "$BASE_SUITE" "$INCLUDE" "$BASE_IMAGE")
cached_image base "$IMAGES_CACHE/debian-base-$BASE_SUITE-$key.tar" debootstrap_image
