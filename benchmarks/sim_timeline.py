"""One validation case's requests side by side: measured (bench's requests.csv) and simulated.

Where a case's TTFT p50 is off, the aggregate does not say why; the per-request timeline
does (a request that waited for a prefill slot, one that rode a long mixed step). The
simulated side reruns `servepilot sim` in pure Python with the level's collector recording
every request (send, first token, last token at the client).

    python benchmarks/sim_timeline.py OUT/sim-validation CASE_NAME [--run 1]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout
os.environ["SERVEPILOT_SIM_PURE"] = "1"  # the collector below must be the Python one


Record = tuple[float, float, float, int, int]


def simulated(out: Path, entry: dict[str, Any], steps: bool) -> list[Record]:
    """(send s, TTFT ms, E2E ms, input tokens, output tokens) per simulated request."""
    from servepilot.cli.main import main
    from servepilot.sim.fleet import collect

    records: list[Record] = []
    original = collect.RunCollector.ok

    def ok(self: Any, send_s: float, first_s: float, end_s: float, inp: int, outp: int) -> None:
        records.append((send_s, (first_s - send_s) * 1e3, (end_s - send_s) * 1e3, inp, outp))
        original(self, send_s, first_s, end_s, inp, outp)

    collect.RunCollector.ok = ok  # type: ignore[method-assign]
    if steps:
        from servepilot.sim.engine import scheduler

        step = scheduler.SchedulerCore.step

        def logged(self: Any, now_s: float) -> Any:
            result = step(self, now_s)
            if result is not None:
                print(f"step at {now_s:8.3f} s: {result.duration_s * 1e3:7.1f} ms, prefill "
                      f"{result.prefill_tokens} tok in {result.prefill_seqs} seqs, decode "
                      f"{result.decode_seqs}, context {result.context_tokens}, pairs "
                      f"{result.prefill_pairs}, first {len(result.first_tokens)}")  # fmt: skip
            return result

        scheduler.SchedulerCore.step = logged  # type: ignore[method-assign]
    argv = ["sim", "-c", str(out / "fleet-chunked.yaml"), "--profile", str(out / "profile.json"),
            *entry["flags"].split(), "--seed", str(entry["seed"]), "--out",
            str(out / "timeline-sim")]  # fmt: skip
    main(argv)
    collect.RunCollector.ok = original  # type: ignore[method-assign]
    return sorted(records)


def measured(path: Path) -> list[Record]:
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["ok"] == "true"]
    return sorted((float(r["intended_s"]), float(r["ttft_ms"]), float(r["e2e_ms"]),
                   int(r["input_tokens"]), int(r["output_tokens"])) for r in rows)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("case")
    p.add_argument("--run", type=int, default=1, choices=(1, 2))
    p.add_argument("--steps", action="store_true", help="print the simulated engine steps")
    args = p.parse_args()
    entry = json.loads((args.out / "validation.json").read_text())["cases"][args.case]
    folder = args.out / "cases" / args.case
    folder = folder / "run2" if args.run == 2 else folder
    real = measured(folder / "measured" / "requests.csv")
    sim = simulated(args.out, entry, args.steps)
    print(f"{'#':>3} {'send s':>8} {'sim':>8} {'ttft ms':>9} {'sim':>9} {'e2e ms':>9} {'sim':>9} "
          f"{'in':>5} {'out':>4}")  # fmt: skip
    for i, (m, s) in enumerate(zip(real, sim, strict=False)):
        print(f"{i:>3} {m[0]:8.2f} {s[0]:8.2f} {m[1]:9.1f} {s[1]:9.1f} {m[2]:9.1f} {s[2]:9.1f} "
              f"{m[3]:>5} {m[4]:>4}")  # fmt: skip


if __name__ == "__main__":
    main()
