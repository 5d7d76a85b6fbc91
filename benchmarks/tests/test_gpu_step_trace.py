import gzip
import json
from pathlib import Path

import pytest

from benchmarks.gpu_step_report import attention_fit, level_row
from benchmarks.gpu_step_trace import reduce_trace
from servepilot.plan.costmodel import StepShape, prefill_pairs
from servepilot.plan.gpu_profile.compose import StepComposer
from servepilot.plan.gpu_profile.table import load_gpu_profile

RUNS = Path(__file__).parents[1] / "gpu_runs"


def test_a_trace_is_reduced_to_kernels_by_shape_and_steps(tmp_path: Path) -> None:
    """Two engine steps of 4 decoders: a GEMM twice a step at one grid, once at another, and
    a norm; 10 us between the steps."""
    step = "execute_context_0(0)_generation_4(4)"
    events = []
    for t0 in (0.0, 100.0):
        graph = {"correlation": int(t0) + 7}
        events.append({"cat": "user_annotation", "name": step, "ts": t0, "dur": 80.0})
        events += [
            {"cat": "kernel", "name": "gemm", "ts": t0 + 1, "dur": 30.0,
             "args": {"grid": [4, 1], **graph}},
            {"cat": "kernel", "name": "gemm", "ts": t0 + 31, "dur": 30.0,
             "args": {"grid": [4, 1], **graph}},
            {"cat": "kernel", "name": "gemm", "ts": t0 + 61, "dur": 20.0,
             "args": {"grid": [8, 1], **graph}},
            {"cat": "kernel", "name": "rms_norm", "ts": t0 + 81, "dur": 9.0, "args": graph},
            {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t0, "dur": 1.0,
             "args": graph},
        ]  # fmt: skip
    # A kernel launched outside any step (a warm-up's) belongs to none.
    events.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 95.0, "dur": 1.0,
                   "args": {"correlation": 3}})  # fmt: skip
    events.append({"cat": "kernel", "name": "copy", "ts": 96.0, "dur": 2.0,
                   "args": {"correlation": 3}})  # fmt: skip
    path = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    reduced = reduce_trace(path)
    assert reduced["steps"] == 2 and reduced["graph_launches"] == 2
    assert reduced["kernel_us"] == 2 * (30 + 30 + 20 + 9) + 2
    assert reduced["span_us"] == 100 + 81 + 9 - 1  # first kernel at 1, last ends at 190
    # Each step's own 4 kernels: 89 us, from 1 us after its launch to 90 us after it.
    assert reduced["step_gpu"] == [[0.089, 0.001, 0.09, 4], [0.089, 0.101, 0.19, 4]]
    by_shape = {(k["name"], k["grid"]): (k["count"], k["us"]) for k in reduced["kernels"]}
    assert by_shape == {("gemm", "4x1"): (4, 120.0), ("gemm", "8x1"): (2, 40.0),
                        ("rms_norm", ""): (2, 18.0), ("copy", ""): (1, 2.0)}  # fmt: skip
    assert reduced["step_timeline"] == [[0.0, 0.08, step], [0.1, 0.08, step]]


def test_the_recorded_decode_steps_are_what_the_profile_composes() -> None:
    """The seventh loan's Llama-3.1-8B traces (H100): the composed decode step within 5% of
    the span vLLM's steps took, at 1 to 256 decoders."""
    profile = load_gpu_profile(
        RUNS / "2026-12-06-sim-validate-h100-cold/profiles/h100-llama-3.1-8b-bf16.json"
    )
    composer = StepComposer(profile, 0.0, 0.0, profile.step_overhead_s or 0.0)
    folder = RUNS / "2026-12-06-step-trace-h100/llama-8b"
    rows = {}
    for path in folder.glob("c*/step.json"):
        row = level_row(json.loads(path.read_text()), composer)
        rows[row["decoders"]] = row
    assert sorted(rows) == [1, 4, 16, 64, 256]
    assert rows[16]["span_ms"] == pytest.approx(7.33, abs=0.005)
    for row in rows.values():
        assert abs(row["step_ms"] / row["span_ms"] - 1) < 0.05


def test_a_burst_is_cut_into_the_steps_vllm_ran_and_composed_within_six_percent() -> None:
    """The eighth loan's bursts (Llama-3.1-8B, H100, 1,000-token prompts, profiled from the
    first step): 64 prompts took 9 steps of up to 8,192 tokens, the first with the 2 prompts
    that had reached the engine; vLLM's 9 prefill steps took 1,485 ms, the composition
    1,428."""
    from benchmarks.gpu_step_report import burst_row

    profile = load_gpu_profile(
        RUNS / "2026-12-06-sim-validate-h100-padded/profiles/h100-llama-3.1-8b-bf16.json"
    )
    composer = StepComposer(profile, 0.0, 0.0, profile.step_overhead_s or 0.0)
    folder = RUNS / "2026-12-06-step-trace-h100-burst/llama-8b"
    rows = {n: burst_row(json.loads((folder / f"c{n}/step.json").read_text()), composer)
            for n in (16, 64, 256)}  # fmt: skip
    burst = rows[64]
    assert (burst["prefill_steps"], burst["first_step_seqs"]) == (9, 2)
    assert burst["prefill_tokens"] == 62_976  # the prompts with their chat template
    assert burst["measured_ms"] == pytest.approx(1485.098)
    assert [rows[n]["prefill_steps"] for n in (16, 256)] == [3, 32]
    for row in rows.values():
        assert abs(row["composed_ms"] / row["measured_ms"] - 1) < 0.06


def test_deepseeks_eager_step_is_its_hosts_first_step_less_the_profilers_share() -> None:
    """The ninth loan's DeepSeek-V2-Lite bursts (H100, two engines): each burst's first step,
    run without a CUDA graph, took 70.3-76.4 ms on the engine's CPU with 20-40 ms of kernels;
    the profiler added 15.0 ms to the one-prompt burst's TTFT (85.9 traced against 70.9 ms
    untraced on the same engine). Llama-3.1-8B traced no one-prompt burst: its first steps
    are taken as they are (an upper bound, and below its GPU's time)."""
    from benchmarks.gpu_step_report import eager_step_ms, profiler_ms

    deepseek = [RUNS / f"2026-12-06-step-trace-h100-burst-deepseek{n}/deepseek-v2-lite"
                for n in ("", "2")]  # fmt: skip
    assert profiler_ms(deepseek) == pytest.approx(85.89 - 70.92, abs=0.01)
    # The median of 70.35, 70.60, 73.87 and 76.38 ms, less the profiler's 14.97.
    assert eager_step_ms(deepseek) == pytest.approx((70.604 + 73.869) / 2 - 14.969, abs=0.01)
    llama = [RUNS / "2026-12-06-step-trace-h100-burst/llama-8b"]
    assert profiler_ms(llama) is None
    assert eager_step_ms(llama) == pytest.approx(26.332)  # 22.7, 26.3 and 33.8 ms
    # With decoders: DeepSeek's 79.11, 81.89 and 95.31 ms (one step of 1 prompt and 3
    # decoders, two of a 16-prompt burst), less the profiler's 14.97.
    assert eager_step_ms(deepseek, mixed=True) == pytest.approx(81.894 - 14.969, abs=0.01)
    # Llama's 41 such steps (33 of 18-37 ms, and eight spans of the host waiting for its
    # GPU, 190-383 ms): their median.
    assert eager_step_ms(llama, mixed=True) == pytest.approx(21.487)


def test_a_deepseek_burst_composes_to_its_eager_steps() -> None:
    """With the eager floor a one-prompt DeepSeek burst composes to the floor (its 984 tokens'
    operators alone take about a third of it); the traced step, profiler included, took 75."""
    from benchmarks.gpu_step_report import burst_row

    profile = load_gpu_profile(
        RUNS / "2026-12-06-sim-validate-h100-padded/profiles/h100-deepseek-v2-lite-bf16.json"
    )
    assert profile.eager_step_s == pytest.approx(0.0573, abs=1e-4)
    composer = StepComposer(profile, 0.0, 0.0, profile.step_overhead_s or 0.0)
    folder = RUNS / "2026-12-06-step-trace-h100-burst-deepseek/deepseek-v2-lite"
    row = burst_row(json.loads((folder / "c1/step.json").read_text()), composer)
    assert (row["prefill_steps"], row["prefill_tokens"]) == (1, 984)
    assert row["composed_ms"] == pytest.approx(57.3, abs=0.1)
    assert row["first_step_host_ms"] == pytest.approx(70.604)
    # The composer itself has no floor (the simulator's CostModel has): the operators alone.
    assert composer.step_time_s(StepShape(984, 1, 0, 0, prefill_pairs(984, 0))) < 0.5 * 0.0573


def test_vllms_decode_attention_against_the_operators_on_the_recorded_traces() -> None:
    """The seventh loan's decode traces at 1-256 decoders: DeepSeek-V2-Lite's MLA, composed as
    two GEMMs around a softmax (the latent cache read twice), ran about half as long in vLLM's
    fused kernel beyond a fixed part; Llama-3.1-8B's GQA within 10% of SDPA's, plus about
    0.1 ms a step."""
    fits = {}
    for config, model in (("deepseek-v2-lite", "deepseek-v2-lite"), ("llama-8b", "llama-3.1-8b")):
        profile = load_gpu_profile(
            RUNS / f"2026-12-06-sim-validate-h100-cold/profiles/h100-{model}-bf16.json"
        )
        fits[config] = attention_fit([RUNS / "2026-12-06-step-trace-h100" / config], profile)
    fixed_us, scale = fits["deepseek-v2-lite"]
    assert 0.45 < scale < 0.6 and 100 < fixed_us < 400
    fixed_us, scale = fits["llama-8b"]
    assert 1.0 < scale < 1.1 and 50 < fixed_us < 250
    assert attention_fit([RUNS / "2026-12-06-step-trace-h100-burst-deepseek"], profile) is None


def _eager_burst(tmp_path: Path, steps: list[tuple[float, float, int, int, float]]) -> Path:
    """A burst's traced steps: (launch ms, host ms, prompts, decoders, GPU's last end ms)."""
    timeline = [[at, host, f"execute_context_{p}({p * 1000})_generation_{d}({d})"]
                for at, host, p, d, _ in steps]  # fmt: skip
    gpu = [[20.0, at + 1.0, end, 900] for at, _, _, _, end in steps]
    folder = tmp_path / "deepseek-v2-lite" / "c256"
    folder.mkdir(parents=True)
    step = {"profile_started_s": 0.0, "trace": {"step_timeline": timeline, "step_gpu": gpu}}
    (folder / "step.json").write_text(json.dumps(step))
    return folder.parent


def test_the_hosts_time_between_eager_launches_is_a_line_by_the_next_steps_sequences(
    tmp_path: Path,
) -> None:
    """Between two eager launches the host takes 4 ms and 25 us for each sequence the next
    step carries; read only after host-paced steps, and not after the burst's first."""
    from benchmarks.gpu_step_report import eager_host_fit

    def between(seqs: int) -> float:
        return 4.0 + 0.025 * seqs

    kinds = [(2, 0, False), (9, 10, False), (9, 50, True), (9, 100, False), (9, 200, False),
             (0, 256, False)]  # fmt: skip
    steps, at = [], 0.0
    for i, (prompts, decoders, gpu_bound) in enumerate(kinds):
        host = 50.0
        # A GPU-paced step's kernels ran 30 ms past its launch, and the host waited for them.
        waited = 30.0 if gpu_bound else 0.0
        steps.append((at, host, prompts, decoders, at + host + (waited or 0.5)))
        if i + 1 < len(kinds):
            first = 99.0 if i == 0 else 0.0  # the burst's first step: no outputs before it
            at += host + waited + first + between(kinds[i + 1][0] + kinds[i + 1][1])
    fit = eager_host_fit([_eager_burst(tmp_path, steps)])
    assert fit is not None
    assert fit == (pytest.approx(4.0), pytest.approx(25.0))


def test_deepseeks_host_between_eager_launches_on_the_recorded_burst() -> None:
    """The fourteenth loan's burst of 256 (DeepSeek-V2-Lite, H100): 31 host-paced mixed steps
    of 9-11 prompts beside 2-249 decoders, 3.8 ms and 24.7 us a sequence between launches."""
    from benchmarks.gpu_step_report import eager_host_fit

    folder = RUNS / "2026-12-07-step-trace-h100-burst-deepseek3/deepseek-v2-lite"
    fit = eager_host_fit([folder])
    assert fit is not None
    assert fit == (pytest.approx(3.80, abs=0.01), pytest.approx(24.7, abs=0.1))
    # The earlier loans' traces did not join kernels to their steps: nothing to read.
    earlier = RUNS / "2026-12-06-step-trace-h100-burst-deepseek2/deepseek-v2-lite"
    assert eager_host_fit([earlier]) is None
