"""The host processes of a local-cluster container, found through /proc (the cluster's containerd
runs on this host): a crash test SIGKILLs them by host PID, as the kernel would."""
from __future__ import annotations

from pathlib import Path


def container_processes(container_id: str) -> dict[int, int]:
    """{host pid: pid inside the container} of every process whose cgroup names the container."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if container_id not in (entry / "cgroup").read_text():
                continue
            nspid = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        found[int(entry.name)] = int(nspid.split()[-1])
    return found


def container_main_pid(container_id: str) -> int:
    """The host PID of the container's main process (PID 1 in its namespace)."""
    for host_pid, inner in container_processes(container_id).items():
        if inner == 1:
            return host_pid
    raise LookupError(f"no process of container {container_id} found in /proc")
