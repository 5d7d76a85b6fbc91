"""Where a fleet's replicas go on a Ray cluster: the placement groups, planned from the fleet
config alone, and whether a cluster's nodes can hold them, said in words. No Ray here: plain
records in and out, so every rule is tested without a cluster.

`pack`: one placement group per replica, bundles `[{CPU: n}] + [{GPU: 1}] x TP`, STRICT_PACK
(tensor parallelism across nodes is slow, and vLLM only warns about it). Bundle 0 holds the
replica's actor (its server process), each GPU bundle one GPU lease, which is how the server
learns the GPUs Ray gave it. Replicas share nodes where they fit.

`spread` (the seeds' STRICT_SPREAD between replicas, so a node's loss costs one replica): one
STRICT_SPREAD group for the fleet, the anchor group, whose bundle i is replica i's whole
reservation `{CPU: n, GPU: TP}`; the actor and its GPU leases sit in that bundle. Ray places
at most one bundle per node, and after a node loss reschedules the lost bundle on a node that
holds none of the others, where the actor restarts. Chosen over the two alternatives, both
tried on a local cluster with Ray 2.52: node anti-affinity through bundle label selectors
(`ray.io/node-id: !in(...)`) is accepted but not honoured (groups land on the excluded node),
and a small-bundle anchor beside per-replica groups cannot tie a replica's group to its anchor
bundle's node (Ray has no such constraint, only a soft target that a reschedule ignores), so
spread would not survive the first node loss. The price: a spread fleet's replicas are one Ray
object, and a replica added later (autoscaling) needs a group of its own (`own_group`), aimed
at a node that holds no replica (`node_for_added_replica`) by Ray's soft target: spread for it
holds while such a node has room, and is not kept after a node loss.

A replica wider than one node (TP x PP above the GPUs of a node) runs vLLM's own Ray executor
(`--distributed-executor-backend ray`): vLLM, started as a process rather than inside the
actor, cannot reuse our group, so it places its workers in a group of its own (`{GPU: 1}` per
rank, PACK) and ours holds only the driver's CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from servepilot.core.config import Device, FleetConfig, Placement
from servepilot.core.errors import ConfigError, FleetError

STRICT_PACK = "STRICT_PACK"
STRICT_SPREAD = "STRICT_SPREAD"
RAY_EXECUTOR_ARGS = ("--distributed-executor-backend", "ray")


def check_whole_gpus(config: FleetConfig) -> None:
    """Refuse replicas that share GPUs (hardware.replicas_per_gpu > 1): each replica's GPUs
    are whole-GPU bundles its leases hold, and replicas sharing a GPU must also start one
    after the other, which the actors do not arrange."""
    shared = config.hardware.replicas_per_gpu
    if shared == 1:
        return
    raise ConfigError(
        f"hardware.replicas_per_gpu {shared}: cluster.backend ray gives every replica whole "
        "GPUs (a {GPU: 1} bundle per GPU, held by the replica's own lease), so replicas cannot "
        "share one there",
        hint="set hardware.replicas_per_gpu: 1 on Ray, or run the fleet with "
        "cluster.backend: local on the GPU machine, where replicas may share GPUs",
    )


@dataclass(frozen=True, slots=True)
class ReplicaLayout:
    """What placement needs of a fleet: how many replicas, how wide each is, node sizes."""

    replicas: int
    tensor_parallel: int
    pipeline_parallel: int
    gpus_per_node: int
    """0 for CPU replicas."""
    cpus_per_replica: float
    spread: bool

    @classmethod
    def from_config(cls, config: FleetConfig) -> ReplicaLayout:
        gpu = config.hardware.device is Device.GPU
        return cls(
            replicas=config.replicas.count,
            tensor_parallel=config.engine.tensor_parallel_size,
            pipeline_parallel=config.engine.pipeline_parallel_size,
            gpus_per_node=config.hardware.count if gpu else 0,
            cpus_per_replica=config.cluster.cpus_per_replica,
            spread=config.cluster.placement is Placement.SPREAD,
        )

    @property
    def gpus_per_replica(self) -> int:
        if self.gpus_per_node == 0:
            return 0
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True, slots=True)
class Bundle:
    cpus: float
    gpus: int

    def resources(self) -> dict[str, float]:
        """The bundle as Ray takes it (no zero entries: Ray refuses them)."""
        wanted = {"CPU": self.cpus, "GPU": float(self.gpus)}
        return {name: amount for name, amount in wanted.items() if amount > 0}


@dataclass(frozen=True, slots=True)
class GroupSpec:
    key: str
    """What the group's name ends with: the replica's id, or `spread` for the anchor group."""
    bundles: tuple[Bundle, ...]
    strategy: str


@dataclass(frozen=True, slots=True)
class ReplicaSlot:
    """Where one replica sits in the plan's groups."""

    group: int
    """Index in PlacementPlan.groups."""
    bundle: int
    """The bundle the replica's actor runs in."""
    gpu_bundles: tuple[int, ...]
    """The bundle of each of its GPU leases, one per GPU."""


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """The placement groups a fleet gets, and which part of them each replica uses."""

    groups: tuple[GroupSpec, ...]
    slots: tuple[ReplicaSlot, ...]
    """One per replica, in replica order."""
    replica_need: Bundle
    """What one node must hold for one replica (all of it but a multi-node replica's GPUs,
    which vLLM's executor places over nodes)."""
    spread: bool
    gpus_per_replica: int
    """All the GPUs one replica uses, those vLLM's executor places itself included."""
    ray_executor: bool
    """The replica spans nodes: vLLM runs with --distributed-executor-backend ray."""

    @property
    def replicas(self) -> int:
        return len(self.slots)

    @property
    def engine_args(self) -> tuple[str, ...]:
        """What the replica's vLLM command line gains from the placement."""
        return RAY_EXECUTOR_ARGS if self.ray_executor else ()

    def describe(self) -> str:
        """One line for `up`: the groups, and how the replicas share nodes."""
        executor = "; vLLM's Ray executor places their GPUs" if self.ray_executor else ""
        need = self.replica_need
        if self.spread:
            shown = f"{{CPU: {need.cpus:g}" + (f", GPU: {need.gpus}}}" if need.gpus else "}")
            return (
                f"one STRICT_SPREAD placement group, a bundle {shown} per replica "
                f"({self.replicas}): at most one replica per node{executor}"
            )
        shown = f"[{{CPU: {need.cpus:g}}}]" + (
            f" + [{{GPU: 1}}] x {need.gpus}" if need.gpus else ""
        )
        return (
            f"{_count(self.replicas, 'placement group')} of {shown} {STRICT_PACK}, one per "
            f"replica, sharing nodes where they fit{executor}"
        )


def plan_placement(layout: ReplicaLayout) -> PlacementPlan:
    gpus = layout.gpus_per_replica
    wider_than_node = gpus > layout.gpus_per_node > 0
    need = Bundle(layout.cpus_per_replica, 0 if wider_than_node else gpus)
    count = layout.replicas
    if layout.spread:
        groups: tuple[GroupSpec, ...] = (GroupSpec("spread", (need,) * count, STRICT_SPREAD),)
        slots = tuple(ReplicaSlot(0, i, (i,) * need.gpus) for i in range(count))
    else:
        groups = tuple(own_group(f"r{i}", need) for i in range(count))
        slots = tuple(own_slot(i, need) for i in range(count))
    return PlacementPlan(groups, slots, need, layout.spread, gpus, wider_than_node)


def own_group(key: str, need: Bundle) -> GroupSpec:
    """A group for one replica alone: every replica's under `pack`, an added one's (the
    autoscaler's) under `spread` too, as a STRICT_SPREAD group cannot grow."""
    return GroupSpec(key, (Bundle(need.cpus, 0),) + (Bundle(0, 1),) * need.gpus, STRICT_PACK)


def own_slot(group: int, need: Bundle) -> ReplicaSlot:
    """Where a replica sits in its own group: the actor in bundle 0, a GPU lease in each
    of the others."""
    return ReplicaSlot(group, 0, tuple(range(1, need.gpus + 1)))


@dataclass(frozen=True, slots=True)
class NodeResources:
    """A node of the cluster, as a snapshot: what it has for placement groups."""

    node_id: str
    cpus: float
    gpus: float


def placement_shortfall(plan: PlacementPlan, nodes: Iterable[NodeResources]) -> str | None:
    """What the cluster lacks to place `plan`, in words; None if its nodes can hold it."""
    nodes = tuple(nodes)
    need = plan.replica_need
    replicas, verb, had = _count(plan.replicas, "replica"), _need(plan.replicas), _nodes_text(nodes)
    if plan.ray_executor:
        gpus_had = sum(int(n.gpus) for n in nodes)
        gpus_needed = plan.replicas * plan.gpus_per_replica
        if gpus_had < gpus_needed:
            return (
                f"{replicas} of {plan.gpus_per_replica} GPUs across nodes {verb} {gpus_needed} "
                f"GPUs; the cluster has {gpus_had} ({had})"
            )
    if plan.spread:
        fitting = sum(1 for n in nodes if _replicas_on(n, need) >= 1)
        if fitting >= plan.replicas:
            return None
        return (
            f"{replicas} STRICT_SPREAD {verb} {_count(plan.replicas, 'node')} with "
            f"{_resources_text(need)} free; the cluster has {fitting} ({had})"
        )
    held = sum(_replicas_on(n, need) for n in nodes)
    if held >= plan.replicas:
        return None
    return (
        f"{replicas} of {_resources_text(need)} each (one node a replica) {verb} room for "
        f"{plan.replicas}; the cluster's nodes hold {held} ({had})"
    )


def node_for_added_replica(
    need: Bundle, free: Iterable[NodeResources], holding: Collection[str]
) -> str | None:
    """Under `spread`, the node an added replica's group is aimed at (`free`: what each alive
    node has free now; `holding`: the nodes the fleet's replicas are on or aimed at): one that
    holds no replica and has room for one, the one with room for the most (then the lowest
    id, so the answer is known). None when there is none: the group then goes wherever Ray
    finds room, next to a replica, or waits for room."""
    candidates = [n for n in free if n.node_id not in holding and _replicas_on(n, need) >= 1]
    if not candidates:
        return None
    return min(candidates, key=lambda n: (-_replicas_on(n, need), n.node_id)).node_id


def check_room(
    plan: PlacementPlan, nodes: Iterable[NodeResources], fixed_cluster: bool
) -> str | None:
    """Before placing: None if the nodes can hold the plan. Else, on a cluster that cannot
    grow (the one `address: local` starts), FleetError at once; on another, what it lacks,
    for a warning: an autoscaler may still add nodes within the placement timeout."""
    shortfall = placement_shortfall(plan, nodes)
    if shortfall is None or not fixed_cluster:
        return shortfall
    raise FleetError(
        f"the Ray cluster of this machine cannot hold the replicas: {shortfall}",
        hint="set cluster.placement: pack (one node holds several replicas), lower "
        "replicas.count or cluster.cpus_per_replica, or raise cluster.local_cpus",
    )


def _replicas_on(node: NodeResources, need: Bundle) -> int:
    """How many replicas needing `need` one node holds."""
    counts = [int(node.cpus // need.cpus)] if need.cpus > 0 else []
    if need.gpus > 0:
        counts.append(int(node.gpus // need.gpus))
    return min(counts) if counts else 0


def _resources_text(bundle: Bundle) -> str:
    parts = [_amount(bundle.cpus, "CPU")] if bundle.cpus or not bundle.gpus else []
    if bundle.gpus:
        parts.append(_amount(bundle.gpus, "GPU"))
    return " and ".join(parts)


def _nodes_text(nodes: tuple[NodeResources, ...]) -> str:
    if not nodes:
        return "no node is alive"
    shapes = Counter(_resources_text(Bundle(n.cpus, int(n.gpus))) for n in nodes)
    return "nodes: " + ", ".join(f"{count} x {shape}" for shape, count in shapes.most_common())


def _need(count: int) -> str:
    return "needs" if count == 1 else "need"


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _amount(value: float, unit: str) -> str:
    shown = f"{value:g}"
    return f"{shown} {unit}" if value == 1 else f"{shown} {unit}s"
