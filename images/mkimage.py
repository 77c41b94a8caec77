#!/usr/bin/env python3
"""Write a docker-archive image tarball (the format `docker save` writes, which both
`docker load` and `ctr images import` read) from a root filesystem directory or tarball.

Used for images that need no Dockerfile build: the pause image, CoreDNS, and the debootstrap
base. Only the standard library is used so it runs on a fresh machine.

    mkimage.py --tag registry.k8s.io/pause:3.10 --rootfs DIR --entrypoint /pause -o pause.tar
    mkimage.py --tag taskherd.local/debian-base:bookworm --rootfs-tar rootfs.tar -o base.tar
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", action="append", required=True, help="repository:tag (repeatable)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--rootfs", help="directory to use as the single layer")
    src.add_argument("--rootfs-tar", help="uncompressed tarball to use as the single layer")
    ap.add_argument("--entrypoint", nargs="*", default=None)
    ap.add_argument("--cmd", nargs="*", default=None)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir", default="")
    ap.add_argument("--user", default="")
    ap.add_argument("--label", action="append", default=[], help="key=value")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.output))) as tmp:
        layer = os.path.join(tmp, "layer.tar")
        if a.rootfs:
            with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
                for name in sorted(os.listdir(a.rootfs)):
                    t.add(os.path.join(a.rootfs, name), arcname=name, recursive=True)
        else:
            shutil.copyfile(a.rootfs_tar, layer)
        diff_id = "sha256:" + sha256_file(layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": {
                "Env": a.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Entrypoint": a.entrypoint,
                "Cmd": a.cmd,
                "WorkingDir": a.workdir,
                "User": a.user,
                "Labels": dict(kv.split("=", 1) for kv in a.label) or None,
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "taskherd images/mkimage.py"}],
        }
        cfg = json.dumps(config, sort_keys=True).encode()
        cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
        layer_dir = diff_id.split(":")[1]
        manifest = [{"Config": cfg_name, "RepoTags": a.tag, "Layers": [layer_dir + "/layer.tar"]}]
        partial = a.output + ".partial"
        with tarfile.open(partial, "w") as out:
            def add_bytes(name, data):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                ti.mtime = int(time.time())
                out.addfile(ti, io.BytesIO(data))
            add_bytes(cfg_name, cfg)
            out.add(layer, arcname=layer_dir + "/layer.tar")
            add_bytes("manifest.json", json.dumps(manifest).encode())
            repos = {}
            for tag in a.tag:
                repo, _, t = tag.rpartition(":")
                repos.setdefault(repo, {})[t] = layer_dir
            add_bytes("repositories", json.dumps(repos).encode())
        os.replace(partial, a.output)  # never leave a half-written image behind


if __name__ == "__main__":
    main()
