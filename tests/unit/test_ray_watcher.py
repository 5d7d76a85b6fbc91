"""The watcher that keeps the gateway's replicas in step with the replica actors, driven by
scripted actors (no Ray): a lost replica leaves the gateway, its restarted incarnation joins
again at its new URL, one that fails to start is restarted; stop() ends every task."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from pathlib import Path

import pytest

from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.backend import ReplicaState
from servepilot.fleet.ray.actor import ActorReady
from servepilot.fleet.ray.view import (
    ClusterView,
    GroupRow,
    NodeRow,
    ReplicaRow,
    read_view,
    write_view,
)
from servepilot.fleet.ray.watcher import ReplicaUnavailable, ReplicaWatcher


def _answer(incarnation: str, url: str | None, node: str = "n1") -> ActorReady:
    info = ReplicaInfo("r0", url, 7, Path("r0.log"), None, 1.0) if url else None
    return ActorReady(node, "10.0.0.1", incarnation, "smollm2", info, None if url else "boom")


class ScriptedReplica:
    """Answers ready() and until_exit() from scripts; an exception in a script is raised."""

    def __init__(self, ready: list[object], exits: list[object]) -> None:
        self.replica_id = "r0"
        self._ready = deque(ready)
        self._exits = deque(exits)
        self.restarted = 0

    async def ready(self) -> ActorReady:
        return _next(self._ready)  # type: ignore[return-value]

    async def until_exit(self) -> int:
        if not self._exits:
            await asyncio.Event().wait()  # serves until stopped
        return _next(self._exits)  # type: ignore[return-value]

    def restart(self) -> None:
        self.restarted += 1


def _next(script: deque[object]) -> object:
    item = script.popleft() if script else ReplicaUnavailable("no more")
    if isinstance(item, Exception):
        raise item
    return item


class Members:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def join(self, replica_id: str, answer: ActorReady) -> None:
        assert answer.info is not None
        self.events.append(("join", answer.info.url))

    async def leave(self, replica_id: str) -> None:
        self.events.append(("leave", replica_id))


async def _run(
    replica: ScriptedReplica, members: Members, settle_s: float = 0.2, said: list[str] | None = None
) -> ReplicaWatcher:
    said = [] if said is None else said
    watcher = ReplicaWatcher([replica], members, said.append, said.append, retry_s=0.01)
    watcher.start({"r0": _answer("a", "http://10.0.0.1:1")})
    await asyncio.sleep(settle_s)
    await watcher.stop()
    return watcher


def test_a_lost_replica_leaves_and_its_restart_joins_at_its_new_url() -> None:
    first, second = _answer("a", "http://10.0.0.1:1"), _answer("b", "http://10.0.0.2:2", "n2")
    replica = ScriptedReplica(
        ready=[first, ReplicaUnavailable("restarting"), second],
        exits=[ReplicaUnavailable("node died")],
    )
    members, said = Members(), []
    watcher = asyncio.run(_run(replica, members, said=said))
    assert members.events == [("leave", "r0"), ("join", "http://10.0.0.2:2")]
    assert said[0] == "replica r0 lost (node died); the gateway routes around it"
    assert re.fullmatch(
        r"replica r0 serves again at http://10.0.0.2:2 \(node 10.0.0.1\), "
        r"0\.\d s after it was lost",
        said[1],
    ), said
    assert watcher.states["r0"] is ReplicaState.READY
    assert watcher.restarts["r0"] == 1
    assert watcher.answers["r0"].node_id == "n2"


def test_a_server_exit_is_a_loss_and_the_same_incarnation_does_not_rejoin_twice() -> None:
    replica = ScriptedReplica(ready=[_answer("a", "http://10.0.0.1:1")], exits=[])
    members = Members()
    watcher = asyncio.run(_run(replica, members))
    assert members.events == []  # already in the gateway, as `up` added it
    assert watcher.states["r0"] is ReplicaState.READY


def test_a_replica_that_fails_to_start_again_is_restarted() -> None:
    replica = ScriptedReplica(
        ready=[_answer("a", "http://10.0.0.1:1"), _answer("b", None)], exits=[1]
    )
    members = Members()
    watcher = asyncio.run(_run(replica, members, settle_s=0.05))
    assert members.events[0] == ("leave", "r0")
    assert replica.restarted >= 1
    assert watcher.restarts["r0"] == 0


def test_the_status_view_round_trips_through_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEPILOT_STATE", str(tmp_path))
    view = ClusterView(
        "local",
        (NodeRow("aaaaaaaaaa", "10.0.0.1:1", True, 2.0, 2.0),
         NodeRow("bbbbbbbbbb", "10.0.0.2:1", False, 2.0, 0.0)),
        (GroupRow("servepilot-8000-1-r0", "CREATED", ("aaaaaaaaaa",)),),
        (ReplicaRow("r0", "ready", "aaaaaaaaaa", "http://10.0.0.1:5", 1),),
    )  # fmt: skip
    write_view(8000, view)
    assert read_view(8000) == view
    assert read_view(8001) is None
    assert view.summary() == "Ray cluster local: 1 of 2 nodes alive"
    assert view.node_cells()[0] == ("aaaaaaaa", "10.0.0.1:1", "yes", "2", "2", "r0")
    assert view.group_cells() == [("servepilot-8000-1-r0", "CREATED", "aaaaaaaa")]
    assert view.replica_cells() == [("r0", "ready", "aaaaaaaa", "http://10.0.0.1:5", "1")]
