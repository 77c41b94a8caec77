"""The worker and operator images a run tests: this checkout's, pinned by content.

The cluster's containerd holds one `taskherd.local/worker:dev`, which every checkout on the machine
rebuilds from its own sources with `make images`. A run therefore builds the images of this
checkout (images/build.sh: a no-op when they were built from the same sources), loads them into
kind when the cluster is kind, and tags them `:chaos-<content key>` on every node — so that another
checkout's rebuild during the run cannot swap the code under test. On a cluster without node
access the images are used as the chart names them (push your own and set the chart's values).
"""
from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from e2e.lib import cluster as clusters

from .nodes import NodeAccess

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD = REPO_ROOT / "images" / "build.sh"


class ImageError(RuntimeError):
    """The images could not be built or pinned; the message has the step and the tool's words."""


@dataclass(frozen=True)
class Image:
    repository: str
    tag: str

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    def chart_values(self) -> dict[str, str]:
        """The chart's `image` block for this image (registry apart from the repository, as it wants)."""
        return chart_image(self.repository, self.tag)


def chart_image(repository: str, tag: str) -> dict[str, str]:
    """`registry`, `repository`, `tag` for the chart from a repository that may name its registry
    (`taskherd.local/worker`): the chart refuses a registry host inside `repository`."""
    host, _, rest = repository.partition("/")
    if rest and ("." in host or ":" in host or host == "localhost"):
        return {"registry": host, "repository": rest, "tag": tag, "pullPolicy": "IfNotPresent"}
    return {"registry": "", "repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}


def _config_digest(tarball: Path) -> str:
    with tarfile.open(tarball) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
    return "sha256:" + Path(manifest[0]["Config"]).name.removeprefix("sha256:").removesuffix(".json")


def pinned(cluster: clusters.Cluster, log: Callable[[str], None]) -> dict[str, Image]:
    """{"worker": Image, "operator": Image} built from this checkout and tagged by content."""
    versions = clusters.versions()
    names = {"worker": versions["WORKER_IMAGE"], "operator": versions["OPERATOR_IMAGE"]}
    default = {c: Image(*ref.rsplit(":", 1)) for c, ref in names.items()}
    if cluster.source not in ("local", "kind"):
        log(f"images: the {cluster.source} cluster is given {', '.join(names.values())} as the chart names them")
        return default
    r = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise ImageError(f"`bash images/build.sh` exited {r.returncode}: {(r.stderr or r.stdout)[-2000:]}")
    cache = clusters.taskherd_home() / "images"
    key = (cache / "app-images.key").read_text().strip()
    tarballs = {"worker": cache / "worker.tar", "operator": cache / "operator.tar"}
    nodes = NodeAccess(cluster)
    if cluster.source == "kind":
        from e2e.lib import kind

        for tarball in tarballs.values():
            subprocess.run([kind.kind_binary() or "kind", "load", "image-archive", str(tarball), "--name",
                            kind.CLUSTER_NAME], check=True, capture_output=True, timeout=900, env=kind.docker_env())
    out = {}
    for component, source in names.items():
        image = Image(default[component].repository, f"chaos-{key}")
        want = _config_digest(tarballs[component])
        tag_on_every_node(cluster, source, image.ref)
        for node in cluster.node_names():
            info = nodes.run(node, [*nodes.crictl(), "inspecti", "-o", "json", image.ref])
            if json.loads(info)["status"]["id"] != want:
                raise ImageError(f"{image.ref} on {node} is not the image this checkout built ({want}): another "
                                 f"checkout rebuilt {source} meanwhile; run again")
        out[component] = image
    log(f"images: {', '.join(i.ref for i in out.values())} (this checkout's, key {key})")
    return out



def tag_on_every_node(cluster: clusters.Cluster, source: str, target: str) -> None:
    """Tags `source` as `target` in every node's containerd (no registry: the nodes hold the images)."""
    nodes = NodeAccess(cluster)
    ctr = (["ctr", "--address", str(clusters.local_containerd_socket())] if cluster.source == "local" else ["ctr"])
    for node in cluster.node_names():
        nodes.run(node, [*ctr, "-n", "k8s.io", "images", "tag", "--force", source, target])
