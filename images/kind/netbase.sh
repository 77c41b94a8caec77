#!/usr/bin/env bash
# Root filesystem for the node-level network images of the kind node image (kube-proxy, kube-router)
# and the small helpers (local-path-helper): Debian minbase with iptables, ipset, iproute2 and
# conntrack, and the iptables wrapper of kubernetes-sigs/iptables-wrappers (shipped in the
# kube-router module), which picks the legacy or nft backend the node already uses, as the
# upstream kube-proxy and kube-router images do. Prints the path of the rootfs tarball (cached).
#
#   netbase.sh KUBE_ROUTER_MODULE_DIR
source "$(dirname "$0")/../lib.sh"
need_root
take_lock kind-netbase
ensure_apt debootstrap debian-archive-keyring
WRAPPER="$1/build/image-assets/iptables-wrapper-installer.sh"
[ -f "$WRAPPER" ] || die "$WRAPPER not found: is $1 the kube-router module ($KUBE_ROUTER_VERSION)?"
PACKAGES=iptables,ipset,iproute2,conntrack,kmod,ca-certificates

key=$(content_key "$0" "$PACKAGES" "$BASE_SUITE" "$WRAPPER")
out="$IMAGES_CACHE/kind-netbase-$key.rootfs.tar"
if [ -f "$out" ]; then echo "$out"; exit 0; fi

work="$IMAGES_CACHE/kind-netbase-work"
safe_rmtree "$work"
mkdir -p "$work"
trap 'safe_rmtree "$work"' EXIT
R="$work/rootfs"
debootstrap_rootfs "$R" "$PACKAGES"
install -m 0755 "$WRAPPER" "$R/iptables-wrapper-installer.sh"
chroot "$R" /bin/sh /iptables-wrapper-installer.sh   # removes itself
[ "$(readlink "$R/etc/alternatives/iptables")" = /usr/sbin/iptables-wrapper ] ||
    die "the iptables wrapper was not installed in $R"

tar -C "$R" --numeric-owner -cf "$out.partial" .
mv "$out.partial" "$out"
for old in "$IMAGES_CACHE"/kind-netbase-*.rootfs.tar; do [ "$old" = "$out" ] || rm -f "$old"; done  # superseded
log "kind netbase rootfs: $out"
echo "$out"
