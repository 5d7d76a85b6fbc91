"""What `servepilot status` shows of a fleet on Ray: the cluster's nodes, the replicas'
placement groups, the replicas and their state.

The `up` process, which is connected to the cluster, writes it next to the fleet's record
(`state_dir()/fleets/ray/<port>.json`) every few seconds; `status` reads the file, so it
never has to join the cluster itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servepilot.fleet.state import fleets_dir

NODE_COLUMNS = ("node", "address", "alive", "CPUs", "GPUs", "replicas")
GROUP_COLUMNS = ("placement group", "state", "nodes")
REPLICA_COLUMNS = ("replica", "state", "node", "url", "restarts")
_SHORT_ID = 8


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    address: str
    alive: bool
    cpus: float
    gpus: float


@dataclass(frozen=True, slots=True)
class GroupRow:
    name: str
    state: str
    node_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    replica_id: str
    state: str
    node_id: str
    url: str
    restarts: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    address: str
    nodes: tuple[NodeRow, ...]
    groups: tuple[GroupRow, ...]
    replicas: tuple[ReplicaRow, ...]

    def summary(self) -> str:
        alive = sum(1 for n in self.nodes if n.alive)
        return f"Ray cluster {self.address}: {alive} of {len(self.nodes)} nodes alive"

    def node_cells(self) -> list[tuple[str, ...]]:
        rows: list[tuple[str, ...]] = []
        for node in self.nodes:
            on_it = [r.replica_id for r in self.replicas if r.node_id == node.node_id]
            rows.append((_short(node.node_id), node.address, "yes" if node.alive else "NO",
                         f"{node.cpus:g}", f"{node.gpus:g}", ", ".join(on_it)))  # fmt: skip
        return rows

    def group_cells(self) -> list[tuple[str, ...]]:
        return [(g.name, g.state, ", ".join(map(_short, g.node_ids))) for g in self.groups]

    def replica_cells(self) -> list[tuple[str, ...]]:
        return [
            (r.replica_id, r.state, _short(r.node_id), r.url, str(r.restarts))
            for r in self.replicas
        ]


def view_path(port: int) -> Path:
    return fleets_dir() / "ray" / f"{port}.json"


def write_view(port: int, view: ClusterView) -> None:
    path = view_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(view), indent=2), encoding="utf-8")
    os.replace(tmp, path)


def read_view(port: int) -> ClusterView | None:
    """The fleet's cluster view; None for a fleet not on Ray (or one not yet written)."""
    try:
        data: dict[str, Any] = json.loads(view_path(port).read_text(encoding="utf-8"))
        return ClusterView(
            address=data["address"],
            nodes=tuple(NodeRow(**n) for n in data["nodes"]),
            groups=tuple(
                GroupRow(g["name"], g["state"], tuple(g["node_ids"])) for g in data["groups"]
            ),
            replicas=tuple(ReplicaRow(**r) for r in data["replicas"]),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


def remove_view(port: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        view_path(port).unlink()


def _short(node_id: str) -> str:
    return node_id[:_SHORT_ID]
