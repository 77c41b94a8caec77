#!/usr/bin/env python3
"""Merge docker-archive image tarballs (as `docker save` or images/mkimage.py write them) into one
archive holding every image, with its `repositories` entry first.

Why: `kind build node-image --type file` loads exactly four archives from the server tarball
(kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy) and *pulls* every other image
the node needs (etcd, CoreDNS, pause, kindnetd, local-path-provisioner and its helper) unless one
of those archives already carries its tag. It reads the tags of an archive from whichever of
`repositories` or `manifest.json` comes first, and from `manifest.json` only the first image's; so
the extra images ride in one archive whose `repositories` lists all of them. `ctr images import`
imports every entry of `manifest.json`.

    merge_archives.py -o kube-proxy.tar kube-proxy-only.tar etcd.tar coredns.tar ...
"""
import argparse
import io
import json
import os
import tarfile
import time


def read_archive(path):
    """(members, manifest entries, repositories) of one docker archive."""
    members, manifest, repositories = [], [], {}
    with tarfile.open(path) as t:
        for m in t.getmembers():
            if m.name == "manifest.json":
                manifest = json.load(t.extractfile(m))
            elif m.name == "repositories":
                repositories = json.load(t.extractfile(m))
            else:
                members.append(m.name)
    if not manifest:
        raise SystemExit(f"{path}: no manifest.json, not a docker archive")
    return members, manifest, repositories


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("archives", nargs="+")
    a = ap.parse_args()

    manifest, repositories, seen = [], {}, set()
    for path in a.archives:
        _, entries, repos = read_archive(path)
        manifest += entries
        for repo, tags in repos.items():
            repositories.setdefault(repo, {}).update(tags)
    partial = a.output + ".partial"
    with tarfile.open(partial, "w") as out:
        def add_bytes(name, data):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = int(time.time())
            out.addfile(ti, io.BytesIO(data))

        add_bytes("repositories", json.dumps(repositories).encode())
        for path in a.archives:
            with tarfile.open(path) as t:
                for m in t.getmembers():
                    if m.name in ("manifest.json", "repositories") or m.name in seen:
                        continue  # layers shared by several images are written once
                    seen.add(m.name)
                    out.addfile(m, t.extractfile(m) if m.isfile() else None)
        add_bytes("manifest.json", json.dumps(manifest).encode())
    os.replace(partial, a.output)


if __name__ == "__main__":
    main()
