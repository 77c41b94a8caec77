"""Which cluster the e2e entry point picks (e2e/lib/cluster.py): explicit kubeconfig, else kind
(binary + node image), else the local cluster. Fast: kind and docker are small scripts on PATH
standing in for the real CLIs, so that no kind cluster is created here."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from e2e.lib import cluster as clusterlib


def script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("TASKHERD_HOME", str(home))
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    for var in ("KUBECONFIG", "TASKHERD_KUBECONFIG", "TASKHERD_KIND_NODE_IMAGE"):
        monkeypatch.delenv(var, raising=False)
    return home, bindir


def add_kind(bindir: Path, log: Path) -> None:
    script(bindir / "kind", f"""echo "$@" >> {log}
case "$1 $2" in
  "get clusters") echo taskherd ;;
  "get kubeconfig") echo "apiVersion: v1" ; echo "kind: Config" ;;
esac
""")


def add_docker(bindir: Path, images: str) -> None:
    script(bindir / "docker", f'[ "$1 $2" = "image ls" ] && printf "%s" "{images}"\n')


def test_local_cluster_when_nothing_else(env):
    home, _ = env
    c = clusterlib.resolve()
    assert c.source == "local"
    assert c.kubeconfig == str(home / "cluster" / "admin.kubeconfig")
    v = clusterlib.versions()
    assert c.kubectl_bin == str(home / "bin" / f"kubernetes-{v['KUBERNETES_VERSION']}" / "kubectl")
    assert c.helm_bin == str(home / "bin" / f"helm-{v['HELM_VERSION']}" / "helm")


def test_explicit_kubeconfig_wins_over_kind(env, monkeypatch, tmp_path):
    _, bindir = env
    add_kind(bindir, tmp_path / "kind.log")
    add_docker(bindir, "kindest/node:v1.34.0\n")
    monkeypatch.setenv("KUBECONFIG", "/some/where/config")
    assert clusterlib.resolve().source == "explicit"
    assert clusterlib.resolve().kubeconfig == "/some/where/config"
    monkeypatch.setenv("TASKHERD_KUBECONFIG", "/taskherd/config")
    assert clusterlib.resolve().kubeconfig == "/taskherd/config"
    assert not (tmp_path / "kind.log").exists(), "kind must not be touched with an explicit kubeconfig"


def test_kind_needs_binary_and_node_image(env, tmp_path):
    home, bindir = env
    add_kind(bindir, tmp_path / "kind.log")
    add_docker(bindir, "")  # docker works but has no kindest/node image
    assert clusterlib.resolve().source == "local"
    add_docker(bindir, "kindest/node:v1.34.0\n")
    c = clusterlib.resolve()
    assert c.source == "kind"
    assert c.kubeconfig == str(home / "kind" / "kubeconfig")
    assert "kind: Config" in Path(c.kubeconfig).read_text()
    calls = (tmp_path / "kind.log").read_text()
    assert "create" not in calls  # the taskherd kind cluster already exists: reused
    assert "load" not in calls  # no image archives built here


def test_kind_gets_the_built_images(env, tmp_path):
    home, bindir = env
    (home / "images").mkdir(parents=True)
    for name in ("worker.tar", "operator.tar", "debian-base-bookworm-abc.tar"):
        (home / "images" / name).write_bytes(b"")
    add_kind(bindir, tmp_path / "kind.log")
    add_docker(bindir, "kindest/node:v1.34.0\n")
    assert clusterlib.resolve().source == "kind"
    loads = [line for line in (tmp_path / "kind.log").read_text().splitlines() if line.startswith("load")]
    assert [line.split()[2].rsplit("/", 1)[1] for line in loads] == [
        "worker.tar", "operator.tar", "debian-base-bookworm-abc.tar"]
    assert all("--name taskherd" in line for line in loads)


def test_kind_cluster_created_when_missing(env, tmp_path):
    _, bindir = env
    log = tmp_path / "kind.log"
    script(bindir / "kind", f"""echo "$@" >> {log}
case "$1 $2" in
  "get clusters") ;;
  "get kubeconfig") echo "kind: Config" ;;
esac
""")
    add_docker(bindir, "kindest/node:v1.34.0\n")
    assert clusterlib.resolve().source == "kind"
    create = [line for line in log.read_text().splitlines() if line.startswith("create cluster")]
    assert create and "--name taskherd" in create[0] and "--image kindest/node:v1.34.0" in create[0]


def test_unreachable_local_cluster_fails_with_make_cluster_output(env):
    home, _ = env
    home.mkdir(parents=True)
    (home / "cluster-up.log").write_text("12:00:00 [cluster] ERROR: port 6443 is already in use\n")
    c = clusterlib.resolve()
    kubectl = Path(c.kubectl_bin)
    kubectl.parent.mkdir(parents=True)
    script(kubectl, "echo 'The connection to the server was refused' >&2; exit 1\n")
    Path(c.kubeconfig).parent.mkdir(parents=True)
    Path(c.kubeconfig).write_text("kind: Config\n")
    with pytest.raises(clusterlib.ClusterUnavailable) as e:
        c.check_reachable()
    assert "connection to the server was refused" in str(e.value)
    assert "port 6443 is already in use" in str(e.value)
