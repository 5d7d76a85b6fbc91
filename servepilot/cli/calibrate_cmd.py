"""`servepilot calibrate`: fit the step-time cost model to measurements of a real replica."""

from __future__ import annotations

import argparse
import datetime
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from servepilot.bench.client import Target
from servepilot.bench.records import Endpoint
from servepilot.bench.tokenizer import ServerTokenizer
from servepilot.calibrate.fit import (
    Fit,
    fit_errors,
    render_coefficients,
    render_table,
    robust_fit,
)
from servepilot.calibrate.probe import Limits, ProbePlan, Prober, ProbeRun, make_plan
from servepilot.calibrate.probe import make_prompts as make_probe_prompts
from servepilot.calibrate.samples import ProbeSample
from servepilot.calibrate.server import ServerFacts, server_facts
from servepilot.cli.console import err_console, out_console, print_step, print_warning
from servepilot.cli.options import base_url
from servepilot.core import loop
from servepilot.core.errors import ConfigError, EngineError
from servepilot.plan.costprofile import save_profile

DEFAULT_BATCHED_TOKENS = 2048
"""vLLM's max_num_batched_tokens for its OpenAI server on CPU, and the smallest default
elsewhere: probes stay within it, so a server with a larger budget is probed correctly too."""
MAX_FAILED_SHARE = 0.1

DESCRIPTION = """\
Measure a running vLLM replica and fit servepilot's step-time cost model to it: the time of
one engine step as base + a x prefill tokens + b x prefill sequences + c x decode sequences
+ d x context tokens. The profile it writes is what `servepilot sim --profile` runs on.

Probes (each maps to engine steps of a known shape):
  prefill  one request alone on the idle engine, prompts of 16 to 1,024 tokens,
           max_tokens 1: one prefill step, as vLLM times it (request_prefill_time); the
           rest of its TTFT is the request's time outside the engine, kept apart.
  decode   waves of 1 to 16 streams sent together with a fixed output length (ignore_eos):
           once all are decoding, each gap between two tokens is one step of N decoders.
  mixed    single-token requests injected into a wave one at a time: the one long gap
           they cause is one step with their whole prompt beside the N decoders.

Calibrate one replica directly (not a gateway), with nothing else sending to it or running
on its machine. It takes about 3 minutes for SmolLM2-135M on one CPU core (--quick: about 1).

example:
  servepilot calibrate --url http://127.0.0.1:8000 --out profile.json
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "calibrate",
        help="fit the simulator's cost model to measurements of a real vLLM replica",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--url", required=True, metavar="URL", help="the vLLM replica, e.g. http://127.0.0.1:8000")
    add("--model", metavar="NAME", help="model to ask for (default: the server's only model)")
    add("--out", type=Path, default=Path("profile.json"), metavar="FILE",
        help="profile to write (default profile.json)")  # fmt: skip
    add("--max-num-batched-tokens", type=int, metavar="B",
        help="the replica's step token budget (default: vLLM's, 2048 on CPU); no probe's "
        "prefill exceeds it")  # fmt: skip
    add("--max-prompt-tokens", type=int, default=1024, metavar="N",
        help="longest prompt to probe (default 1024): calibrate over the lengths you "
        "serve")  # fmt: skip
    add("--quick", action="store_true",
        help="fewer probes: a rougher fit in about a third of the time")  # fmt: skip
    add("--endpoint", choices=[e.value for e in Endpoint], default="chat",
        help="the API your clients call: chat (default, as servepilot bench) or completions; "
        "the tokens its template adds are measured for the simulator")  # fmt: skip
    add("--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY")
    add("--seed", type=int, help="prompt seed (default: a new one, so no earlier prompt is cached)")
    add("--timeout", type=float, default=600.0, metavar="S", help="per-request timeout (s)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    root = base_url(args.url, "--url")
    _check_writable(args.out)
    facts = server_facts(root, args.model, args.api_key)
    limits = Limits(
        max_num_batched_tokens=args.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS,
        max_model_len=facts.max_model_len,
        kv_tokens=facts.kv_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    plan = make_plan(limits, quick=args.quick)
    target = Target(
        base_url=root,
        model=facts.model,
        endpoint=Endpoint(args.endpoint),
        api_key=args.api_key,
        timeout_s=args.timeout,
    )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print_step(f"making {_prompt_count(plan)} prompts with {root}/tokenize")
    prompts = make_probe_prompts(plan, ServerTokenizer(root, facts.model), seed)
    started = time.monotonic()
    probes = _probe_with_progress(target, plan, prompts)
    _check_failures(probes, root)
    fit = _fit(probes.samples, root)
    out_console.print(render_table(fit))
    out_console.print(render_coefficients(fit.model))
    meta = profile_meta(facts, args, limits, probes, fit, seed=seed)
    out_console.print(overhead_line(meta))
    meta["probe_seconds"] = round(time.monotonic() - started, 1)
    save_profile(fit.model, args.out, meta=meta)
    print_step(f"wrote {args.out}")
    return 0


def _check_args(args: argparse.Namespace) -> None:
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < 2:
        raise ConfigError(
            f"--max-num-batched-tokens must be at least 2, got {args.max_num_batched_tokens}"
        )
    if args.max_prompt_tokens < 2:
        raise ConfigError(f"--max-prompt-tokens must be at least 2, got {args.max_prompt_tokens}")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be above 0 s, got {args.timeout}")


def _check_writable(path: Path) -> None:
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


def _prompt_count(plan: ProbePlan) -> int:
    waves = sum(w.decoders + len(w.injections) for w in plan.waves)
    return len(plan.prefill_lengths) + waves


def _probe_with_progress(target: Target, plan: ProbePlan, prompts: Any) -> ProbeRun:
    columns = (
        TextColumn("[bold]calibrating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[probe]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task("probes", total=plan.items, probe="")
        seen = [0]

        def on_item(label: str) -> None:
            bar.update(task, completed=seen[0], probe=label)
            seen[0] += 1

        result = loop.run(Prober(target, on_item).probe(plan, prompts))
        bar.update(task, completed=plan.items, probe="done")
    return result


def _check_failures(probes: ProbeRun, root: str) -> None:
    if not probes.failures:
        return
    first = probes.failures[0]
    if len(probes.failures) > MAX_FAILED_SHARE * max(probes.requests, 1):
        raise EngineError(
            f"{len(probes.failures)} of {probes.requests} probe requests to {root} failed "
            f"(first: {first})",
            hint="calibrate a healthy replica that nothing else is using",
        )
    print_warning(f"{len(probes.failures)} probe requests failed and were left out ({first})")


def _fit(samples: Sequence[ProbeSample], root: str) -> Fit:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        return robust_fit(samples, source=f"calibrated: {root} {date}")
    except ValueError as exc:
        raise EngineError(
            f"the probes of {root} cannot be fitted: {exc}",
            hint="was something else sending requests to the replica? try again without --quick",
        ) from None


def overhead_line(meta: dict[str, Any]) -> str:
    overhead = meta["request_overhead_ms"]
    tokens = meta["prompt_overhead_tokens"]
    text = f"{meta['endpoint']} adds {tokens} tokens to every prompt; "
    if overhead is None:
        return text + "the server does not time requests itself: TTFT is taken as the step"
    return (
        text + f"a request spends {overhead:.1f} ms outside the engine (median TTFT minus "
        "vLLM's own prefill time; not part of the step times)"
    )


def profile_meta(
    facts: ServerFacts,
    args: argparse.Namespace,
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
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "vllm_version": facts.version,
        "endpoint": args.endpoint,
        "prompt_overhead_tokens": prompt_overhead,
        "request_overhead_ms": None if overhead is None else round(overhead * 1000, 2),
        "server": {
            "max_model_len": facts.max_model_len,
            "block_size": facts.block_size,
            "num_blocks": facts.num_blocks,
            "enable_prefix_caching": facts.prefix_caching,
            "max_num_batched_tokens": limits.max_num_batched_tokens,
            "max_num_batched_tokens_assumed": args.max_num_batched_tokens is None,
        },
        "probes": {
            "quick": bool(args.quick),
            "requests": probes.requests,
            "failed": len(probes.failures),
            "samples": counts,
            "outliers": len(fit.outliers),
            "max_prompt_tokens": args.max_prompt_tokens,
            "seed": seed,
        },
        "fit_error": fit_errors(fit.kept, fit.model),
    }
