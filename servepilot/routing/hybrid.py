"""Hybrid: length sharding with dynamic compensation, and prefix affinity within each group."""

from __future__ import annotations

import random

from mypy_extensions import mypyc_attr

from servepilot.core.config import RoutingConfig
from servepilot.routing.kv_index import KvIndex
from servepilot.routing.length_shard import LengthShard
from servepilot.routing.prefix_affinity import PrefixAffinity


@mypyc_attr(allow_interpreted_subclasses=True)
class Hybrid(LengthShard):
    """The default policy: `LengthShard` choosing with a `PrefixAffinity` inside each group.

    Each group keeps its own prefix table (half of `prefix_table_blocks` each), so a system
    prompt shared by short and long requests sticks to one replica per group instead of the
    two groups' requests overwriting each other's entry. Stats merge the shard counters with
    the prefix counters of both groups.
    """

    name = "hybrid"

    def __init__(
        self, config: RoutingConfig, rng: random.Random, kv_index: KvIndex | None = None
    ) -> None:
        table_blocks = max(1, config.prefix_table_blocks // 2)
        super().__init__(
            config,
            rng,
            inner=lambda: PrefixAffinity(config, rng, table_blocks=table_blocks, kv_index=kv_index),
        )
