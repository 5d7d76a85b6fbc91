"""The gateway's batch utilisation, cost per QPS and GPU gauges, computed at scrape time."""

from __future__ import annotations

import types
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from servepilot.core.config import FleetConfig, GatewayConfig
from servepilot.fleet.serve import fleet_facts
from servepilot.gateway import FleetFacts, ReplicaInfo
from servepilot.gateway.fleet_gauges import QpsWindow, answered
from servepilot.gateway.gpu_gauges import GpuGauges
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.routing import make_policy

_REPLICA = ReplicaInfo(
    replica_id="r0", url="http://127.0.0.1:1", healthy=True, draining=False, in_flight=0,
    consecutive_failures=0, running=0, waiting=0, kv_cache_usage=0.0, models=("m",),
    capacity=8, group=None,
)  # fmt: skip


class _Pool:
    def __init__(self, replicas: list[ReplicaInfo]) -> None:
        self._replicas = replicas

    def replicas(self) -> list[ReplicaInfo]:
        return self._replicas


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _metrics(replicas: list[ReplicaInfo], gpus: GpuGauges | None = None) -> GatewayMetrics:
    config = GatewayConfig()
    pool: Any = _Pool(replicas)
    metrics = GatewayMetrics(pool, make_policy(config.policy, config.routing, 0))
    metrics.gpus = gpus if gpus is not None else GpuGauges(_no_nvml())
    return metrics


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _names(metrics: GatewayMetrics) -> set[str]:
    return {name for name, _ in _samples(metrics)}


def _no_nvml() -> types.ModuleType:
    class NVMLError(Exception):
        pass

    def init() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    return types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=init)  # type: ignore[return-value]


def test_batch_utilisation_is_running_over_max_num_seqs_per_replica_and_fleet() -> None:
    replicas = [
        replace(_REPLICA, replica_id="r0", running=16),
        replace(_REPLICA, replica_id="r1", running=48),
        replace(_REPLICA, replica_id="r2", running=64, healthy=False),  # not in the fleet's
    ]
    metrics = _metrics(replicas)
    metrics.know_fleet(FleetFacts(max_num_seqs=64, replica_usd_per_hour=None))
    got = _samples(metrics)
    assert got[("servepilot_batch_utilization", (("replica", "r0"),))] == 0.25
    assert got[("servepilot_batch_utilization", (("replica", "r1"),))] == 0.75
    assert got[("servepilot_batch_utilization", (("replica", "r2"),))] == 1.0
    # (16 + 48) / (2 x 64) over the two ready replicas.
    assert got[("servepilot_fleet_batch_utilization", ())] == 0.5
    assert "servepilot_cost_usd_per_qps_hour" not in _names(metrics)  # no price: no cost


def test_cost_per_qps_is_fleet_dollars_per_hour_over_sustained_qps() -> None:
    clock = _Clock()
    metrics = _metrics([replace(_REPLICA, replica_id=f"r{i}") for i in range(2)])
    metrics.qps = QpsWindow(window_s=300.0, clock=clock)
    metrics.know_fleet(FleetFacts(max_num_seqs=8, replica_usd_per_hour=6.0))
    assert _samples(metrics)[("servepilot_fleet_cost_usd_per_hour", ())] == 12.0
    assert "servepilot_sustained_qps" not in _names(metrics)  # one scrape: no rate yet
    for _ in range(1200):
        metrics.count_request("/v1/chat/completions", 200)
    metrics.count_request("/v1/chat/completions", 429)  # refused: not served
    metrics.count_request("/metrics", 200)  # not an inference
    clock.now_s = 60.0
    got = _samples(metrics)
    assert got[("servepilot_sustained_qps", ())] == 20.0  # 1200 answers in 60 s
    assert got[("servepilot_cost_usd_per_qps_hour", ())] == 0.6  # $12/h / 20 QPS


def test_no_traffic_has_no_cost_per_qps() -> None:
    clock = _Clock()
    metrics = _metrics([_REPLICA])
    metrics.qps = QpsWindow(clock=clock)
    metrics.know_fleet(FleetFacts(max_num_seqs=8, replica_usd_per_hour=1.0))
    _samples(metrics)
    clock.now_s = 30.0
    got = _samples(metrics)
    assert got[("servepilot_sustained_qps", ())] == 0.0
    assert "servepilot_cost_usd_per_qps_hour" not in _names(metrics)


def test_the_qps_window_forgets_what_is_older_than_the_window() -> None:
    clock = _Clock()
    window = QpsWindow(window_s=300.0, clock=clock)
    total = 0
    for second in range(0, 1001):
        clock.now_s = float(second)
        total += 10 if second < 500 else 2  # 10 QPS, then 2 QPS from t=500
        rate = window.update(total)
    # The last 300 s are all at 2 QPS (the pair kept at the window's edge is 300 s old).
    assert rate == 2.0
    assert len(window._samples) <= 302


def test_answered_counts_inference_routes_without_errors() -> None:
    counts = {
        ("/v1/completions", "200"): 3,
        ("/v1/chat/completions", "200"): 4,
        ("/v1/chat/completions", "503"): 7,
        ("/health", "200"): 9,
    }
    assert answered(counts) == 7


def test_without_fleet_facts_the_batch_and_cost_gauges_are_absent() -> None:
    names = _names(_metrics([_REPLICA]))
    assert not {n for n in names if "batch_utilization" in n or "cost" in n}


def test_gpu_gauges_are_absent_without_nvml() -> None:
    """This machine has no NVIDIA driver: the real pynvml (or its absence) gives no gauges."""
    metrics = _metrics([_REPLICA], GpuGauges())
    assert not {n for n in _names(metrics) if n.startswith("servepilot_gpu_")}


def _fake_nvml(busy_percent: list[int], used_gib: list[int]) -> types.ModuleType:
    class NVMLError(Exception):
        pass

    ns = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: len(busy_percent),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=busy_percent[h]),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            used=used_gib[h] * 2**30, total=80 * 2**30
        ),
    )
    return ns  # type: ignore[return-value]


def test_gpu_gauges_come_from_nvml_where_it_answers() -> None:
    metrics = _metrics([_REPLICA], GpuGauges(_fake_nvml([97, 40], [70, 10])))
    got = _samples(metrics)
    assert got[("servepilot_gpu_utilization", (("gpu", "0"),))] == 0.97
    assert got[("servepilot_gpu_utilization", (("gpu", "1"),))] == 0.40
    assert got[("servepilot_gpu_memory_used_bytes", (("gpu", "0"),))] == 70 * 2**30
    assert got[("servepilot_gpu_memory_total_bytes", (("gpu", "1"),))] == 80 * 2**30


def test_fleet_facts_from_fleet_yaml() -> None:
    cpu = fleet_facts(FleetConfig.model_validate({"replicas": {"count": 2}}))
    # vLLM-CPU's default batch; the catalog's $0.10/h host split between two replicas.
    assert cpu == FleetFacts(max_num_seqs=128, replica_usd_per_hour=0.05)
    gpu = fleet_facts(
        FleetConfig.model_validate(
            {
                "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8},
                "engine": {"tensor_parallel_size": 4, "max_num_seqs": 256},
            }
        )
    )
    assert gpu == FleetFacts(max_num_seqs=256, replica_usd_per_hour=4 * 6.155)
    unknown = FleetConfig.model_validate({"hardware": {"accelerator": "no-such-chip"}})
    assert fleet_facts(unknown).replica_usd_per_hour is None


def test_a_failing_gpu_read_leaves_the_gpu_gauges_out_of_that_scrape_only() -> None:
    nvml = _fake_nvml([50], [1])
    healthy = nvml.nvmlDeviceGetUtilizationRates

    def fell_off_the_bus(handle: int) -> Any:
        raise nvml.NVMLError("GPU is lost")

    metrics = _metrics([_REPLICA], GpuGauges(nvml))
    nvml.nvmlDeviceGetUtilizationRates = fell_off_the_bus
    assert not {n for n in _names(metrics) if n.startswith("servepilot_gpu_")}
    nvml.nvmlDeviceGetUtilizationRates = healthy
    assert _samples(metrics)[("servepilot_gpu_utilization", (("gpu", "0"),))] == 0.5


def test_sheds_and_queue_wait_are_exported_at_zero_before_any_happens() -> None:
    """The dashboard's sheds and queue-wait panels have series on a fleet that never shed or
    queued: every shed reason x class counter and every class's queue-wait histogram at 0."""
    samples = _samples(_metrics([]))
    sheds = {labels: v for (name, labels), v in samples.items() if name == "servepilot_shed_total"}
    reasons = ("degraded", "hard_limit", "no_replica", "queue_budget", "queue_full")
    assert sheds == {(("class", c), ("reason", r)): 0.0 for r in reasons for c in ("0", "1", "2")}
    waits = {
        labels: v for (name, labels), v in samples.items()
        if name == "servepilot_queue_wait_seconds_count"
    }  # fmt: skip
    assert waits == {(("class", c),): 0.0 for c in ("0", "1", "2")}
