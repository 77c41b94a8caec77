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
apt_install debootstrap debian-archive-keyring
WRAPPER="$1/build/image-assets/iptables-wrapper-installer.sh"
[ -f "$WRAPPER" ] || die "$WRAPPER not found: is $1 the kube-router module ($KUBE_ROUTER_VERSION)?"
PACKAGES=iptables,ipset,iproute2,conntrack,kmod,ca-certificates

build_netbase() {  # OUT
    local out=$1 work="$IMAGES_CACHE/kind-netbase-work" R
    safe_rmtree "$work"
    mkdir -p "$work"
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "safe_rmtree $(printf %q "$work")" EXIT
    R="$work/rootfs"
    debootstrap_rootfs "$R" "$PACKAGES"
    install -m 0755 "$WRAPPER" "$R/iptables-wrapper-installer.sh"
    chroot "$R" /bin/sh /iptables-wrapper-installer.sh   # removes itself
    # bookworm's update-alternatives is in /usr/bin, where the installer does not look: it links
    # the commands to the wrapper itself
    [ "$(readlink "$R/usr/sbin/iptables")" = /usr/sbin/iptables-wrapper ] ||
        die "the iptables wrapper was not installed in $R"
    tar -C "$R" --numeric-owner -cf "$out" .
}

key=$(content_key "$0" "$PACKAGES" "$BASE_SUITE" "$WRAPPER")
cached_image kind-netbase "$IMAGES_CACHE/kind-netbase-$key.rootfs.tar" build_netbase
