"""The services image on the cluster: built by images/services/build.sh (a no-op when its inputs
are unchanged) and put where the cluster's nodes find it without a registry.

- local cluster: imported into its containerd (namespace k8s.io) when the CRI does not list it;
- kind: `kind load image-archive` when a node's CRI does not list it;
- any other cluster: set TASKHERD_SERVICES_IMAGE to the image pushed to a registry its nodes pull from.
"""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Callable

from e2e.lib import cluster as clusters
from e2e.lib import kind as kindlib

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "images" / "services" / "build.sh"
IMAGE_ENV = "TASKHERD_SERVICES_IMAGE"


class ImageError(RuntimeError):
    """The image could not be built or loaded; the message has the step and the tool's words."""


def build(log: Callable[[str], None]) -> Path:
    """Run the build script (cached) and return the docker-archive tarball it printed."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
    for line in r.stderr.splitlines():
        log(f"  {line}")
    if r.returncode != 0 or not r.stdout.strip():
        raise ImageError(f"`bash {BUILD_SCRIPT.relative_to(REPO_ROOT)}` exited {r.returncode}: "
                         f"{r.stderr.strip()[-1500:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def tag_of(tarball: Path) -> str:
    with tarfile.open(tarball) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
    return manifest[0]["RepoTags"][0]


def _local_images() -> set[str]:
    sock = clusters.taskherd_home() / "cluster" / "containerd" / "containerd.sock"
    r = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls", "-q"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ImageError(f"listing the local cluster's images failed: {r.stderr.strip()}")
    return set(r.stdout.split())


def ensure(cluster: clusters.Cluster, log: Callable[[str], None]) -> tuple[str, str]:
    """(image, imagePullPolicy) the pods can start from on this cluster."""
    if os.environ.get(IMAGE_ENV):
        return os.environ[IMAGE_ENV], "IfNotPresent"
    if cluster.source not in ("local", "kind"):
        raise ImageError(f"the {cluster.source} cluster ({cluster.kubeconfig}) cannot be given a local image: "
                         f"build it (`bash images/services/build.sh` prints the tarball), push it to a registry "
                         f"its nodes pull from and set {IMAGE_ENV}=<registry>/taskherd-services:<tag>")
    tarball = build(log)
    tag = tag_of(tarball)
    if cluster.source == "local":
        if tag not in _local_images():
            sock = clusters.taskherd_home() / "cluster" / "containerd" / "containerd.sock"
            r = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "import", "--no-unpack",
                                str(tarball)], capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise ImageError(f"importing {tarball} into the local cluster failed: {r.stderr.strip()}")
            log(f"services image {tag} imported into the local cluster's containerd")
    elif clusters.missing_images([tag], cluster.runtime_images()):
        # the docker daemon kind's nodes run in (the project's own on the built-here path)
        r = subprocess.run([clusters.kind_path() or "kind", "load", "image-archive", str(tarball),
                            "--name", clusters.KIND_CLUSTER_NAME], capture_output=True, text=True, timeout=900,
                           env=kindlib.docker_env())
        if r.returncode != 0:
            raise ImageError(f"`kind load image-archive {tarball}` failed: {(r.stderr or r.stdout).strip()}")
        log(f"services image {tag} loaded into the kind nodes")
    # The tag is the content key of the image's inputs: never re-pulled, never stale.
    return tag, "Never" if cluster.source == "local" else "IfNotPresent"
