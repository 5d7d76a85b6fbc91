"""tune's parts: the SLA checks, scoring, the load sweep, trials.jsonl, the planner's space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servepilot.core.config import FleetConfig
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import parse_slo
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import get_accelerator
from servepilot.plan.planner import make_plan
from servepilot.plan.presets import load_model
from servepilot.plan.request import PlanRequest
from servepilot.tune.loadsweep import LoadSweep, next_load
from servepilot.tune.planspace import build_space
from servepilot.tune.runners.vllm import _count
from servepilot.tune.score import Failure, FailureCause, Measurement, Trial, score
from servepilot.tune.sla import meets
from servepilot.tune.space import Knob, TrialConfig, config_from_dict, ladder
from servepilot.tune.store import TrialStore
from tests.unit.tune_support import run

# ---- the SLA ----------------------------------------------------------------------------


def test_a_level_meets_the_sla_on_every_statistic_and_few_failures() -> None:
    sla = parse_slo("ttft_p99_ms=500,tpot_p50_ms=8")
    assert meets(run(4, 1.0, ttft_ms=400, tpot_ms=10), sla)  # tpot p50 is 5
    assert not meets(run(4, 1.0, ttft_ms=600), sla)
    assert not meets(run(4, 1.0, ttft_ms=400, tpot_ms=20), sla)
    assert not meets(run(4, 1.0, failed=1), sla)  # 1 of 21 failed: more than 1%


def test_score_is_goodput_at_the_highest_level_meeting_the_sla() -> None:
    sla = parse_slo("ttft_p99_ms=1000")
    runs = (run(1, 1.0, ttft_ms=200), run(2, 1.8, ttft_ms=500), run(4, 2.5, ttft_ms=1500))
    result = score(Measurement(runs, 8, 0, None, 0.0), sla)
    assert result.met and result.goodput_rps == 1.8
    assert result.best is not None and result.best.load.value == 2
    assert result.binding is not None and result.binding.key == "ttft_p99_ms"
    assert result.binding.ratio == pytest.approx(1.5)


def test_score_with_nothing_meeting_says_how_close_and_what_binds() -> None:
    sla = parse_slo("ttft_p99_ms=100,tpot_p99_ms=50")
    runs = (run(1, 1.0, ttft_ms=150, tpot_ms=20), run(2, 1.5, ttft_ms=300, tpot_ms=30))
    result = score(Measurement(runs, 8, 0, None, 0.0), sla)
    assert not result.met and result.goodput_rps == 0.0
    assert result.closeness == pytest.approx(1.5)
    assert result.binding is not None and result.binding.key == "ttft_p99_ms"


# ---- the load sweep ---------------------------------------------------------------------


def test_sweep_doubles_then_bisects_where_the_sla_breaks() -> None:
    sla = parse_slo("ttft_p99_ms=1000")
    sweep = LoadSweep(max_value=64, refine_levels=2)
    runs = [run(1, 1, ttft_ms=100), run(2, 2, ttft_ms=200), run(4, 3, ttft_ms=400)]
    assert next_load(sweep, sla, runs).load == Load(mode=LoadMode.CONCURRENCY, value=8)
    runs.append(run(8, 3.5, ttft_ms=1500))
    step = next_load(sweep, sla, runs)
    assert step.load is not None and step.load.value == 6 and "bisecting" in step.reason
    runs.append(run(6, 3.4, ttft_ms=900))
    step = next_load(sweep, sla, runs)
    assert step.load is not None and step.load.value == 7
    runs.append(run(7, 3.45, ttft_ms=1100))
    assert next_load(sweep, sla, runs).load is None


def test_sweep_stops_at_its_highest_load() -> None:
    sweep = LoadSweep(max_value=4)
    runs = [run(1, 1, throughput=1), run(2, 2, throughput=2), run(4, 4, throughput=4)]
    step = next_load(sweep, parse_slo("ttft_p99_ms=1000"), runs)
    assert step.load is None and "highest load" in step.reason


# ---- trials.jsonl -----------------------------------------------------------------------


def test_store_round_trips_and_skips_torn_lines_and_other_contexts(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    config = TrialConfig.of({Knob.MAX_NUM_SEQS: 64, Knob.KV_CACHE_DTYPE: "auto"})
    measured = Trial(1, config, Measurement((run(2, 1.5),), 64, 3, 46592, 41.0), 60.0, "default")
    failed_config = config.with_value(Knob.MAX_NUM_SEQS, 128)
    failed = Trial(2, failed_config, Failure(FailureCause.OUT_OF_MEMORY, "oom"), 9.0, "raise")
    TrialStore(path, "a").append(measured)
    TrialStore(path, "b").append(failed)
    TrialStore(path, "a").append(failed)
    with path.open("a") as f:
        f.write('{"schema": "servepilot.tune/v1", "context": "a", "key": "tor')
    loaded = TrialStore(path, "a").load()
    assert set(loaded.trials) == {config.key, failed_config.key}
    assert loaded.trials[config.key] == measured
    assert loaded.trials[failed_config.key].outcome == Failure(FailureCause.OUT_OF_MEMORY, "oom")
    assert (loaded.other_contexts, loaded.torn_lines) == (1, 1)


def test_config_key_is_canonical() -> None:
    a = TrialConfig.of({Knob.MAX_NUM_SEQS: 8, Knob.MAX_MODEL_LEN: 1024})
    b = TrialConfig.of({Knob.MAX_MODEL_LEN: 1024, Knob.MAX_NUM_SEQS: 8})
    assert a == b and a.key == b.key
    assert config_from_dict(json.loads(json.dumps(a.as_dict()))) == a
    assert a.with_value(Knob.MAX_NUM_SEQS, 16).key != a.key


def test_ladder_doubles_with_midpoints_and_keeps_the_planners_values() -> None:
    assert ladder(1, 20) == (1, 2, 3, 4, 6, 8, 12, 16)
    assert ladder(100, 300, extra=[145]) == (128, 145, 192, 256)


# ---- the planner's space ----------------------------------------------------------------


def _request(config: FleetConfig, model: str, accelerator: str, count: int) -> PlanRequest:
    return PlanRequest(
        model=load_model(model),
        model_ref=model,
        accelerator=get_accelerator(accelerator),
        count=count,
        nodes=1,
        weights_dtype=WeightDtype.BF16 if accelerator != "cpu" else WeightDtype.FP32,
        kv_dtype=KvDtype.AUTO,
        traffic=config.traffic,
        slo=config.slo,
    )


def test_cpu_space_starts_at_the_plan_and_refuses_what_vllm_refuses() -> None:
    config = FleetConfig()
    request = _request(config, "smollm2", "cpu", 1)
    space = build_space(config, request, longest_request_tokens=700)
    default = space.space.default
    plan = make_plan(request)
    assert default.get(Knob.MAX_NUM_SEQS) == plan.knobs.max_num_seqs.value
    assert default.get(Knob.MAX_NUM_BATCHED_TOKENS) == plan.knobs.max_num_batched_tokens.value
    assert set(space.space.knobs) == {
        Knob.MAX_NUM_SEQS, Knob.MAX_NUM_BATCHED_TOKENS, Knob.MAX_MODEL_LEN,
    }  # fmt: skip
    check = space.space.check
    assert check(default) is None
    assert "vLLM refuses" in (check(default.with_value(Knob.MAX_NUM_BATCHED_TOKENS, 32)) or "")
    assert "longest request" in (check(default.with_value(Knob.MAX_MODEL_LEN, 512)) or "")
    assert any("fp8 KV" in note or "weights stay" in note for note in space.space.notes)
    fleet = space.fleet(default.with_value(Knob.MAX_NUM_SEQS, 32))
    assert fleet.engine.max_num_seqs == 32 and fleet.replicas.count == 1


def test_gpu_space_splits_the_devices_between_tp_and_replicas() -> None:
    config = FleetConfig.model_validate(
        {"model": {"source": "llama-3.1-8b"},
         "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8}}
    )  # fmt: skip
    space = build_space(
        config, _request(config, "llama-3.1-8b", "h100-80", 8), longest_request_tokens=3000
    )
    tp = space.space.axis(Knob.TENSOR_PARALLEL_SIZE)
    assert tp is not None and set(tp.values) >= {1, 2, 4, 8}
    assert space.space.axis(Knob.KV_CACHE_DTYPE) is not None
    assert space.space.axis(Knob.WEIGHTS_DTYPE) is not None  # online fp8 on H100
    fleet = space.fleet(space.space.default.with_value(Knob.TENSOR_PARALLEL_SIZE, 2))
    assert (fleet.engine.tensor_parallel_size, fleet.replicas.count) == (2, 4)
    fp8 = space.fleet(space.space.default.with_value(Knob.WEIGHTS_DTYPE, "fp8"))
    assert fp8.engine.quantization == "fp8"


def test_gpu_space_never_fits_a_model_too_big_for_one_device() -> None:
    config = FleetConfig.model_validate(
        {"model": {"source": "llama-3.1-70b"},
         "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8}}
    )  # fmt: skip
    space = build_space(
        config, _request(config, "llama-3.1-70b", "h100-80", 8), longest_request_tokens=3000
    )
    one = space.space.default.with_value(Knob.TENSOR_PARALLEL_SIZE, 1)
    assert "does not fit" in (space.space.check(one) or "")


# ---- the outputs ------------------------------------------------------------------------


def test_report_is_self_contained_and_escapes_what_comes_from_outside() -> None:
    from servepilot.tune.policy import Stop, StopReason
    from servepilot.tune.report_html import render_report
    from servepilot.tune.summary import summarize

    sla = parse_slo("ttft_p99_ms=1000")
    config = TrialConfig.of({Knob.MAX_NUM_SEQS: 8})
    ok = Trial(1, config, Measurement((run(4, 2.0),), 8, 0, None, 0.0), 1.0, "<b>default</b>")
    bad = Failure(FailureCause.CRASHED, "<script>alert(1)</script>")
    crashed = Trial(2, config.with_value(Knob.MAX_NUM_SEQS, 16), bad, 1.0, "raise")
    summary = summarize([ok, crashed], sla, config, Stop(StopReason.BUDGET, "spent"))
    html = render_report(summary, title="m", context={"SLA": sla.describe()},
                         fleet_yaml="engine: {}", command="python -m x")  # fmt: skip
    assert "<script" not in html and "&lt;script&gt;" in html and "&lt;b&gt;" in html
    assert "best configuration" in html and "failed: crashed" in html and "<svg" in html


def test_vllm_command_is_rendered_by_the_engine_flags_code() -> None:
    from servepilot.tune.artifacts import fleet_command as vllm_command

    config = FleetConfig().with_overrides(
        {"engine.max_num_seqs": 24, "engine.max_num_batched_tokens": 4096, "engine.kind": "sim"}
    )
    command = vllm_command(config)
    assert "vllm.entrypoints.openai.api_server" in command
    assert "--max-num-seqs 24" in command and "--max-num-batched-tokens 4096" in command
    gpu = FleetConfig.model_validate(
        {"model": {"source": "llama-3.1-8b"},
         "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8},
         "engine": {"tensor_parallel_size": 2}}
    )  # fmt: skip
    assert vllm_command(gpu).startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct ")
    assert "--tensor-parallel-size 2" in vllm_command(gpu)


def test_a_trials_preemptions_are_read_in_every_naming() -> None:
    pages = Path(__file__).parent.parent / "fixtures" / "metrics"
    # Seven preemptions on each page; Ray's gauge copy of the counter is not added to it.
    for naming in ("vllm_legacy", "vllm_current", "ray_vllm"):
        assert _count((pages / f"{naming}.txt").read_text()) == 7
    assert _count("<html>not metrics</html>\n{{{") == 0


@pytest.mark.parametrize("trials", [1, 2, 3])
def test_the_reports_trial_axis_ticks_whole_trials(trials: int) -> None:
    import re

    from servepilot.tune.policy import Stop, StopReason
    from servepilot.tune.report_html import render_report
    from servepilot.tune.summary import summarize

    config = TrialConfig.of({Knob.MAX_NUM_SEQS: 8})
    done = [
        Trial(i, config.with_value(Knob.MAX_NUM_SEQS, 8 * i),
              Measurement((run(4, 2.0),), 8, 0, None, 0.0), 1.0, "step")
        for i in range(1, trials + 1)
    ]  # fmt: skip
    summary = summarize(done, parse_slo("ttft_p99_ms=1000"), config, Stop(StopReason.BUDGET, "x"))
    html = render_report(summary, title="m", context={}, fleet_yaml="", command="")
    # The x axis's labels are the only centred text of the chart.
    ticks = re.findall(r'text-anchor="middle">([^<]*)</text>', html)
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
