#!/usr/bin/env bash
# Build the pod sandbox ("pause") image from pause.c: a static binary in an otherwise empty image.
# Prints the path of the docker-archive tarball (cached by content).
source "$(dirname "$0")/../lib.sh"
ensure_apt gcc libc6-dev
key=$(content_key "$IMAGES_SRC/pause/pause.c" "$IMAGES_SRC/mkimage.py" "$PAUSE_IMAGE")
out="$IMAGES_CACHE/pause-$key.tar"
if [ ! -f "$out" ]; then
    work=$(mktemp -d "$IMAGES_CACHE/pause.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/rootfs"
    gcc -static -O2 -Wall -o "$work/rootfs/pause" "$IMAGES_SRC/pause/pause.c"
    strip "$work/rootfs/pause"
    python3 "$IMAGES_SRC/mkimage.py" --tag "$PAUSE_IMAGE" --rootfs "$work/rootfs" \
        --entrypoint /pause --user 65535:65535 -o "$out"
    log "pause image: $out"
    for old in "$IMAGES_CACHE"/pause-*.tar; do [ "$old" = "$out" ] || rm -f "$old"; done  # superseded
fi
echo "$out"
