"""How to start a planned replica as printed: one `vllm serve`, or, for a replica wider than a
node, a Ray cluster over its nodes with vLLM's Ray executor on the head node.

vLLM runs a replica that spans nodes (PP across nodes, TP inside each) through Ray: every
node joins one Ray cluster (`ray start --head` on one, `ray start --address` on the others),
then `vllm serve ... --distributed-executor-backend ray` on the head places the workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.plan.checkpoint import Checkpoint

RAY_PORT = 6379


@dataclass(frozen=True, slots=True)
class Launch:
    command: str
    """The `vllm serve` command (on the head node when the replica spans nodes)."""
    nodes: int
    """Nodes one replica spans."""
    checkpoint: Checkpoint

    @property
    def steps(self) -> tuple[str, ...]:
        """Shell lines in order, `#` lines saying where each one runs."""
        notes = (f"# {self.checkpoint.note}",) if self.checkpoint.note else ()
        if self.nodes == 1:
            return (*notes, self.command)
        return (
            *notes,
            f"# one replica over {self.nodes} nodes (vLLM's Ray executor); every node has "
            "the same vLLM version and the model at the same path",
            "# on the head node:",
            f"ray start --head --port={RAY_PORT}",
            f"# on every other node of the replica ({self.nodes - 1}):",
            f"ray start --address=<head node IP>:{RAY_PORT}",
            f"# then on the head node, once `ray status` lists {self.nodes} nodes:",
            self.command,
        )
