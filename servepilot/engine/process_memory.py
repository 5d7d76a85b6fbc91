"""Resident memory of a replica's every process (the API server and the EngineCore and
worker processes it forks), found from its process tree in /proc."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")
_PAGE_KIB = 1024


def children(proc: Path = PROC) -> dict[int, list[int]]:
    """Each pid's child pids, from every /proc/PID/stat's parent field."""
    tree: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process exited while we looked
            continue
        # The name (field 2) may hold spaces and parentheses: split after its last ")".
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1:
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def process_tree(root: int, proc: Path = PROC) -> list[int]:
    """`root` and its descendants, root first, then breadth first by pid."""
    tree = children(proc)
    found, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue += sorted(tree.get(pid, []))
    return found


def resident_bytes(pid: int, proc: Path = PROC) -> int | None:
    """VmRSS of `pid` in bytes, or None when it is gone (or a kernel thread)."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * _PAGE_KIB
    return None


def process_name(pid: int, proc: Path = PROC) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def replica_memory(replicas: dict[str, int], proc: Path = PROC) -> dict[str, int]:
    """Resident bytes of each live process of each replica (id -> root pid), keyed
    `r0 VLLM::EngineCor (pid 1234)`: the pid keeps a key stable from sample to sample."""
    memory: dict[str, int] = {}
    for replica_id, root in replicas.items():
        for pid in process_tree(root, proc):
            rss = resident_bytes(pid, proc)
            if rss is not None:
                memory[f"{replica_id} {process_name(pid, proc)} (pid {pid})"] = rss
    return memory
