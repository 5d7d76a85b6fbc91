"""`servepilot batch submit`: send a JSONL file of requests to a gateway as an OpenAI batch."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from servepilot.cli.console import err_console, out_console, print_error, print_step
from servepilot.cli.options import Commands
from servepilot.gateway.batch.client import DONE, BatchClient, BatchClientError, endpoint_of


def register(sub: Commands) -> None:
    help = "submit a JSONL file of requests to a gateway as a batch job (priority 2)"
    batch = sub.add_parser("batch", help=help, description="OpenAI batch jobs on a servepilot "
                           "gateway: they run at priority 2 on the capacity interactive traffic "
                           "leaves idle.")  # fmt: skip
    bsub = batch.add_subparsers(dest="batch_command", metavar="ACTION", required=True)
    submit = bsub.add_parser(
        "submit", help="upload FILE and create its batch; --wait follows it to the end",
        description="Upload FILE (JSONL of {custom_id, method, url, body}) to the gateway's "
        "/v1/files and create a batch of it. With --wait, show its progress and, once it "
        "ends, write its output and error files beside FILE (NAME.output.jsonl, "
        "NAME.errors.jsonl). Exit status: 0 when every line succeeded, 1 otherwise.",
    )  # fmt: skip
    submit.add_argument("file", type=Path, metavar="FILE.jsonl")
    submit.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8000")
    submit.add_argument("--window", default="24h",
                        help="completion_window: lines not run by then end as expired "
                        "(default 24h; <n>h, <n>m or <n>s)")  # fmt: skip
    submit.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                        help="environment variable holding the gateway key, if it has auth "
                        "(default OPENAI_API_KEY)")  # fmt: skip
    submit.add_argument("--wait", action="store_true", help="follow the batch to its end")
    submit.set_defaults(run=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.is_file():
        print_error(f"{path}: no such file")
        return 2
    client = BatchClient(args.url, os.environ.get(args.api_key_env))
    try:
        uploaded = client.upload(path)
        batch = client.create(uploaded["id"], endpoint_of(path), args.window)
        print_step(f"batch {batch['id']} of {path.name} ({uploaded['id']}): {batch['status']}")
        if args.wait and batch["status"] not in DONE:
            batch = _follow(client, batch)
        if args.wait:
            return _finish(client, batch, path)
    except BatchClientError as exc:
        print_error(exc)
        return 1
    out_console.print(batch["id"])
    return 0


def _follow(client: BatchClient, batch: dict[str, Any]) -> dict[str, Any]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=err_console) as bar:
        task = bar.add_task(batch["status"], total=None, failed=0)

        def update(batch: dict[str, Any]) -> None:
            n = batch["request_counts"]
            bar.update(task, description=batch["status"], total=n["total"] or None,
                       completed=n["completed"] + n["failed"], failed=n["failed"])  # fmt: skip

        return client.follow(batch, update)


def _finish(client: BatchClient, batch: dict[str, Any], path: Path) -> int:
    counts = batch["request_counts"]
    print_step(f"batch {batch['id']}: {batch['status']}, {counts['completed']} completed, "
               f"{counts['failed']} failed of {counts['total']}")  # fmt: skip
    for error in (batch.get("errors") or {}).get("data") or []:
        print_error(f"line {error.get('line')}: {error.get('message')}")
    for suffix, target in client.save_files(batch, path):
        out_console.print(f"{suffix}: {target}")
    return 0 if batch["status"] == "completed" and counts["failed"] == 0 else 1
