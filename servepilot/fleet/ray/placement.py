"""Where a fleet's replicas go on a Ray cluster: the placement groups, planned from the fleet
config alone, and whether a cluster's nodes can hold them, said in words. No Ray here: plain
records in and out, so every rule is tested without a cluster.

One placement group per replica, bundles `[{CPU: n}] + [{GPU: 1}] x TP`: bundle 0 holds the
replica's actor (its server process), one bundle per GPU because that is the shape vLLM's own
Ray executor requires ("a bundle cannot have more than 1 GPU"). A replica that fits one node
packs STRICT_PACK, since tensor parallelism across nodes is slow and vLLM only warns about it.

Between replicas, `spread` is node anti-affinity: each replica's bundles carry a label
selector `ray.io/node-id: !in(<nodes the replicas placed before it hold>)`, and the groups are
placed one after the other. Chosen over a STRICT_SPREAD anchor group (one small bundle per
replica) because Ray cannot tie one group's bundles to the node of another group's bundle:
after a node loss the anchor's bundle would move to a new node while the replica's group,
pinned to the anchor's old node, could never follow. With anti-affinity each replica's group
is one Ray object that Ray itself reschedules on a surviving node (the actor in it restarts
there), still avoiding the nodes the earlier replicas held when it was placed.

A replica wider than one node (TP x PP above the GPUs of a node) runs vLLM's own Ray executor
(`--distributed-executor-backend ray`): vLLM, started as a process rather than inside the
actor, cannot reuse our group, so it places its workers in a group of its own (`{GPU: 1}` per
rank, PACK) and ours holds only the driver's CPU bundle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from servepilot.core.cluster_config import Placement
from servepilot.core.config import Device, FleetConfig

NODE_ID_LABEL = "ray.io/node-id"
STRICT_PACK = "STRICT_PACK"
PACK = "PACK"
RAY_EXECUTOR_ARGS = ("--distributed-executor-backend", "ray")


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
class PlacementPlan:
    """The placement group every replica gets, and how the replicas spread."""

    replicas: int
    bundles: tuple[Bundle, ...]
    strategy: str
    spread: bool
    gpus_per_replica: int
    """All the GPUs one replica uses, those vLLM's executor places itself included."""
    ray_executor: bool
    """The replica spans nodes: vLLM runs with --distributed-executor-backend ray."""

    @property
    def replica_need(self) -> Bundle:
        """What one node must hold for one replica (all of it but a multi-node replica's
        GPUs, which vLLM's executor spreads over nodes)."""
        return Bundle(sum(b.cpus for b in self.bundles), sum(b.gpus for b in self.bundles))

    @property
    def engine_args(self) -> tuple[str, ...]:
        """What the replica's vLLM command line gains from the placement."""
        return RAY_EXECUTOR_ARGS if self.ray_executor else ()

    def describe(self) -> str:
        """One line for `up`: the group each replica gets, and the spread."""
        gpu_bundles = sum(1 for b in self.bundles if b.gpus)
        shown = f"[{{CPU: {self.bundles[0].cpus:g}}}]"
        if gpu_bundles:
            shown += f" + [{{GPU: 1}}] x {gpu_bundles}"
        between = "at most one per node" if self.spread else "sharing nodes where they fit"
        executor = "; vLLM's Ray executor places its GPUs" if self.ray_executor else ""
        return (
            f"{_count(self.replicas, 'placement group')} of {shown} {self.strategy}, {between}"
            f"{executor}"
        )


def plan_placement(layout: ReplicaLayout) -> PlacementPlan:
    driver = Bundle(layout.cpus_per_replica, 0)
    gpus = layout.gpus_per_replica
    wider_than_node = gpus > layout.gpus_per_node > 0
    if wider_than_node:
        bundles: tuple[Bundle, ...] = (driver,)
    else:
        bundles = (driver,) + (Bundle(0, 1),) * gpus
    return PlacementPlan(
        replicas=layout.replicas,
        bundles=bundles,
        strategy=PACK if wider_than_node else STRICT_PACK,
        spread=layout.spread,
        gpus_per_replica=gpus,
        ray_executor=wider_than_node,
    )


def spread_selector(avoid_node_ids: Iterable[str]) -> dict[str, str]:
    """The label selector that keeps a bundle off these nodes (empty: anywhere)."""
    ids = sorted(set(avoid_node_ids))
    return {NODE_ID_LABEL: f"!in({','.join(ids)})"} if ids else {}


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
