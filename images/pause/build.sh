#!/usr/bin/env bash
# Build the pod sandbox ("pause") image from pause.c: a static binary in an otherwise empty image.
# Prints the path of the docker-archive tarball (cached by content).
source "$(dirname "$0")/../lib.sh"
apt_install gcc libc6-dev
key=$(content_key "$IMAGES_SRC/pause/pause.c" "$IMAGES_SRC/mkimage.py" "$PAUSE_IMAGE")
compile_pause() {
    gcc -static -O2 -Wall -o "$1/pause" "$IMAGES_SRC/pause/pause.c"
    strip "$1/pause"
}
cached_image pause "$IMAGES_CACHE/pause-$key.tar" rootfs_image compile_pause \
    --tag "$PAUSE_IMAGE" --entrypoint /pause --user 65535:65535
