#!/usr/bin/env bash
# Root filesystem of the kind *base* image (what `kind build node-image --base-image` starts from),
# made the way kind's images/base/Dockerfile makes it, without its downloads from GitHub: systemd,
# runc and the CNI plugins from Debian (containernetworking-plugins, linked into /opt/cni/bin);
# containerd at the version kind's base has and crictl, both built from the Go module proxy by
# e2e/cluster/build.sh (Debian's containerd 1.6 cannot run kind's builder: its ctr lacks
# `images import --label`); kind's own files (entrypoint, systemd units, containerd config) from
# the kind module source. Prints the path of the rootfs tarball, cached by content of its inputs.
#
#   node-base.sh KIND_MODULE_DIR
source "$(dirname "$0")/../lib.sh"
need_root
take_lock kind-node-base
apt_install debootstrap debian-archive-keyring systemd jq
FILES="$1/images/base/files"
[ -d "$FILES" ] || die "$FILES not found: is $1 the sigs.k8s.io/kind module ($KIND_VERSION)?"
CONTAINERD_BIN="$BIN_ROOT/containerd-$KIND_CONTAINERD_VERSION"
[ -x "$CRICTL_BIN/crictl" ] || die "crictl missing in $CRICTL_BIN (e2e/cluster/build.sh crictl)"
[ -x "$CONTAINERD_BIN/containerd" ] || die "containerd missing in $CONTAINERD_BIN (e2e/cluster/build.sh kind-containerd)"
# kind's package list (images/base/Dockerfile), less what only rootless or network storage needs
# (fuse-overlayfs, nfs-common, open-iscsi), plus runc and the CNI plugins kind builds from source.
PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz
PACKAGES+=,bash,ca-certificates,curl,jq,procps,runc,containernetworking-plugins

build_node_base() {  # OUT
    local out=$1 work="$IMAGES_CACHE/kind-base-work" R d p
    safe_rmtree "$work"
    mkdir -p "$work"
    # shellcheck disable=SC2064  # the path now: the trap runs after this function has returned
    trap "safe_rmtree $(printf %q "$work")" EXIT
    R="$work/rootfs"
    debootstrap_rootfs "$R" "$PACKAGES"
    for d in bin sbin lib; do  # merged /usr: relative links, or the writes below would land on this host
        case "$(readlink "$R/$d" || true)" in /*) die "$R/$d is an absolute symlink" ;; esac
    done

    # kind's static files, with the modes its Dockerfile gives them
    install -m 0755 "$FILES"/usr/local/bin/* "$R/usr/local/bin/"
    mkdir -p "$R/kind/bin" "$R/etc/containerd" "$R/etc/systemd/system/kubelet.service.d"
    cp -r "$FILES/kind/." "$R/kind/"
    chmod -R u=rwX,go=rX "$R/kind"
    chmod 0755 "$R"/kind/bin/*
    install -m 0644 "$FILES/etc/crictl.yaml" "$R/etc/"
    install -m 0644 "$FILES/etc/containerd/config.toml" "$R/etc/containerd/"
    install -m 0644 "$FILES"/etc/default/* "$R/etc/default/"
    install -m 0644 "$FILES"/etc/sysctl.d/* "$R/etc/sysctl.d/"
    find "$FILES/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "$R/etc/systemd/system/" \;
    install -m 0644 "$FILES"/etc/systemd/system/kubelet.service.d/* "$R/etc/systemd/system/kubelet.service.d/"

    # the Dockerfile's clean-up of systemd: no units but the ones a node needs
    find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
    rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
        "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
        "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
    echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
    ln -sf /lib/systemd/systemd "$R/sbin/init"
    systemctl --root="$R" enable kubelet.service containerd.service undo-mount-hacks.service
    systemctl --root="$R" mask systemd-binfmt.service
    mkdir -p "$R/etc/kubernetes/manifests"

    # the runtime where kind's units and builder look for it
    install -m 0755 "$CONTAINERD_BIN"/{containerd,ctr,containerd-shim-runc-v2} "$R/usr/local/bin/"
    install -m 0755 "$CRICTL_BIN/crictl" "$R/usr/local/bin/crictl"
    mkdir -p "$R/opt/cni/bin"
    for p in "$R"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/${p##*/}" "$R/opt/cni/bin/${p##*/}"; done
    # containerd's default OCI spec plus kind's createContainer hook, without rlimits (as kind does)
    chroot "$R" /bin/sh -c 'ctr oci spec |
        jq ".hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" |
        jq "del(.process.rlimits)" >/etc/containerd/cri-base.json'
    jq -e '.hooks.createContainer[0].path == "/kind/bin/mount-product-files.sh"' "$R/etc/containerd/cri-base.json"

    tar -C "$R" --numeric-owner -cf "$out" .
}

key=$(content_key "$0" "$PACKAGES" "$BASE_SUITE" "$KIND_VERSION" "$CRICTL_VERSION" "$KIND_CONTAINERD_VERSION" \
    "$(cd "$FILES" && find . -type f | sort | xargs sha256sum | sha256sum)")
cached_image kind-base "$IMAGES_CACHE/kind-base-$key.rootfs.tar" build_node_base
