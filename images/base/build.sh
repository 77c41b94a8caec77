#!/usr/bin/env bash
# Debian base image from debootstrap (minbase + python3 + pip), for the worker and operator
# Dockerfiles (their BASE_IMAGE build argument) and the cluster smoke tests.
# The Debian mirror is the one apt uses on this machine (images/lib.sh: debian_mirror).
# Prints the path of the docker-archive tarball (cached by content of its inputs).
source "$(dirname "$0")/../lib.sh"
need_root
take_lock base-image
apt_install debootstrap debian-archive-keyring
INCLUDE=python3,python3-pip,ca-certificates,procps

# debootstrap into a work directory (left mounted by an interrupted run: safe_rmtree), then the
# image tarball $1 from the root filesystem.
debootstrap_image() {
    local out=$1 work="$IMAGES_CACHE/base-work"
    safe_rmtree "$work"
    mkdir -p "$work"
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "safe_rmtree $(printf %q "$work")" EXIT
    debootstrap_rootfs "$work/rootfs" "$INCLUDE"   # images/lib.sh: the mirror apt uses here
    tar -C "$work/rootfs" --numeric-owner -cf "$work/rootfs.tar" .
    python3 "$IMAGES_SRC/mkimage.py" --tag "$BASE_IMAGE" --rootfs-tar "$work/rootfs.tar" --cmd /bin/bash -o "$out"
}

key=$(content_key "$IMAGES_SRC/base/build.sh" "$IMAGES_SRC/mkimage.py" "$BASE_SUITE" "$INCLUDE" "$BASE_IMAGE")
cached_image base "$IMAGES_CACHE/debian-base-$BASE_SUITE-$key.tar" debootstrap_image
