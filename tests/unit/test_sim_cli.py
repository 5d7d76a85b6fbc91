"""`servepilot sim`: flags, fleet.yaml, profiles, and a results.json bench can read."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from servepilot.cli.main import main
from servepilot.core.config import FleetConfig
from servepilot.core.results import BenchResult, Load, LoadMode, Source, load_result
from servepilot.core.slo import Slo
from servepilot.engine.cpu import cpu_flags
from servepilot.load.arrivals import Arrival, iter_arrival_offsets_s
from servepilot.load.levels import LevelOptions
from servepilot.load.shapes import workload_shapes
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from servepilot.plan.costmodel import CostModel
from servepilot.plan.costprofile import save_profile
from servepilot.sim.engine.records import SchedulerConfig
from servepilot.sim.fleet.members import INTAKE_WAIT_S
from servepilot.sim.fleet.network import Delay, parse_network
from servepilot.sim.fleet.records import FleetSpec
from servepilot.sim.fleet.session import SimOptions, level_jobs, level_offsets, level_plan

PROFILE = CostModel(
    base_s=0.005,
    per_prefill_token_s=2e-5,
    per_prefill_seq_s=1e-4,
    per_decode_seq_s=3e-4,
    per_context_token_s=1e-7,
    per_prefill_pair_s=0.0,
    source="calibrated: test",
)


def _sim(tmp_path: Path, *flags: str) -> BenchResult:
    out = tmp_path / "out"
    assert main(["sim", *flags, "--out", str(out)]) == 0
    return load_result(out / "results.json")


def test_writes_a_simulated_bench_result(tmp_path: Path) -> None:
    result = _sim(tmp_path, "--concurrency", "1,4", "--requests", "12", "--input-tokens", "64",
                  "--output-tokens", "8")  # fmt: skip
    assert result.source is Source.SIMULATED
    assert [run.load.value for run in result.runs] == [1.0, 4.0]
    assert all(run.completed == 12 and run.failed == 0 for run in result.runs)
    assert result.runs[0].input_tokens_mean == 64 and result.runs[0].output_tokens_mean == 8
    target = result.target
    assert target["cost_model"]["kind"] == "roofline"
    assert target["cost_model"]["source"] == "roofline: cpu/smollm2"
    assert target["scheduler"]["kv_capacity_tokens"] > 0
    assert target["replicas"] == 1 and len(target["levels"]) == 2
    assert result.sweet_spot is not None


def test_bench_compare_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _sim(tmp_path / "a", "--rate", "2", "--requests", "10", "--output-tokens", "4")
    b = _sim(tmp_path / "b", "--rate", "2", "--requests", "10", "--output-tokens", "8")
    assert a.runs[0].load == b.runs[0].load
    capsys.readouterr()
    code = main(["bench", "compare", str(tmp_path / "a/out/results.json"),
                 str(tmp_path / "b/out/results.json")])  # fmt: skip
    assert code == 0
    assert "TTFT p50" in capsys.readouterr().out


def test_profile_sets_step_times_and_prompt_overhead(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    save_profile(PROFILE, profile, meta={"prompt_overhead_tokens": 9})
    result = _sim(tmp_path, "--profile", str(profile), "--concurrency", "1", "--requests", "5",
                  "--input-tokens", "40", "--output-tokens", "3")  # fmt: skip
    assert result.target["cost_model"]["kind"] == "profile"
    assert result.target["cost_model"]["coefficients"]["base_s"] == 0.005
    assert result.target["prompt_overhead_tokens"] == 9
    run = result.runs[0]
    assert run.input_tokens_mean == 49  # the server's chat template on top of each prompt
    # Alone on the replica: one prefill step (49 tokens), then two decode steps.
    prefill = 0.005 + 49 * 2e-5 + 1e-4
    assert run.ttft_ms.p50 == pytest.approx(prefill * 1000)


def test_a_chat_profiles_template_is_inside_input_tokens_as_bench_sends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # bench sizes a chat message so the server counts --input-tokens, template included: the
    # simulation must not add the template again (it did: 40 + 30 = 70 tokens per prompt).
    profile = tmp_path / "profile.json"
    save_profile(PROFILE, profile, meta={"endpoint": "chat", "prompt_overhead_tokens": 30})
    result = _sim(tmp_path, "--profile", str(profile), "--concurrency", "1", "--requests", "5",
                  "--input-tokens", "40", "--output-tokens", "3")  # fmt: skip
    assert result.target["prompt_overhead_tokens"] == 0
    assert result.target["chat_template_tokens"] == 30
    run = result.runs[0]
    assert run.input_tokens_mean == 40
    assert run.ttft_ms.p50 == pytest.approx((0.005 + 40 * 2e-5 + 1e-4) * 1000)
    assert (
        "prompt overhead: none on top of --input-tokens (the chat template's 30 tokens are "
        "inside it, as bench sizes chat prompts)"
    ) in capsys.readouterr().err.replace("\n", " ")


def test_a_completions_profiles_bos_token_is_added(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    save_profile(PROFILE, profile, meta={"endpoint": "completions", "prompt_overhead_tokens": 1})
    result = _sim(tmp_path, "--profile", str(profile), "--concurrency", "1", "--requests", "5",
                  "--input-tokens", "40", "--output-tokens", "3")  # fmt: skip
    assert result.target["prompt_overhead_tokens"] == 1
    assert result.target["chat_template_tokens"] == 0
    assert result.runs[0].input_tokens_mean == 41


def test_the_profiles_request_overhead_is_the_default_client_delay(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    save_profile(PROFILE, profile, meta={"request_overhead_ms": 12.0})
    flags = ("--profile", str(profile), "--concurrency", "1", "--requests", "5",
             "--input-tokens", "40", "--output-tokens", "3")  # fmt: skip
    result = _sim(tmp_path / "default", *flags)
    assert result.target["network_ms"]["client"] == 6.0  # half each way
    prefill = 0.005 + 40 * 2e-5 + 1e-4
    assert result.runs[0].ttft_ms.p50 == pytest.approx(prefill * 1000 + 12.0)
    given = _sim(tmp_path / "given", *flags, "--network-ms", "client=1")
    assert given.target["network_ms"]["client"] == 1.0


def test_the_profiles_intake_per_prompt_token_delays_the_first_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    save_profile(PROFILE, profile, meta={"intake_us_per_prompt_token": 250.0})
    result = _sim(tmp_path / "sim", "--profile", str(profile), "--concurrency", "1",
                  "--requests", "5", "--input-tokens", "40", "--output-tokens", "3")  # fmt: skip
    prefill = 0.005 + 40 * 2e-5 + 1e-4
    # After the tokenizer's wait for more prompts (INTAKE_WAIT_S), 250 us a prompt token.
    intake_ms = INTAKE_WAIT_S * 1000 + 40 * 0.25
    assert result.runs[0].ttft_ms.p50 == pytest.approx(prefill * 1000 + intake_ms)
    save_profile(PROFILE, profile, meta={"intake_us_per_prompt_token": -1})
    code = main(["sim", "--profile", str(profile), "--concurrency", "1", "--requests", "3"])
    assert code == 2
    assert "meta.intake_us_per_prompt_token: expected a number >= 0" in capsys.readouterr().err


def test_the_profiles_output_cost_per_token_delays_every_token(tmp_path: Path) -> None:
    """250 us a streamed token, under every step: each token reaches the client 0.25 ms
    later, so TTFT moves by that and TPOT not at all."""
    profile = tmp_path / "profile.json"
    flags = ("--concurrency", "1", "--requests", "5", "--input-tokens", "40",
             "--output-tokens", "3")  # fmt: skip
    save_profile(PROFILE, profile, meta={})
    base = _sim(tmp_path / "base", "--profile", str(profile), *flags).runs[0]
    save_profile(PROFILE, profile, meta={"output_us_per_token": 250.0})
    slow = _sim(tmp_path / "slow", "--profile", str(profile), *flags).runs[0]
    assert slow.ttft_ms.p50 == pytest.approx(base.ttft_ms.p50 + 0.25)
    assert slow.tpot_ms.p50 == pytest.approx(base.tpot_ms.p50)


def test_fleet_yaml_sets_replicas_policy_and_slo(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "replicas: {count: 3}\ngateway: {policy: round_robin}\nslo: {ttft_p99_ms: 100000}\n"
    )
    result = _sim(tmp_path, "-c", str(config), "--rate", "5", "--requests", "9",
                  "--output-tokens", "4", "--network-ms", "client=1,same=0.5")  # fmt: skip
    assert result.target["replicas"] == 3
    assert result.target["policy"] == "round_robin"
    assert result.target["network_ms"]["client"] == 1.0
    assert result.slo == {"ttft_p99_ms": 100000.0}
    assert result.runs[0].slo_attainment == 1.0


def test_sim_takes_every_slo_key_tune_takes(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("slo: {itl_p99_ms: 100000, ttft_p50_ms: 0.001}\n")
    flags = ["--concurrency", "1,2", "--requests", "6", "--output-tokens", "4"]
    result = _sim(tmp_path / "yaml", "-c", str(config), *flags)
    assert result.slo == {"itl_p99_ms": 100000.0, "ttft_p50_ms": 0.001}
    # No per-request limit: every request is good; the level misses its TTFT median.
    assert all(r.slo_attainment == 1.0 for r in result.runs)
    assert all(r.slo_met is False and r.slo_violated == ("ttft_p50_ms",) for r in result.runs)
    assert result.sweet_spot is None  # no level met the SLO
    flag = _sim(tmp_path / "flag", "--slo", "ttft_p99_ms=100000,itl_p99_ms=100000", *flags)
    assert list(flag.slo) == ["ttft_p99_ms", "itl_p99_ms"]
    assert all(r.slo_met is True and r.slo_violated == () for r in flag.runs)
    assert flag.sweet_spot is not None


def test_flags_override_fleet_yaml(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("replicas: {count: 3}\n")
    result = _sim(tmp_path, "-c", str(config), "--replicas", "2", "--policy", "least_load",
                  "--rate", "5", "--requests", "6", "--output-tokens", "2")  # fmt: skip
    assert result.target["replicas"] == 2 and result.target["policy"] == "least_load"


def test_sweep_stops_by_itself_and_names_a_sweet_spot(tmp_path: Path) -> None:
    result = _sim(tmp_path, "--sweep", "--requests", "30", "--input-tokens", "32",
                  "--output-tokens", "4")  # fmt: skip
    assert 2 <= len(result.runs) <= 12
    assert [r.load.value for r in result.runs][:3] == [1.0, 2.0, 4.0]
    assert result.sweet_spot is not None


def test_duration_and_autoscale(tmp_path: Path) -> None:
    flags = ["--autoscale", "1:3", "--cold-start", "5s", "--autoscale-interval", "5s"]
    result = _sim(tmp_path, "--rate", "4", "--duration", "20s", "--output-tokens", "4", *flags)
    run = result.runs[0]
    assert run.completed + run.failed >= 70
    assert result.target["cold_start_s"] == 5.0


def test_fleet_yamls_autoscale_section_is_simulated_without_the_flag(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "autoscale: {enabled: true, min_replicas: 1, max_replicas: 3, interval_s: 2}\n"
    )
    flags = ["-c", str(fleet), "--cold-start", "5s", "--rate", "2", "--duration", "10s"]
    result = _sim(tmp_path, *flags, "--output-tokens", "4")
    # The section's policy (step, where the flag's default is target) and its bounds.
    assert result.target["autoscale"] == {"policy": "step", "min_replicas": 1, "max_replicas": 3}
    with_flag = _sim(tmp_path, *flags, "--output-tokens", "4", "--autoscale", "2:4")
    assert with_flag.target["autoscale"]["policy"] == "target"  # the flag wins, whole


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--network-ms", "far=3"], "--network-ms"),
        (["--network-ms", "cross=9-3"], "LOW <= HIGH"),
        (["--network-ms", "client=1-2"], "one value"),
        (["--autoscale", "3"], "--autoscale"),
        (["--concurrency", "1.5"], "whole numbers"),
        (["--rate", "0"], "positive"),
        (["--profile", "/nonexistent/profile.json"], "no such cost profile"),
        (["--cold-start", "soon"], "--cold-start"),
        (["--slo", "ttft=5"], "--slo"),
    ],
)
def test_bad_flags_say_what_is_wrong(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sim", *flags, "--requests", "3"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err


@pytest.mark.parametrize("flag", ["--soak", "--window", "--processes"])
def test_sim_neither_lists_nor_takes_what_only_a_real_client_does(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as help_exit:
        main(["sim", "--help"])
    assert help_exit.value.code == 0
    assert flag not in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["sim", flag, "2", "--requests", "3"])
    assert refused.value.code == 2
    assert f"unrecognized arguments: {flag} 2" in capsys.readouterr().err


def test_requests_longer_than_max_model_len_fail_400_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _sim(tmp_path, "--input-tokens", "4000", "--requests", "3")
    assert result.runs[0].errors == {"http_400": 3}
    assert "longer than max_model_len" in capsys.readouterr().err


def test_an_unknown_policy_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--policy", "fastest"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_network_flag_parses_one_way_delays_in_ms() -> None:
    net = parse_network("client=2,same=0.1,cross=10-20", replicas_per_node=4)
    assert net.client_gateway_s == 0.002
    assert net.same_node == Delay(0.0001, 0.0001)
    assert net.cross_node == Delay(0.01, 0.02)
    assert net.replica_delay(3) == net.same_node and net.replica_delay(4) == net.cross_node
    assert parse_network(None, 8).cross_node == Delay(0.0075, 0.015)  # the seed's 15-30 ms


def _options(workload: WorkloadSpec) -> SimOptions:
    scheduler = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                                block_size=16, num_blocks=1000)  # fmt: skip
    levels = LevelOptions(workload=workload, loads=(), sweep=None, requests=None,
                          duration_s=None, warmup_requests=0, arrival=Arrival.POISSON,
                          burstiness=1.0)  # fmt: skip
    return SimOptions(
        spec=FleetSpec(scheduler, PROFILE, replicas=1, capacity=8),
        levels=levels,
        slo=Slo(),
        prompt_overhead_tokens=0,
        target={},
    )


@pytest.mark.parametrize("kind", [WorkloadKind.MIXED, WorkloadKind.SHARED_PREFIX,
                                  WorkloadKind.MULTI_TURN])  # fmt: skip
def test_levels_send_bench_workload_shapes_and_arrivals(kind: WorkloadKind) -> None:
    workload = WorkloadSpec(kind=kind, input_tokens=200, output_tokens=20, seed=5)
    opts = _options(workload)
    load = Load(mode=LoadMode.RATE, value=3.0)
    plan = level_plan(opts, load)
    assert plan.max_requests == 100  # bench's default_requests for 3 req/s
    jobs = level_jobs(workload, 100, overhead_tokens=0)
    shapes = workload_shapes(workload, 100)
    for i, shape in enumerate(shapes):
        job = jobs.job(i)
        assert job.prompt_tokens == shape.input_tokens + shape.history_tokens
        assert job.prefix_group == shape.prefix_group
        assert job.prefix_tokens == shape.prefix_tokens
        assert job.session_id == shape.session_id
    offsets = level_offsets(plan, jobs)
    assert offsets is not None
    expected = iter_arrival_offsets_s(3.0, Arrival.POISSON, seed=5)
    assert list(itertools.islice(offsets, 50)) == list(itertools.islice(expected, 50))


def test_the_result_is_plain_json(tmp_path: Path) -> None:
    _sim(tmp_path, "--rate", "3", "--requests", "5", "--output-tokens", "2")
    document = json.loads((tmp_path / "out/results.json").read_text())
    assert document["schema"] == "servepilot.bench/v1"
    assert document["source"] == "simulated"
    assert dataclasses.is_dataclass(FleetConfig) is False  # (pydantic, not a dataclass)


def test_replicas_are_what_up_would_launch() -> None:
    from servepilot.core.config import parse_config
    from servepilot.sim.fleet.setup import replica_setup

    cpu = replica_setup(FleetConfig(), None, cpu_flags())
    # DESIGN.md: 2 GiB of vLLM-CPU KV cache hold 93,184 SmolLM2 tokens in bf16, half in fp32.
    assert cpu.kv_capacity_tokens in (46_592, 93_184)
    assert cpu.kv_bytes == 2 * 2**30
    s = cpu.scheduler
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.block_size) == (128, 2048, 128)
    assert s.num_blocks * s.block_size == cpu.kv_capacity_tokens
    assert not s.async_scheduling and s.enable_prefix_caching and s.enable_chunked_prefill
    assert cpu.cost_kind == "roofline" and cpu.capacity == min(128, cpu.kv_capacity_tokens // 1024)
    gpu_config = parse_config(
        {
            "model": {"source": "llama-3.1-8b"},
            "hardware": {"device": "gpu", "accelerator": "h100", "count": 8},
            "engine": {"tensor_parallel_size": 2, "enable_prefix_caching": False},
        },
        origin="test",
    )
    gpu = replica_setup(gpu_config, None, cpu_flags())
    s = gpu.scheduler
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.block_size) == (1024, 8192, 16)
    assert s.async_scheduling and not s.enable_prefix_caching
    assert gpu.replicas_per_node == 4  # 8 GPUs per node, 2 per replica
    assert gpu.cost.source == "roofline: h100-80/llama-3.1-8b"


def test_the_readmes_large_fleet_example_serves_its_load(tmp_path: Path) -> None:
    # README: `sim -c docs/examples/llama-8b-h100.yaml --rate 5000 --duration 1m`; here one
    # simulated second of it: 80 Llama-3.1-8B replicas take 5,000 requests/s without refusing.
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "llama-8b-h100.yaml"
    result = _sim(tmp_path, "-c", str(example), "--rate", "5000", "--duration", "1s")
    run = result.runs[0]
    assert result.target["replicas"] == 80
    assert run.failed == 0 and run.completed > 4500


def test_each_level_reports_the_engine_queue_and_prefill_times_vllm_would(tmp_path: Path) -> None:
    # Every step 10 ms and a token budget of one 32-token prompt: in a closed loop of two
    # one-token requests, each is prefilled (and answered) in a step of its own, and waits in
    # the engine's queue for the other's step: 10 ms, the first one sent excepted.
    profile = tmp_path / "profile.json"
    constant = dataclasses.replace(PROFILE, base_s=0.01, per_prefill_token_s=0.0,
                                   per_prefill_seq_s=0.0, per_decode_seq_s=0.0,
                                   per_context_token_s=0.0)  # fmt: skip
    save_profile(constant, profile, meta={})
    config = tmp_path / "fleet.yaml"
    config.write_text("engine: {max_num_batched_tokens: 32, max_num_seqs: 8}\n")
    result = _sim(tmp_path, "-c", str(config), "--profile", str(profile), "--concurrency", "2",
                  "--requests", "20", "--warmup", "0", "--input-tokens", "32",
                  "--output-tokens", "1")  # fmt: skip
    level = result.target["levels"][0]
    assert level["engine_prefill_ms"] == pytest.approx(10.0)
    assert level["engine_queue_ms"] == pytest.approx(10.0 * 19 / 20)
