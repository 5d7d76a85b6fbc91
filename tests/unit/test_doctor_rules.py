"""doctor's rules on recorded cases (tests/data/doctor/): each case's findings, their fleet.yaml
knob and its new value, worked out by hand from the recorded numbers."""

import dataclasses
from pathlib import Path

import pytest

from servepilot.core.config import parse_config
from servepilot.observe.doctor.evidence import Evidence, ReplicaEvidence, load
from servepilot.observe.doctor.finding import Finding, Severity
from servepilot.observe.doctor.rules import diagnose

CASES = Path(__file__).parent.parent / "data" / "doctor"
P, W, N = Severity.PROBLEM, Severity.WARNING, Severity.INFO
RENAMED = ("metric_names", N, None, None)  # every current-vLLM page: tools reading the old name


def findings(case: str) -> tuple[Finding, ...]:
    return diagnose(load(CASES / case))


def answers(case: str) -> list[tuple[str, Severity, str | None, str | None]]:
    return [(f.rule, f.severity, f.knob, f.value) for f in findings(case)]


def by_rule(case: str, rule: str) -> Finding:
    (found,) = [f for f in findings(case) if f.rule == rule]
    return found


def test_preemptions_lower_max_num_seqs_to_what_the_kv_cache_holds() -> None:
    # 93,184 KV tokens (startup log) / 400 tokens a request (40,000 tokens over 100 requests).
    assert answers("preemptions_cpu") == [
        ("preemptions", P, "engine.max_num_seqs", "232"),
        ("kv_near_full", W, "engine.cpu_kv_cache_space_gib", "3"),
        RENAMED,
    ]
    preempted = by_rule("preemptions_cpu", "preemptions")
    assert preempted.evidence == "r0: vllm:num_preemptions_total 12"
    assert "raise engine.cpu_kv_cache_space_gib to 3 (from 2)" in preempted.fix
    assert "what 93,184 KV tokens hold at 400 tokens a request" in preempted.fix
    assert by_rule("preemptions_cpu", "kv_near_full").evidence == (
        "r0: vllm:kv_cache_usage_perc 0.972"
    )


def test_a_kv_space_too_small_for_the_traffic_grows_by_what_is_missing() -> None:
    # vLLM: 0.02 GiB holds 640 tokens; the traffic needs 4 x 512 + 4 x 256 = 3,072:
    # 0.02 x 3,072 / 640 = 0.096, rounded up to the hundredth.
    assert answers("kv_too_small_cpu") == [("oom", P, "engine.cpu_kv_cache_space_gib", "0.1")]
    assert "estimated maximum model length is 640" in by_rule("kv_too_small_cpu", "oom").evidence


def test_a_gpu_out_of_memory_lowers_gpu_memory_utilization_to_the_seeds_085() -> None:
    assert answers("oom_gpu") == [
        ("oom", P, "engine.gpu_memory_utilization", "0.85"),
        ("shm_size", W, None, None),  # 64 MiB, but TP 1: a warning
    ]
    assert "CUDA out of memory" in by_rule("oom_gpu", "oom").evidence


def test_a_shared_gpus_out_of_memory_lowers_each_replicas_share() -> None:
    # Two replicas per GPU at 0.475 each: the whole GPU's 0.85 is 0.425 each.
    shared = parse_config(
        {"hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8,
                      "replicas_per_gpu": 2},
         "engine": {"gpu_memory_utilization": 0.475, "max_model_len": 8192}},
        origin="test",
    )  # fmt: skip
    oom = diagnose(dataclasses.replace(load(CASES / "oom_gpu"), config=shared))
    assert [(f.knob, f.value) for f in oom if f.rule == "oom"] == [
        ("engine.gpu_memory_utilization", "0.425")
    ]


def test_high_ttft_from_queueing_adds_a_replica() -> None:
    # TTFT p99: rank 99 of 100 in (2.5, 5.0] holding 40: 2.5 + 2.5 x 39/40 = 4.9375 s.
    # Queued: 110 s at the gateway + 20 s in vLLM; prefill: 10 s.
    assert answers("high_ttft_queueing") == [
        ("high_ttft", P, "replicas.count", "3"),
        ("low_batch_utilisation", P, "engine.max_num_batched_tokens", "8192"),
        RENAMED,
    ]
    assert by_rule("high_ttft_queueing", "high_ttft").evidence == (
        "TTFT p99 4,938 ms over 100 requests (the gateway's servepilot_ttft_seconds), limit "
        "1,000 ms; 130.0 s queued, 10.0 s in prefill"
    )
    assert (
        "batch utilisation 50% (r0 64, r1 64); 78 waiting"
        in by_rule("high_ttft_queueing", "low_batch_utilisation").evidence
    )


def test_high_ttft_from_prefill_with_chunked_prefill_off_turns_it_on() -> None:
    # No SLO: the 2 s default. TTFT p99 = 0.5 + 4.5 x 29/30 = 4.85 s; 80 s prefill, 2 s queued.
    # E2E: p50 = 0.25 + 0.75 x 50/90 = 0.667 s, p99 = 1 + 9 x 9/10 = 9.1 s: 13.6 x the median.
    assert answers("high_ttft_prefill") == [
        ("high_ttft", P, "engine.enable_chunked_prefill", "true"),
        ("p99_spikes", W, "engine.enable_chunked_prefill", "true"),
        RENAMED,
    ]
    assert "TTFT p99 4,850 ms" in by_rule("high_ttft_prefill", "high_ttft").evidence
    assert by_rule("high_ttft_prefill", "p99_spikes").evidence.startswith(
        "E2E p50 667 ms, p99 9,100 ms (13.6x)"
    )


def test_under_filled_batches_with_nothing_waiting_consolidate_replicas() -> None:
    # 20 running on 4 x 64 seqs (8%): ceil(20 / (0.7 x 64)) = 1 replica carries it.
    assert answers("low_batch_utilisation") == [
        ("low_batch_utilisation", W, "replicas.count", "1"),
        RENAMED,
    ]


def test_renamed_and_missing_metrics() -> None:
    found = findings("renamed_metrics")
    names = [(f.rule, f.severity, f.evidence) for f in found if f.rule == "metric_names"]
    assert names == [
        ("metric_names", P, "r2: no vllm:* or ray_vllm_* series"),
        ("metric_names", W, "r0: vllm:gpu_cache_usage_perc"),
        ("metric_names", N, "r1: ray_vllm_kv_cache_usage_perc"),
    ]
    # The legacy and the Ray page both count 7 preemptions, under their own names.
    assert [f.evidence for f in found if f.rule == "preemptions"] == [
        "r0: vllm:num_preemptions_total 7",
        "r1: vllm:num_preemptions_total 7",
    ]


def test_a_gpu_node_tp_across_nvlink_islands_shm_and_pending_placement() -> None:
    assert answers("gpu_node") == [
        ("shm_size", P, None, None),  # TP 8 needs it
        ("gpu_topology", P, "engine.tensor_parallel_size", "4"),
        ("placement_groups", P, "replicas.count", "2"),
    ]
    assert (
        by_rule("gpu_node", "gpu_topology").evidence
        == "nvidia-smi topo -m: GPU0 <-> GPU4 is SYS, across NUMA nodes"
    )
    assert by_rule("gpu_node", "placement_groups").evidence == "servepilot-r2 PENDING"


def test_bfloat16_forced_on_a_cpu_without_it() -> None:
    assert answers("cpu_without_bf16") == [
        ("cpu_features", P, "engine.dtype", "auto"),
        ("cpu_features", W, None, None),
    ]


def test_a_healthy_fleet_has_only_the_renamed_metric_note() -> None:
    assert answers("healthy") == [RENAMED]


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_every_finding_names_evidence_and_a_fix(case: str) -> None:
    for finding in findings(case):
        assert finding.evidence and finding.fix
        assert (finding.knob is None) == (finding.value is None)


def test_preemptions_seen_only_in_the_log() -> None:
    stats = "INFO [loggers.py:257] Engine 000: Running: 96 reqs, Waiting: 31 reqs, Preemptions: {}"
    logged = Evidence(replicas=(ReplicaEvidence("r0", None, stats.format(3)),))
    (found,) = diagnose(logged)
    assert (found.rule, found.evidence) == ("preemptions", "r0: its log: Preemptions: 3")
    # No KV line in the log: no max_num_seqs to compute, the KV space grows.
    assert (found.knob, found.value) == ("engine.cpu_kv_cache_space_gib", "3")
    assert diagnose(Evidence(replicas=(ReplicaEvidence("r0", None, stats.format(0)),))) == ()


def test_prefill_bound_ttft_with_chunked_prefill_on_depends_on_the_device() -> None:
    recorded = load(CASES / "high_ttft_prefill")
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": 4096}
    cpu = parse_config({"engine": chunked}, origin="test")
    gpu = parse_config({"engine": chunked, "hardware": {"device": "gpu",
                        "accelerator": "h100-80"}}, origin="test")  # fmt: skip
    on_cpu = [
        f for f in diagnose(dataclasses.replace(recorded, config=cpu)) if f.rule == "high_ttft"
    ]
    on_gpu = [
        f for f in diagnose(dataclasses.replace(recorded, config=gpu)) if f.rule == "high_ttft"
    ]
    # A CPU prefills at its compute rate: more replicas; a GPU: a bigger step budget (2 x 4,096).
    assert [(f.knob, f.value) for f in on_cpu] == [("replicas.count", "2")]
    assert [(f.knob, f.value) for f in on_gpu] == [("engine.max_num_batched_tokens", "8192")]
