"""A calibration from request to profile: describe the server, plan and make the probes, send
them, fit the cost model, write the profile. What the user sees goes through a
`CalibrationView` (the CLI draws it with rich); nothing here prints."""

from __future__ import annotations

import datetime
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servepilot.bench.client import Target
from servepilot.bench.records import Endpoint
from servepilot.bench.token_spread import us_per_token
from servepilot.bench.tokenizer import ServerTokenizer
from servepilot.calibrate.fit import Fit, fit_errors, robust_fit
from servepilot.calibrate.probe import Limits, ProbePlan, Prober, ProbeRun, make_plan, make_prompts
from servepilot.calibrate.samples import ProbeSample
from servepilot.calibrate.server import ServerFacts, server_facts
from servepilot.core import loop
from servepilot.core.config import Device
from servepilot.core.errors import ConfigError, EngineError
from servepilot.core.vllm_defaults import vllm_defaults
from servepilot.plan.costprofile import save_profile

DEFAULT_BATCHED_TOKENS = vllm_defaults(Device.CPU, 0).max_num_batched_tokens
"""vLLM's max_num_batched_tokens for its OpenAI server on CPU, and the smallest default
elsewhere: probes stay within it, so a server with a larger budget is probed correctly too."""
MAX_FAILED_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class CalibrationRequest:
    """What to calibrate and how; refused (ConfigError, naming the flag) when out of range."""

    url: str
    """The replica's root URL, e.g. http://127.0.0.1:8000."""
    out: Path
    """The profile to write."""
    model: str | None = None
    """None: the server's only model."""
    max_num_batched_tokens: int | None = None
    """The replica's step token budget; None: `DEFAULT_BATCHED_TOKENS`, assumed."""
    max_prompt_tokens: int = 1024
    quick: bool = False
    endpoint: Endpoint = Endpoint.CHAT
    api_key: str | None = None
    seed: int | None = None
    """Prompt seed; None: a new one, so that no earlier prompt is in the prefix cache."""
    timeout_s: float = 600.0
    """Per request."""

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 2:
            raise ConfigError(
                f"--max-num-batched-tokens must be at least 2, got {self.max_num_batched_tokens}"
            )
        if self.max_prompt_tokens < 2:
            raise ConfigError(
                f"--max-prompt-tokens must be at least 2, got {self.max_prompt_tokens}"
            )
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout must be above 0 s, got {self.timeout_s}")


@dataclass(frozen=True, slots=True)
class Calibration:
    fit: Fit
    meta: Mapping[str, Any]
    """What was measured, as the profile records it (`profile_meta`, and `probe_seconds`)."""

    def overheads(self) -> str:
        """What a request costs besides its engine steps, in a sentence."""
        overhead = self.meta["request_overhead_ms"]
        tokens = self.meta["prompt_overhead_tokens"]
        text = f"{self.meta['endpoint']} adds {tokens} tokens to every prompt; "
        if overhead is None:
            return text + "the server does not time requests itself: TTFT is taken as the step"
        text += (
            f"a request spends {overhead:.1f} ms outside the engine (median TTFT minus "
            "vLLM's own prefill time; not part of the step times)"
        )
        streaming = self.meta.get("output_us_per_token")
        if streaming is not None:
            text += f"; the API server streams a token in {streaming:.1f} us"
        return text


class CalibrationView(Protocol):
    """What the user is shown while a calibration runs."""

    def step(self, message: str) -> None: ...

    def warning(self, message: str) -> None: ...

    def probing(self, probes: int) -> AbstractContextManager[Callable[[str], None]]:
        """Around the probes; the callable is given each probe's label as it starts."""
        ...

    def fitted(self, calibration: Calibration) -> None:
        """The fit, before its profile is written."""
        ...


def calibrate(request: CalibrationRequest, view: CalibrationView) -> Calibration:
    """Probe the replica, fit the cost model and write the profile to `request.out`."""
    check_writable(request.out)
    facts = server_facts(request.url, request.model, request.api_key)
    limits = Limits(
        max_num_batched_tokens=request.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS,
        max_model_len=facts.max_model_len,
        kv_tokens=facts.kv_tokens,
        max_prompt_tokens=request.max_prompt_tokens,
    )
    plan = make_plan(limits, quick=request.quick)
    seed = request.seed if request.seed is not None else random.SystemRandom().randrange(2**31)
    view.step(f"making {_prompt_count(plan)} prompts with {request.url}/tokenize")
    prompts = make_prompts(plan, ServerTokenizer(request.url, facts.model), seed)
    started = time.monotonic()
    with view.probing(plan.items) as on_item:
        prober = Prober(_target(request, facts), on_item)
        probes = loop.run(prober.probe(plan, prompts))
    _check_failures(probes, request.url, view)
    fit = _fit(probes.samples, request.url)
    meta = profile_meta(facts, request, limits, probes, fit, seed=seed)
    meta["probe_seconds"] = round(time.monotonic() - started, 1)
    calibration = Calibration(fit, meta)
    view.fitted(calibration)
    save_profile(fit.model, request.out, meta=meta)
    return calibration


def check_writable(path: Path) -> None:
    """Before minutes of probing, not after: the profile can be written where asked."""
    if path.is_dir():
        raise ConfigError(f"--out {path}: is a folder; name the profile file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(path.name + ".tmp")
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write there ({exc.strerror})") from None


def _target(request: CalibrationRequest, facts: ServerFacts) -> Target:
    return Target(
        base_url=request.url,
        model=facts.model,
        endpoint=request.endpoint,
        api_key=request.api_key,
        timeout_s=request.timeout_s,
    )


def _prompt_count(plan: ProbePlan) -> int:
    waves = sum(w.decoders + len(w.injections) for w in plan.waves)
    return len(plan.prefill_lengths) + waves


def _check_failures(probes: ProbeRun, root: str, view: CalibrationView) -> None:
    if not probes.failures:
        return
    first = probes.failures[0]
    if len(probes.failures) > MAX_FAILED_SHARE * max(probes.requests, 1):
        raise EngineError(
            f"{len(probes.failures)} of {probes.requests} probe requests to {root} failed "
            f"(first: {first})",
            hint="calibrate a healthy replica that nothing else is using",
        )
    view.warning(f"{len(probes.failures)} probe requests failed and were left out ({first})")


def _fit(samples: Sequence[ProbeSample], root: str) -> Fit:
    try:
        return robust_fit(samples, source=f"calibrated: {root} {_now()}")
    except ValueError as exc:
        raise EngineError(
            f"the probes of {root} cannot be fitted: {exc}",
            hint="was something else sending requests to the replica? try again without --quick",
        ) from None


def streaming_meta(spreads_s: Sequence[float]) -> dict[str, float]:
    """The API server's time per streamed token (meta `output_us_per_token`): the median over
    the larger waves' full steps of the time between their tokens' arrivals."""
    streaming = us_per_token(spreads_s)
    return {} if streaming is None else {"output_us_per_token": streaming}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def profile_meta(
    facts: ServerFacts,
    request: CalibrationRequest,
    limits: Limits,
    probes: ProbeRun,
    fit: Fit,
    *,
    seed: int,
) -> dict[str, Any]:
    """What was measured, for the profile file: the server, its knobs, the probes, the fit."""
    counts: dict[str, int] = {}
    for s in fit.kept:
        counts[s.kind.value] = counts.get(s.kind.value, 0) + 1
    overhead = statistics.median(probes.overheads_s) if probes.overheads_s else None
    prompt_overhead = (
        round(statistics.median(probes.prompt_overheads)) if probes.prompt_overheads else 0
    )
    return {
        "url": facts.url,
        "model": facts.model,
        "date": _now(),
        "vllm_version": facts.version,
        "endpoint": request.endpoint.value,
        "prompt_overhead_tokens": prompt_overhead,
        "request_overhead_ms": None if overhead is None else round(overhead * 1000, 2),
        # Omitted, not 0, when no wave was large enough to read it: the simulator then
        # streams at no cost, as before this was measured.
        **streaming_meta(probes.stream_spreads_s),
        "server": {
            "max_model_len": facts.max_model_len,
            "block_size": facts.block_size,
            "num_blocks": facts.num_blocks,
            "enable_prefix_caching": facts.prefix_caching,
            "max_num_batched_tokens": limits.max_num_batched_tokens,
            "max_num_batched_tokens_assumed": request.max_num_batched_tokens is None,
        },
        "probes": {
            "quick": request.quick,
            "requests": probes.requests,
            "failed": len(probes.failures),
            "samples": counts,
            "outliers": len(fit.outliers),
            "max_prompt_tokens": request.max_prompt_tokens,
            "seed": seed,
        },
        "fit_error": fit_errors(fit.kept, fit.model),
    }
