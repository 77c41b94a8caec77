#!/usr/bin/env bash
# CoreDNS image: the binary built by e2e/cluster/build.sh from github.com/coredns/coredns, alone in
# an image. Prints the path of the docker-archive tarball (cached by version).
source "$(dirname "$0")/../lib.sh"
bin="$COREDNS_BIN/coredns"
[ -x "$bin" ] && [ -f "$COREDNS_BIN/.complete" ] || bash "$CLUSTER_SCRIPTS/build.sh" coredns
key=$(content_key "$IMAGES_SRC/mkimage.py" "$COREDNS_VERSION" "$bin")
out="$IMAGES_CACHE/coredns-$COREDNS_VERSION-$key.tar"
if [ ! -f "$out" ]; then
    work=$(mktemp -d "$IMAGES_CACHE/coredns.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/rootfs"
    cp "$bin" "$work/rootfs/coredns"
    python3 "$IMAGES_SRC/mkimage.py" --tag "taskherd.local/coredns:$COREDNS_VERSION" \
        --rootfs "$work/rootfs" --entrypoint /coredns -o "$out"
    log "coredns image: $out"
    for old in "$IMAGES_CACHE"/coredns-*.tar; do [ "$old" = "$out" ] || rm -f "$old"; done  # superseded
fi
echo "$out"
