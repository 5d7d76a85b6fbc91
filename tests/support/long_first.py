"""The order xdist hands modules to its workers in (`make test`: `-n 4 --dist loadscope`).

loadscope hands modules out by their number of tests, most first, so a module of a few long
tests (a model's conversion, a Ray cluster, the docs' shell blocks) is handed out last and
runs alone at the end while the other workers sit idle: a minute of one core on two. The
modules named here go first; the rest keep xdist's order.
"""

from __future__ import annotations

from pathlib import Path

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]
from xdist.workermanage import WorkerController  # type: ignore[import-untyped]

LONG_MODULES = (
    "tests/integration/test_up_autoscale.py",
    "tests/unit/test_model_source.py",
    "tests/unit/test_autoscale_failure_modes.py",
    "tests/integration/test_docs_commands.py",
    "tests/integration/test_ray_backend.py",
    "tests/integration/test_cli_errors.py",
    "tests/unit/test_plan_checkpoints.py",
    "tests/integration/test_batch_api.py",
    "tests/integration/test_accept_sim.py",
    "tests/unit/test_sim_replica_vllm.py",
    "tests/unit/test_plan_kv_vllm.py",
    "tests/integration/test_fleet_ports.py",
    "tests/integration/test_gateway_soak.py",
    "tests/unit/test_shared_gpu.py",
)
"""Slowest first, as measured: `pytest -n 4 --dist loadscope -m "not vllm" --durations=0`,
the durations summed by module."""


def missing_modules(rootdir: Path) -> list[str]:
    """Names above that are no longer modules of the suite (renamed or split)."""
    return [name for name in LONG_MODULES if not (rootdir / name).is_file()]


class LongModulesFirst(LoadScopeScheduling):  # type: ignore[misc]
    def _assign_work_unit(self, node: WorkerController) -> None:
        for scope in reversed(LONG_MODULES):
            if scope in self.workqueue:
                self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)
