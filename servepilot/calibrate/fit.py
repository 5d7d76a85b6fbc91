"""Fitting the probes' steps, and the rows that show how well the fit explains them (pure:
no I/O; the CLI draws the rows)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.calibrate.samples import ProbeKind, ProbeSample, relative_error
from servepilot.core.texttable import TextTable
from servepilot.plan.costmodel import COEFFICIENTS, CostModel, fit_cost_model

OUTLIER_SPREAD = 4.0
"""A sample is left out when its error lies this many robust standard deviations (1.4826 x
the median absolute deviation) from the median error..."""
OUTLIER_FLOOR = 0.15
"""...and at least this far (15%): a step slowed by something else running on the machine,
not a shape the linear model misses."""


@dataclass(frozen=True, slots=True)
class Fit:
    model: CostModel
    kept: tuple[ProbeSample, ...]
    outliers: tuple[ProbeSample, ...]
    """Samples left out of the second fit."""


def robust_fit(samples: Sequence[ProbeSample], *, source: str) -> Fit:
    """Fit every sample; set aside those far off the rest (by `OUTLIER_SPREAD` and
    `OUTLIER_FLOOR`); fit the others again. ValueError when the samples cannot be fitted."""
    first = fit_cost_model([(s.shape, s.seconds) for s in samples], source=source)
    errors = [relative_error(first.step_time_s(s.shape), s.seconds) for s in samples]
    center = statistics.median(errors)
    spread = 1.4826 * statistics.median(abs(e - center) for e in errors)
    limit = max(OUTLIER_SPREAD * spread, OUTLIER_FLOOR)
    far = [abs(e - center) > limit for e in errors]
    kept = tuple(s for s, out in zip(samples, far, strict=True) if not out)
    outliers = tuple(s for s, out in zip(samples, far, strict=True) if out)
    if not outliers:
        return Fit(first, tuple(samples), ())
    try:
        model = fit_cost_model([(s.shape, s.seconds) for s in kept], source=source)
    except ValueError:  # what is left no longer tells the terms apart: keep everything
        return Fit(first, tuple(samples), ())
    return Fit(model, kept, outliers)


def fit_errors(samples: Sequence[ProbeSample], model: CostModel) -> dict[str, dict[str, float]]:
    """Median and p90 absolute relative error (%) of the fit, per probe kind and overall."""
    groups: dict[str, list[float]] = {"all": []}
    for s in samples:
        error = abs(relative_error(model.step_time_s(s.shape), s.seconds)) * 100
        groups.setdefault(s.kind.value, []).append(error)
        groups["all"].append(error)
    return {
        kind: {"median_pct": round(statistics.median(e), 2), "p90_pct": round(p90(e), 2)}
        for kind, e in groups.items()
        if e
    }


def p90(values: Sequence[float]) -> float:
    """The 90th percentile, interpolated linearly (numpy's default)."""
    ordered = sorted(values)
    at = 0.9 * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


SAMPLE_COLUMNS = ("probe", "prefill tok", "prefill seqs", "decode seqs", "context tok",
                  "steps", "measured ms", "fitted ms", "error %")  # fmt: skip


def sample_table(fit: Fit) -> TextTable:
    """One row per sample: its shape, the measured and the fitted time, the error; samples
    left out of the fit say so."""
    samples = sorted((*fit.kept, *fit.outliers), key=_order)
    rows = tuple(_sample_row(s, fit) for s in samples)
    return TextTable("probes", SAMPLE_COLUMNS, rows, right=SAMPLE_COLUMNS[1:])


def _sample_row(sample: ProbeSample, fit: Fit) -> tuple[str, ...]:
    fitted = fit.model.step_time_s(sample.shape)
    shape = sample.shape
    error = f"{100 * relative_error(fitted, sample.seconds):+.1f}"
    return (
        sample.label,
        str(shape.prefill_tokens),
        str(shape.prefill_seqs),
        str(shape.decode_seqs),
        str(shape.context_tokens),
        str(sample.steps),
        f"{sample.seconds * 1000:.1f}",
        f"{fitted * 1000:.1f}",
        error + " left out" if sample in fit.outliers else error,
    )


def _order(sample: ProbeSample) -> tuple[int, int, int, int]:
    kinds = list(ProbeKind)
    s = sample.shape
    return kinds.index(sample.kind), s.decode_seqs, s.prefill_tokens, s.context_tokens


def coefficient_table(model: CostModel) -> TextTable:
    """One row per coefficient: its name and its time."""
    values = zip(COEFFICIENTS, model.coefficients, strict=True)
    rows = tuple((n, _time(v)) for n, v in values)
    return TextTable("fitted", ("coefficient", "value"), rows, right=("value",))


def _time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.3f} us"
