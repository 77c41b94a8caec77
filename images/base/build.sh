#!/usr/bin/env bash
# Debian base image from debootstrap (minbase + python3 + pip), for the worker and operator
# Dockerfiles (their BASE_IMAGE build argument) and the cluster smoke tests.
# The Debian mirror is the one apt uses on this machine, read from its sources at run time.
# Prints the path of the docker-archive tarball (cached by content of its inputs).
source "$(dirname "$0")/../lib.sh"
need_root
take_lock base-image
ensure_apt debootstrap debian-archive-keyring
INCLUDE=python3,python3-pip,ca-certificates,procps

key=$(content_key "$IMAGES_SRC/base/build.sh" "$IMAGES_SRC/mkimage.py" "$BASE_SUITE" "$INCLUDE" "$BASE_IMAGE")
out="$IMAGES_CACHE/debian-base-$BASE_SUITE-$key.tar"
if [ ! -f "$out" ]; then
    work="$IMAGES_CACHE/base-work"
    safe_rmtree "$work"   # leftovers of an interrupted run (debootstrap may leave /proc mounted)
    mkdir -p "$work"
    trap 'safe_rmtree "$work"' EXIT
    t0=$SECONDS
    debootstrap_rootfs "$work/rootfs" "$INCLUDE"
    tar -C "$work/rootfs" --numeric-owner -cf "$work/rootfs.tar" .
    python3 "$IMAGES_SRC/mkimage.py" --tag "$BASE_IMAGE" --rootfs-tar "$work/rootfs.tar" \
        --cmd /bin/bash -o "$out"
    log "base image $BASE_IMAGE: $out ($((SECONDS - t0)) s)"
    for old in "$IMAGES_CACHE"/debian-base-$BASE_SUITE-*.tar; do [ "$old" = "$out" ] || rm -f "$old"; done  # superseded
fi
echo "$out"
