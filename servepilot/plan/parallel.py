"""How one vLLM server spreads a model over accelerators (TP, PP, EP, DP attention)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Parallelism:
    """One replica's layout; vLLM's --tensor/--pipeline/--data-parallel-size and EP."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    """Data-parallel attention ranks inside one server (vLLM --data-parallel-size): each rank
    runs attention on its own requests with its own KV pool; experts are shared by EP."""
    expert_parallel: bool = False

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def ep(self) -> int:
        """Ranks the routed experts are spread over (1 when experts are sliced by TP)."""
        return self.tp * self.dp if self.expert_parallel else 1

    @property
    def kv_pools(self) -> int:
        """Independent KV pools in the server: one per DP rank (TP ranks share one pool,
        each holding its slice of every token; PP stages each hold their layers')."""
        return self.dp

    def describe(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        if self.expert_parallel:
            parts.append(f"EP{self.ep}")
        return "+".join(parts)
