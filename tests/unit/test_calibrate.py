"""`servepilot calibrate` without a server: probe records -> step samples -> fit, the plan,
and the table (servers that cannot be calibrated: test_calibrate_servers.py).

Probe records are synthesized by the replica simulator (servepilot.sim.ReplicaModel) with a
known cost model, so a sample's shape is checked against the simulator's own definition of a
step: the fitted model must give back the coefficients the records were made with.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from servepilot.bench.records import RequestRecord
from servepilot.calibrate.fit import Fit, coefficient_table, fit_errors, robust_fit, sample_table
from servepilot.calibrate.probe import (
    KV_SHARE,
    PREFILL_LENGTHS,
    TEMPLATE_ROOM,
    WAVES,
    Limits,
    make_plan,
)
from servepilot.calibrate.samples import (
    Injection,
    ProbeKind,
    ProbeSample,
    prefill_sample,
    wave_samples,
)
from servepilot.cli.console import draw
from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import CostModel, StepShape, fit_cost_model, prefill_pairs
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest

KNOWN = CostModel(
    base_s=0.020,
    per_prefill_token_s=0.0004,
    per_prefill_seq_s=0.003,
    per_decode_seq_s=0.0015,
    per_context_token_s=2e-6,
    per_prefill_pair_s=3e-9,
    source="test",
)


# ---- synthetic probes, timed by the replica simulator ----------------------------------


@dataclass
class Engine:
    """One simulated engine; every request's tokens as (step index) lists, so that step
    durations can be perturbed afterwards."""

    cost: CostModel
    noise: float = 0.0
    seed: int = 0
    durations: list[float] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)
    """Request id -> the step count when it was added (it is sent as that step ends)."""

    def __post_init__(self) -> None:
        config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                 max_model_len=4096, block_size=16, num_blocks=20_000,
                                 enable_prefix_caching=False)  # fmt: skip
        self.replica = ReplicaModel(config, self.cost)
        self.now = 0.0
        self.next_id = 0

    def add(self, prompt: int, output: int) -> int:
        rid, self.next_id = self.next_id, self.next_id + 1
        self.replica.add(SimRequest(rid, prompt, output, self.now))
        self.tokens[rid] = []
        self.sent[rid] = len(self.durations)
        return rid

    def step(self) -> bool:
        result = self.replica.step(self.now)
        if result is None:
            return False
        self.durations.append(result.duration_s)
        self.now = result.start_s + result.duration_s
        for rid in self.replica.last_step_token_ids(result):
            self.tokens[rid].append(len(self.durations) - 1)
        return True

    def record(self, rid: int, prompt: int, output: int) -> RequestRecord:
        rng = random.Random(self.seed)
        ends, t = [], 0.0
        for d in self.durations:
            t += d * (1 + rng.uniform(-self.noise, self.noise))
            ends.append(t)
        sent = ends[self.sent[rid] - 1] if self.sent[rid] else 0.0
        chunks = tuple(ends[i] for i in self.tokens[rid])
        return RequestRecord(index=rid, intended_s=sent, sent_s=sent, chunk_s=chunks,
                             end_s=chunks[-1], input_tokens=prompt,
                             output_tokens=output)  # fmt: skip


def prefill_probe(prompt: int) -> ProbeSample:
    engine = Engine(KNOWN)
    rid = engine.add(prompt, 1)
    while engine.step():
        pass
    sample = prefill_sample(engine.record(rid, prompt, 1))
    assert sample is not None
    return sample


def wave(
    decoders: int, prompt: int, output: int, injected: Sequence[int], *, noise: float = 0.0
) -> tuple[list[RequestRecord], list[Injection]]:
    """Decoders sent together; each injection once all decode, 3 steps after the last."""
    engine = Engine(KNOWN, noise=noise, seed=decoders * 1000 + prompt)
    ids = [engine.add(prompt, output) for _ in range(decoders)]
    pending, injections, quiet = list(injected), [], 0
    while True:
        decoding = all(len(engine.tokens[i]) >= 2 for i in ids)
        if pending and decoding and quiet >= 3:
            injections.append((engine.add(pending[0], 1), pending.pop(0)))
            quiet = 0
        if not engine.step():
            break
        quiet += 1
    records = [engine.record(i, prompt, output) for i in ids]
    return records, [Injection(engine.record(i, n, 1)) for i, n in injections]


def assert_exact(samples: Sequence[ProbeSample], model: CostModel, rel: float = 1e-3) -> None:
    for s in samples:
        assert model.step_time_s(s.shape) == pytest.approx(s.seconds, rel=rel), s


# ---- samples ----------------------------------------------------------------------------


def test_a_lone_prefill_is_one_step_of_its_prompt() -> None:
    sample = prefill_probe(300)
    assert sample.kind is ProbeKind.PREFILL
    assert sample.shape == StepShape(300, 1, 0, 0, prefill_pairs(300, 0))
    assert sample.seconds == pytest.approx(KNOWN.step_time_s(sample.shape))


def test_wave_steps_have_the_shapes_the_simulator_times() -> None:
    records, injections = wave(4, 200, 40, (64, 512))
    samples = wave_samples(records, injections)
    kinds = [s.kind for s in samples]
    assert kinds.count(ProbeKind.MIXED) == 2
    assert kinds.count(ProbeKind.DECODE) >= 3
    assert all(s.shape.decode_seqs == 4 for s in samples)
    mixed = [s.shape for s in samples if s.kind is ProbeKind.MIXED]
    assert [m.prefill_tokens for m in mixed] == [64, 512]
    assert all(m.context_tokens > 4 * 200 for m in mixed)
    assert_exact(samples, KNOWN)


def test_a_decoder_that_prefilled_in_another_step_does_not_break_the_wave() -> None:
    # 16 x 300 tokens do not fit one step's 2,048: the prefills are chunked over 3 steps and
    # the decoders start decoding at different steps; only steps of all 16 count.
    records, injections = wave(16, 300, 32, (128,))
    samples = wave_samples(records, injections)
    assert samples and all(s.shape.decode_seqs == 16 for s in samples)
    assert_exact(samples, KNOWN)


def test_a_stream_with_two_tokens_in_one_chunk_is_outvoted() -> None:
    records, injections = wave(4, 64, 40, (256,))
    merged = records[1]
    chunks = merged.chunk_s[:10] + merged.chunk_s[11:]  # token 11 arrived with token 12
    records[1] = RequestRecord(index=merged.index, intended_s=0.0, sent_s=0.0, chunk_s=chunks,
                               end_s=chunks[-1], input_tokens=64, output_tokens=40)  # fmt: skip
    assert_exact(wave_samples(records, injections), KNOWN, rel=2e-2)


def test_a_failed_decoder_voids_the_wave() -> None:
    records, _ = wave(2, 64, 24, ())
    records[0] = RequestRecord(index=0, intended_s=0.0, sent_s=0.0, error="http_500")
    assert wave_samples(records) == []


def test_the_fit_gives_back_the_coefficients_the_probes_were_made_with() -> None:
    samples = [prefill_probe(n) for n in PREFILL_LENGTHS]
    for decoders, prompt, output, injected in WAVES:
        records, injections = wave(decoders, prompt, output, injected)
        samples += wave_samples(records, injections)
    fitted = fit_cost_model([(s.shape, s.seconds) for s in samples], source="t")
    assert fitted.coefficients == pytest.approx(KNOWN.coefficients, rel=2e-3)
    assert fit_errors(samples, fitted)["all"]["p90_pct"] < 0.1


def test_noisy_steps_are_fitted_within_the_noise() -> None:
    samples = [prefill_probe(n) for n in PREFILL_LENGTHS]
    for decoders, prompt, output, injected in WAVES:
        records, injections = wave(decoders, prompt, output, injected, noise=0.05)
        samples += wave_samples(records, injections)
    fitted = fit_cost_model([(s.shape, s.seconds) for s in samples], source="t")
    # The terms that set most of a step's time come back within a few percent.
    assert fitted.base_s == pytest.approx(KNOWN.base_s, rel=0.05)
    assert fitted.per_prefill_token_s == pytest.approx(KNOWN.per_prefill_token_s, rel=0.05)
    assert fitted.per_decode_seq_s == pytest.approx(KNOWN.per_decode_seq_s, rel=0.15)


def test_prefill_sample_prefers_the_engines_own_time() -> None:
    record = RequestRecord(index=0, intended_s=0.0, sent_s=0.0, chunk_s=(0.5,), end_s=0.5,
                           input_tokens=100, output_tokens=1)  # fmt: skip
    assert prefill_sample(record, engine_s=0.48) == ProbeSample(
        ProbeKind.PREFILL, StepShape(100, 1, 0, 0, 5050), 0.48
    )
    assert prefill_sample(record, engine_s=0.6).seconds == 0.5  # type: ignore[union-attr]
    cached = prefill_sample(record, cached_tokens=64)
    assert cached is not None and cached.shape == StepShape(36, 1, 0, 64, prefill_pairs(36, 64))


def test_an_answer_without_text_still_timed_its_step() -> None:
    empty = RequestRecord(index=0, intended_s=0.0, sent_s=0.0, end_s=0.5, input_tokens=100,
                          output_tokens=1, error="no_content")  # fmt: skip
    assert prefill_sample(empty) is None
    sample = prefill_sample(empty, engine_s=0.45)
    assert sample is not None and sample.seconds == 0.45
    failed = RequestRecord(index=0, intended_s=0.0, sent_s=0.0, error="http_500")
    assert prefill_sample(failed, engine_s=0.45) is None


# ---- plan -------------------------------------------------------------------------------


def test_the_plan_fits_the_servers_limits() -> None:
    limits = Limits(max_num_batched_tokens=256, max_model_len=512, kv_tokens=2000,
                    max_prompt_tokens=1024)  # fmt: skip
    plan = make_plan(limits, quick=False)
    # Room for a chat template's tokens is left in every limit.
    assert max(plan.prefill_lengths) == 256 - TEMPLATE_ROOM
    assert len(plan.prefill_lengths) == 2 * len(set(plan.prefill_lengths))
    for w in plan.waves:
        assert w.prompt_tokens + TEMPLATE_ROOM + w.output_tokens <= 512
        sequence = w.prompt_tokens + TEMPLATE_ROOM + w.output_tokens
        assert w.decoders * sequence <= KV_SHARE * 2000
        assert all(n + TEMPLATE_ROOM <= 256 - w.decoders for n in w.injections)


def test_quick_is_a_smaller_plan() -> None:
    limits = Limits(2048, 2048, None, 1024)
    assert make_plan(limits, quick=True).items < make_plan(limits, quick=False).items


def test_a_prompt_cap_below_two_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match="--max-prompt-tokens"):
        make_plan(Limits(2048, 2048, None, 1), quick=True)
    with pytest.raises(ConfigError, match="too small"):
        make_plan(Limits(2048, TEMPLATE_ROOM, None, 1024), quick=True)


# ---- table ------------------------------------------------------------------------------


def test_the_table_shows_measured_fitted_and_error() -> None:
    samples = [
        ProbeSample(ProbeKind.PREFILL, StepShape(100, 1, 0, 0, 5050), 0.063 + 5050 * 3e-9),
        ProbeSample(ProbeKind.DECODE, StepShape(0, 0, 8, 800, 0), 0.0316, steps=8),
    ]
    rows = sample_table(Fit(KNOWN, tuple(samples), ()))
    prefill, decode = rows.rows
    # 20 + 100 x 0.4 + 3 + 5,050 pairs x 3e-6 = 63.015 ms: exact.
    assert prefill == ("prefill 100", "100", "1", "0", "0", "1", "63.0", "63.0", "+0.0")
    # 20 + 8 x 1.5 + 800 x 0.002 = 33.6 ms against 31.6 measured: +6.3%.
    assert decode == ("decode 8 seqs", "0", "0", "8", "800", "8", "31.6", "33.6", "+6.3")
    assert len(rows.columns) == len(prefill)
    console = Console(record=True, width=200)
    console.print(draw(rows))
    console.print(draw(coefficient_table(KNOWN)))
    text = console.export_text()
    assert "prefill 100" in text and "+6.3" in text
    assert "base_s" in text and "20.000 ms" in text
    errors = fit_errors(samples, KNOWN)
    assert errors["prefill"]["median_pct"] == 0.0
    assert errors["decode"]["median_pct"] == pytest.approx(6.33, abs=0.01)


def test_a_step_slowed_by_something_else_is_left_out() -> None:
    samples = [prefill_probe(n) for n in PREFILL_LENGTHS]
    records, injections = wave(4, 200, 40, (64, 512))
    samples += wave_samples(records, injections)
    records, injections = wave(16, 100, 40, (256,))
    samples += wave_samples(records, injections)
    slowed = samples[3]
    samples[3] = ProbeSample(slowed.kind, slowed.shape, slowed.seconds * 1.6)
    fit = robust_fit(samples, source="t")
    assert fit.outliers == (samples[3],)
    assert fit.model.coefficients == pytest.approx(KNOWN.coefficients, rel=1e-2)
    left_out = [row for row in sample_table(fit).rows if row[-1].endswith(" left out")]
    assert [row[0] for row in left_out] == [samples[3].label]
    assert robust_fit(samples[:3] + samples[4:], source="t").outliers == ()
