"""`accept`'s report: report.json (schema servepilot.accept/v1) and report.html, a verdict per
checklist item with its evidence; the sweep's and the soak's bench outputs (results.json,
requests.csv, report.html with the concurrency curve) in sweep/ and soak/ beside them."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from servepilot.bench.outputs import write_outputs
from servepilot.observe.accept.items import Verdict
from servepilot.observe.accept.run import Acceptance

SCHEMA = "servepilot.accept/v1"
_COLOURS = {Verdict.PASS: "#1a7f37", Verdict.FAIL: "#cf222e", Verdict.NOT_APPLICABLE: "#6e7781"}


def overall(acceptance: Acceptance) -> Verdict:
    failed = any(item.verdict is Verdict.FAIL for item in acceptance.items)
    return Verdict.FAIL if failed else Verdict.PASS


def report_doc(acceptance: Acceptance, url: str, commands: Sequence[str]) -> dict[str, Any]:
    m = acceptance.measured
    return {
        "schema": SCHEMA,
        "verdict": overall(acceptance).value,
        "target": {"url": url},
        "items": [
            {
                "number": i.number,
                "title": i.title,
                "verdict": i.verdict.value,
                "evidence": i.evidence,
            }
            for i in acceptance.items
        ],
        "startup_kv": {rid: asdict(kv) if kv else None for rid, kv in m.kv.items()},
        "smoke": asdict(m.smoke),
        "preemptions": m.preemptions,
        "sweep": "sweep/results.json" if acceptance.sweep else None,
        "soak": "soak/results.json" if acceptance.soak else None,
        "fleet_yaml": m.config.model_dump(mode="json"),
        "commands": list(commands),
    }


def reproduce_commands(config: Path | None, port: int | None, argv: Sequence[str]) -> list[str]:
    """The steps the report writes down: the `up` that runs the fleet (on `port` when it runs
    here) and the accept command line `argv` (its arguments)."""
    up = "servepilot up" + (f" -c {shlex.quote(str(config))}" if config else "")
    return [up + (f" --port {port}" if port is not None else ""), "servepilot " + shlex.join(argv)]


def write_report(
    out_dir: Path, acceptance: Acceptance, url: str, commands: Sequence[str]
) -> tuple[Path, Path]:
    """report.json and report.html (and the bench outputs in sweep/ and soak/)."""
    for name, output in (("sweep", acceptance.sweep), ("soak", acceptance.soak)):
        if output is not None:
            (out_dir / name).mkdir(parents=True, exist_ok=True)
            write_outputs(out_dir / name, output.result, output.records)
    doc = report_doc(acceptance, url, commands)
    json_path, html_path = out_dir / "report.json", out_dir / "report.html"
    json_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    html_path.write_text(render_html(doc), encoding="utf-8")
    return json_path, html_path


def render_html(doc: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{item['number']}</td><td>{html.escape(item['title'])}</td>"
        f"<td style='color:{_COLOURS[Verdict(item['verdict'])]};font-weight:bold'>"
        f"{item['verdict'].upper()}</td><td>{html.escape(item['evidence'])}</td></tr>"
        for item in doc["items"]
    )
    links = " · ".join(
        f"<a href='{name}/report.html'>{name}: plots and levels</a>"
        for name in ("sweep", "soak")
        if doc[name]
    )
    fleet = html.escape(yaml.safe_dump(doc["fleet_yaml"], sort_keys=False))
    commands = html.escape("\n".join(doc["commands"]))
    verdict = Verdict(doc["verdict"])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>servepilot accept</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:70em}}
table{{border-collapse:collapse}}td,th{{border-bottom:1px solid #ddd;padding:.4em;
text-align:left;vertical-align:top}}pre{{background:#f6f8fa;padding:1em;overflow:auto}}</style>
</head><body>
<h1>Acceptance: <span style="color:{_COLOURS[verdict]}">{verdict.value.upper()}</span></h1>
<p>{html.escape(doc["target"]["url"])}: the acceptance checklist for a single-node deployment.</p>
<table><tr><th>#</th><th>item</th><th>verdict</th><th>evidence</th></tr>{rows}</table>
<p>{links}</p>
<h2>How to reproduce</h2><pre>{commands}</pre>
<h2>fleet.yaml (effective)</h2><pre>{fleet}</pre>
</body></html>
"""
