"""Which cluster the e2e entry point picks (e2e/lib/cluster.py): E2E_CLUSTER, else an explicit
kubeconfig, else kind (binary + pulled node image), else the local cluster. Fast: kind and docker
are small scripts on PATH standing in for the real CLIs, and bringing kind up (e2e/kind/up.sh,
exercised for real by `make kind-cluster` and the kind-marked tests) is recorded, not run."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from e2e.lib import cluster as clusterlib
from e2e.lib import kind as kindlib


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
    for var in ("KUBECONFIG", "TASKHERD_KUBECONFIG", "TASKHERD_KIND_NODE_IMAGE", "E2E_CLUSTER"):
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


@pytest.fixture
def ensured(monkeypatch, tmp_path):
    """Records e2e.lib.kind.ensure_cluster calls instead of bringing a kind cluster up."""
    calls = []

    def fake_ensure(image=None, timeout=3600):
        calls.append(image)
        return str(tmp_path / "kind-kubeconfig")

    monkeypatch.setattr(kindlib, "ensure_cluster", fake_ensure)
    return calls


def test_explicit_kubeconfig_wins_over_kind(env, monkeypatch, tmp_path, ensured):
    _, bindir = env
    add_kind(bindir, tmp_path / "kind.log")
    add_docker(bindir, "kindest/node:v1.34.0\n")
    monkeypatch.setenv("KUBECONFIG", "/some/where/config")
    assert clusterlib.resolve().source == "explicit"
    assert clusterlib.resolve().kubeconfig == "/some/where/config"
    monkeypatch.setenv("TASKHERD_KUBECONFIG", "/taskherd/config")
    assert clusterlib.resolve().kubeconfig == "/taskherd/config"
    assert not (tmp_path / "kind.log").exists(), "kind must not be touched with an explicit kubeconfig"
    assert ensured == []


def test_a_kubeconfig_this_project_wrote_is_its_own_cluster_not_an_explicit_one(env, monkeypatch, ensured):
    home, _ = env
    monkeypatch.setenv("KUBECONFIG", str(home / "cluster" / "admin.kubeconfig"))  # make cluster-env
    assert clusterlib.selected_source() == "local"
    assert clusterlib.resolve().source == "local"
    monkeypatch.setenv("KUBECONFIG", str(home / "kind" / ".." / "kind" / "kubeconfig"))
    assert clusterlib.selected_source() == "kind"
    monkeypatch.setenv("KUBECONFIG", str(home / "cluster" / "other.kubeconfig"))
    assert clusterlib.selected_source() == "explicit"


def test_default_order_picks_kind_with_binary_and_pulled_node_image(env, tmp_path, ensured):
    _, bindir = env
    add_kind(bindir, tmp_path / "kind.log")
    add_docker(bindir, "")  # docker works but has no kindest/node image
    assert clusterlib.resolve().source == "local"
    add_docker(bindir, "kindest/node:v1.34.0\n")
    c = clusterlib.resolve()
    assert c.source == "kind"
    assert c.kubeconfig == str(tmp_path / "kind-kubeconfig")
    assert ensured == ["kindest/node:v1.34.0"], "the found image is the one the cluster is made from"
    assert kindlib.node_image() == "kindest/node:v1.34.0"
    assert kindlib.docker_env().get("DOCKER_HOST") == os.environ.get("DOCKER_HOST"), \
        "a pulled image's cluster lives in the environment's docker"


def test_e2e_cluster_overrides_the_default_order(env, monkeypatch, tmp_path, ensured):
    monkeypatch.setenv("KUBECONFIG", "/some/where/config")
    monkeypatch.setenv("E2E_CLUSTER", "local")
    assert clusterlib.resolve().source == "local"
    monkeypatch.setenv("E2E_CLUSTER", "kind")  # no kind binary or pulled image needed: built here
    assert clusterlib.selected_source() == "kind"
    assert clusterlib.resolve().source == "kind"
    assert ensured == [None], "E2E_CLUSTER=kind uses TASKHERD_KIND_NODE_IMAGE or the image built here"
    home, _ = env
    assert kindlib.docker_env()["DOCKER_HOST"] == f"unix://{home}/kind/docker/docker.sock", \
        "the image built here runs in the project's own docker daemon"
    monkeypatch.setenv("E2E_CLUSTER", "explicit")
    assert clusterlib.resolve().kubeconfig == "/some/where/config"
    monkeypatch.delenv("KUBECONFIG")
    with pytest.raises(clusterlib.ClusterUnavailable, match="neither TASKHERD_KUBECONFIG nor KUBECONFIG"):
        clusterlib.resolve()


def test_unknown_e2e_cluster_is_refused_naming_the_choices(env, monkeypatch):
    monkeypatch.setenv("E2E_CLUSTER", "minikube")
    with pytest.raises(ValueError) as e:
        clusterlib.selected_source()
    assert "E2E_CLUSTER='minikube'" in str(e.value)
    assert "explicit, kind, local" in str(e.value)


def test_kind_that_cannot_come_up_fails_with_up_sh_output(env, monkeypatch, tmp_path):
    up = tmp_path / "up.sh"
    up.write_text("echo 'kind create cluster: docker is not running' >&2\nexit 3\n")
    monkeypatch.setattr(kindlib, "UP_SCRIPT", up)
    monkeypatch.setenv("E2E_CLUSTER", "kind")
    with pytest.raises(clusterlib.ClusterUnavailable) as e:
        clusterlib.resolve()
    assert "exit code 3" in str(e.value)
    assert "docker is not running" in str(e.value)


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
