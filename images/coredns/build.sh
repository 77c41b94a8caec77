#!/usr/bin/env bash
# CoreDNS image: the binary built by e2e/cluster/build.sh from github.com/coredns/coredns, alone in
# an image. Prints the path of the docker-archive tarball (cached by version).
source "$(dirname "$0")/../lib.sh"
bin="$COREDNS_BIN/coredns"
if [ ! -x "$bin" ] || [ ! -f "$COREDNS_BIN/.complete" ]; then bash "$CLUSTER_SCRIPTS/build.sh" coredns; fi
key=$(content_key "$IMAGES_SRC/mkimage.py" "$COREDNS_VERSION" "$bin")
copy_coredns() { cp "$bin" "$1/coredns"; }
cached_image coredns "$IMAGES_CACHE/coredns-$key.tar" rootfs_image copy_coredns \
    --tag "taskherd.local/coredns:$COREDNS_VERSION" --entrypoint /coredns
