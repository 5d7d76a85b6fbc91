"""The Ray backend of the autoscaler, driven by scripted actors (no Ray): an added replica is
followed by the watcher and counts as starting until it is in the gateway; one whose server
does not start is removed (the controller sees one fewer); a removal lets the watcher go
before the actor is killed, so it is no loss; under spread, one placed beside another replica
is said and is the first to go; an added replica takes a bundle of the spread group a removed
one left, else a group of its own aimed at the node given."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from servepilot.core.config import parse_config
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.backend import ReplicaState
from servepilot.fleet.ray import replicas as ray_replicas
from servepilot.fleet.ray import scaling
from servepilot.fleet.ray.actor import ActorReady, ActorSpec
from servepilot.fleet.ray.groups import GroupState
from servepilot.fleet.ray.placement import GroupSpec, NodeResources, ReplicaLayout, plan_placement
from servepilot.fleet.ray.replicas import RayReplicas
from servepilot.fleet.ray.scaling import RayScaling
from servepilot.fleet.ray.watcher import ReplicaWatcher

CONFIG = parse_config({"cluster": {"backend": "ray", "placement": "pack"}}, origin="test")


def _answer(replica_id: str, url: str | None) -> ActorReady:
    info = ReplicaInfo(replica_id, url, 7, Path(f"{replica_id}.log"), None, 1.0) if url else None
    return ActorReady("n1", "10.0.0.1", "a", "smollm2", info, None if url else "boom")


@dataclass
class ScriptedActor:
    """A replica actor that answers ready() once `answer` is called, then serves until
    stopped."""

    replica_id: str
    own_group: bool = False
    group_name: str = ""
    _answer: ActorReady | None = None
    _answered: asyncio.Event = field(default_factory=asyncio.Event)

    def answer(self, answer: ActorReady) -> None:
        self._answer = answer
        self._answered.set()

    async def ready(self) -> ActorReady:
        await self._answered.wait()
        assert self._answer is not None
        return self._answer

    async def until_exit(self) -> int:
        await asyncio.Event().wait()
        return 0

    def restart(self) -> None:
        pass


class FakeReplicas:
    """RayReplicas' part the backend uses, with scripted actors (bundles of a group of ours)."""

    def __init__(self) -> None:
        self.config = CONFIG
        self.plan = plan_placement(ReplicaLayout.from_config(CONFIG))
        self.added: list[ScriptedActor] = []
        self.removed: list[str] = []

    def add(self, target_node: str | None) -> ScriptedActor:
        actor = ScriptedActor(f"r{len(self.added) + 1}")
        self.added.append(actor)
        return actor

    async def remove(self, replica_id: str) -> None:
        self.removed.append(replica_id)


class Members:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def join(self, replica_id: str, answer: ActorReady) -> None:
        self.events.append(("join", replica_id))

    async def leave(self, replica_id: str) -> None:
        self.events.append(("leave", replica_id))


def _backend() -> tuple[RayScaling, FakeReplicas, ReplicaWatcher, Members, list[str]]:
    replicas, members, said = FakeReplicas(), Members(), []
    watcher = ReplicaWatcher([], members, said.append, said.append, retry_s=0.01)
    watcher.start({})
    return RayScaling(replicas, watcher, said.append), replicas, watcher, members, said  # type: ignore[arg-type]


def test_an_added_replica_is_starting_until_the_watcher_puts_it_in_the_gateway() -> None:
    async def scenario() -> None:
        backend, replicas, watcher, members, said = _backend()
        assert await backend.add() == "r1"
        await asyncio.sleep(0.05)
        assert backend.starting() == ("r1",)
        assert watcher.states["r1"] is ReplicaState.STARTING
        replicas.added[0].answer(_answer("r1", "http://10.0.0.1:5"))
        await asyncio.sleep(0.5)
        assert backend.starting() == ()
        assert members.events == [("join", "r1")]
        assert said == ["replica r1 serves at http://10.0.0.1:5 (node 10.0.0.1)"]
        # Removed (the controller drained it): the watcher lets go first, so no loss is said.
        await backend.remove("r1")
        assert replicas.removed == ["r1"]
        assert "r1" not in watcher.states
        assert members.events == [("join", "r1"), ("leave", "r1")]
        assert len(said) == 1
        await backend.close()
        await watcher.stop()

    asyncio.run(scenario())


def test_an_added_replica_whose_server_does_not_start_is_removed() -> None:
    async def scenario() -> None:
        backend, replicas, watcher, members, said = _backend()
        await backend.add()
        replicas.added[0].answer(_answer("r1", None))
        await asyncio.sleep(0.5)
        assert replicas.removed == ["r1"]
        assert backend.starting() == ()
        assert members.events == []
        assert said[-1] == (
            "autoscale: replica r1 did not start: its server did not start (its log says "
            "why); it is removed"
        )
        await backend.close()
        await watcher.stop()

    asyncio.run(scenario())


def test_a_replica_still_starting_is_removed_without_waiting() -> None:
    async def scenario() -> None:
        backend, replicas, watcher, members, _ = _backend()
        await backend.add()
        await backend.remove("r1")
        assert (replicas.removed, backend.starting(), members.events) == (["r1"], (), [])
        await backend.close()
        await watcher.stop()

    asyncio.run(scenario())


def test_under_spread_an_added_replica_placed_beside_another_is_said_and_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No node without a replica had room: Ray placed r1's own group on r0's node."""
    spread = parse_config({"cluster": {"backend": "ray"}}, origin="test")
    aimed: list[str | None] = []

    class SpreadReplicas(FakeReplicas):
        def __init__(self) -> None:
            super().__init__()
            self.config = spread
            self.plan = plan_placement(ReplicaLayout.from_config(spread))

        def add(self, target_node: str | None) -> ScriptedActor:
            aimed.append(target_node)
            actor = ScriptedActor(f"r{len(self.added) + 1}", True, "g-r1")
            self.added.append(actor)
            return actor

        def group_of(self, replica: ScriptedActor) -> str:
            return replica.group_name

        def holding_nodes(self, leaving_out: str = "") -> set[str]:
            return {"n0"}

    async def placed(group: object, timeout_s: float) -> bool:
        return True

    full = [NodeResources("n0", 1, 0), NodeResources("n1", 0, 0)]
    monkeypatch.setattr(scaling, "_free_and_holding", lambda replicas: (full, {"n0"}))
    monkeypatch.setattr(scaling, "wait_placed", placed)
    on_n0 = GroupState("g-r1", "CREATED", ("n0",))
    monkeypatch.setattr(scaling, "group_state", lambda group, name: on_n0)

    async def scenario() -> None:
        replicas, members, said = SpreadReplicas(), Members(), []
        watcher = ReplicaWatcher([], members, said.append, said.append, retry_s=0.01)
        watcher.start({})
        backend = RayScaling(replicas, watcher, said.append)  # type: ignore[arg-type]
        await backend.add()
        await asyncio.sleep(0.2)
        assert aimed == [None]  # n1 holds no replica but has no room
        assert said == [
            "autoscale: replica r1 shares a node with another replica: no node without one "
            "had room; it is the first to go when the fleet shrinks"
        ]
        assert backend.remove_first() == {"r1"}
        await backend.remove("r1")
        assert backend.remove_first() == frozenset()
        await backend.close()
        await watcher.stop()

    asyncio.run(scenario())


# --- RayReplicas' bookkeeping for added and removed replicas (Ray's calls faked) -------------


class FakeActorClass:
    def __init__(self, made: list[tuple[str, object, int]]) -> None:
        self._made = made
        self._options: dict[str, object] = {}

    def options(self, **options: object) -> FakeActorClass:
        self._options = options
        return self

    def remote(self, spec: ActorSpec) -> str:
        strategy = self._options["scheduling_strategy"]
        self._made.append((spec.replica_id, strategy.group, strategy.bundle))  # type: ignore[attr-defined]
        return f"actor {spec.replica_id}"


@dataclass
class FakeStrategy:
    group: object
    placement_group_bundle_index: int

    @property
    def bundle(self) -> int:
        return self.placement_group_bundle_index


def test_an_added_replica_takes_a_bundle_a_removed_one_left_else_a_group_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[tuple[str, object, int]] = []
    asked: list[tuple[str, str | None]] = []
    removed: list[object] = []

    async def place(plan: object, fleet_name: str, timeout_s: float) -> list[object]:
        return ["spread group"]

    def make_group(spec: GroupSpec, fleet_name: str, target_node: str | None = None) -> str:
        asked.append((spec.key, target_node))
        return f"group {spec.key}"

    monkeypatch.setattr(ray_replicas, "place_groups", place)
    monkeypatch.setattr(ray_replicas, "make_group", make_group)
    monkeypatch.setattr(ray_replicas, "remove_groups", removed.extend)
    monkeypatch.setattr(ray_replicas, "replica_actor_class", lambda: FakeActorClass(made))
    monkeypatch.setattr(ray_replicas, "PlacementGroupSchedulingStrategy", FakeStrategy)
    monkeypatch.setattr(ray_replicas.ray, "kill", lambda actor, no_restart: None)
    config = parse_config({"cluster": {"backend": "ray"}, "replicas": {"count": 2}}, origin="t")
    replicas = RayReplicas(config, tmp_path, "fleet")

    async def scenario() -> None:
        await replicas._launch()
        assert made == [("r0", "spread group", 0), ("r1", "spread group", 1)]
        await replicas.remove("r1")
        assert removed == []  # a bundle of the spread group stays reserved
        # The next replica takes r1's bundle (a node no other replica holds): no group asked.
        r2 = replicas.add("n7")
        assert (r2.replica_id, r2.own_group, r2.bundle, asked) == ("r2", False, 1, [])
        # No bundle left: a STRICT_PACK group of its own, aimed at the node given.
        r3 = replicas.add("n7")
        assert (r3.replica_id, r3.own_group, r3.group_name) == ("r3", True, "fleet-r3")
        assert asked == [("r3", "n7")]
        assert made[-1] == ("r3", "group r3", 0)
        await replicas.remove("r3")
        assert removed == ["group r3"]
        assert [r.replica_id for r in replicas.replicas] == ["r0", "r2"]

    asyncio.run(scenario())


def test_the_nodes_held_count_a_group_not_placed_yet_at_its_aimed_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ray_replicas, "make_group", lambda spec, fleet, target=None: spec.key)
    monkeypatch.setattr(ray_replicas, "replica_actor_class", lambda: FakeActorClass([]))
    monkeypatch.setattr(ray_replicas, "PlacementGroupSchedulingStrategy", FakeStrategy)
    placed = {"r1": ("n1",), "r2": ()}  # r2's group is still pending
    monkeypatch.setattr(
        ray_replicas, "group_state", lambda group, name: GroupState(name, "?", placed[group])
    )
    config = parse_config({"cluster": {"backend": "ray"}, "replicas": {"count": 1}}, origin="t")
    replicas = RayReplicas(config, tmp_path, "fleet")
    replicas.add("n1")
    replicas.add("n2")
    assert replicas.holding_nodes() == {"n1", "n2"}
    assert replicas.holding_nodes(leaving_out="fleet-r2") == {"n1"}
