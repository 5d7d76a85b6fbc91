"""`servepilot doctor`: seed 004's troubleshooting table run over a live fleet, its logs and
this machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.text import Text

from servepilot.cli.console import out_console, print_marked, print_step, print_warning
from servepilot.cli.options import Commands, add_command, add_config_flag, add_fleet_choice
from servepilot.core.config import load_config
from servepilot.core.errors import FleetError
from servepilot.fleet.ray.view import read_view
from servepilot.fleet.target import FleetTarget, find_fleet
from servepilot.observe.doctor import evidence as recorded
from servepilot.observe.doctor.finding import Finding, Severity
from servepilot.observe.doctor.gather import gather
from servepilot.observe.doctor.rules import diagnose

DESCRIPTION = """\
Diagnose a fleet with the serving troubleshooting table, as rules over what can be seen:
- live metrics (the gateway's /metrics and each replica's): preemptions, a KV cache near full,
  high TTFT and whether queueing or prefill causes it, P99 spikes, under-filled batches,
  vLLM metrics that were renamed or are missing (vllm:gpu_cache_usage_perc, still read by
  older dashboards and routers, is gone);
- the replicas' logs (the run folder of `servepilot up`): out of memory, preemptions, the KV
  capacity each replica found at startup;
- this machine: the size of /dev/shm, the CPU's flags, the GPU topology for tensor
  parallelism (nvidia-smi topo -m), Ray placement groups that cannot be placed.

Each finding names its evidence and the fix: the fleet.yaml knob and its new value where one
applies. Exit code 1 when a problem was found.

Without --url, doctor looks at the fleet `servepilot up` runs here; with no fleet running it
still checks this machine. --save DIR records the evidence (pages, logs, facts), --from DIR
diagnoses a recording again, here or on another machine.

examples:
  servepilot doctor -c fleet.yaml
  servepilot doctor --url http://127.0.0.1:8000 --save doctor-case/
  servepilot doctor --from doctor-case/ --json
"""


def register(sub: Commands) -> None:
    help = "diagnose a fleet: OOM, preemptions, high TTFT, P99 spikes, KV, shm, topology"
    parser = add_command(sub, "doctor", help, DESCRIPTION, run_doctor)
    add_config_flag(parser)
    add_fleet_choice(parser)
    parser.add_argument("--save", type=Path, metavar="DIR", help="record the evidence here")
    parser.add_argument("--from", dest="replay", type=Path, metavar="DIR",
                        help="diagnose evidence recorded with --save instead")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def run_doctor(args: argparse.Namespace) -> int:
    if args.replay is not None:
        evidence = recorded.load(args.replay)
    else:
        target = _target(args.url, args.port)
        logs = target.replica_logs() if target is not None else {}
        url = target.gateway_url if target is not None else None
        config = load_config(args.config)
        gathered = gather(config, url, logs, _placement_groups(target))
        for note in gathered.notes:
            print_warning(note)
        evidence = gathered.evidence
    if args.save is not None:
        recorded.save(evidence, args.save)
        print_step(f"evidence recorded in {args.save}")
    findings = diagnose(evidence)
    if args.json:
        print(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        _print_findings(findings, len(evidence.replicas))
    return 1 if any(f.severity is Severity.PROBLEM for f in findings) else 0


def _target(url: str | None, port: int | None) -> FleetTarget | None:
    try:
        return find_fleet(url, port)
    except FleetError as exc:
        if url is not None or port is not None:
            raise
        print_warning(f"{exc.message}: checking this machine only")
        return None


def _placement_groups(target: FleetTarget | None) -> tuple[tuple[str, str], ...]:
    if target is None or target.record is None:
        return ()
    view = read_view(target.record.port)
    return () if view is None else tuple((g.name, g.state) for g in view.groups)


_STYLE = {Severity.PROBLEM: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "cyan"}


def _print_findings(findings: tuple[Finding, ...], replicas: int) -> None:
    if not findings:
        out_console.print(f"no finding: {replicas} replicas and this machine look healthy")
    for f in findings:
        details: list[str | Text] = [f"evidence: {f.evidence}", f"fix: {f.fix}"]
        if f.knob is not None:
            details.append(Text(f"set {f.knob}: {f.value}", style="bold"))
        print_marked(
            f"{f.severity.value:<8}", _STYLE[f.severity], f"{f.rule}: {f.summary}", details
        )
