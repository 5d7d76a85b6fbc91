"""`servepilot calibrate`: fit the step-time cost model to measurements of a real replica."""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from servepilot.bench.records import Endpoint
from servepilot.calibrate.fit import coefficient_table, sample_table
from servepilot.calibrate.run import Calibration, CalibrationRequest, calibrate
from servepilot.cli.console import draw, err_console, out_console, print_step, print_warning
from servepilot.cli.options import Commands, add_command, record_of
from servepilot.core.urls import base_url

# The fit's tables: the first column names the row, the others are numbers.
_STYLE = {"box": box.SIMPLE_HEAD, "pad_edge": False, "header_style": "bold"}

DESCRIPTION = """\
Measure a running vLLM replica and fit servepilot's step-time cost model to it: the time of
one engine step as base + a x prefill tokens + b x prefill sequences + c x decode sequences
+ d x context tokens. The profile it writes is what `servepilot sim --profile` runs on.

Probes (each maps to engine steps of a known shape):
  prefill  one request alone on the idle engine, prompts of 16 to 1,024 tokens,
           max_tokens 1: one prefill step, as vLLM times it (request_prefill_time); the
           rest of its TTFT is the request's time outside the engine, kept apart.
  decode   waves of 1 to 64 streams sent together with a fixed output length (ignore_eos):
           once all are decoding, each gap between two tokens is one step of N decoders;
           in waves of 16 or more, how far apart one step's tokens arrive is the API
           server's time to stream a token (output_us_per_token), kept apart too.
  mixed    single-token requests injected into a wave one at a time: the one long gap
           they cause is one step with their whole prompt beside the N decoders.

Calibrate one replica directly (not a gateway), with nothing else sending to it or running
on its machine. It takes about 3 minutes for SmolLM2-135M on one CPU core (--quick: about 1).

example:
  servepilot calibrate --url http://127.0.0.1:8000 --out profile.json
"""


def register(sub: Commands) -> None:
    help = "fit the simulator's cost model to measurements of a real vLLM replica"
    add = add_command(sub, "calibrate", help, DESCRIPTION, run).add_argument
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


def run(args: argparse.Namespace) -> int:
    url = base_url(args.url, "--url")
    request = record_of(CalibrationRequest, args, url=url, endpoint=Endpoint(args.endpoint),
                        timeout_s=args.timeout)  # fmt: skip
    calibrate(request, _View())
    print_step(f"wrote {args.out}")
    return 0


class _View:
    """Steps and warnings on stderr, a bar over the probes, the fit's tables on stdout."""

    step = staticmethod(print_step)
    warning = staticmethod(print_warning)

    @contextlib.contextmanager
    def probing(self, probes: int) -> Iterator[Callable[[str], None]]:
        columns = (TextColumn("[bold]calibrating"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[probe]}"), TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=err_console, transient=False) as bar:
            task = bar.add_task("probes", total=probes, probe="")
            seen = itertools.count()
            yield lambda label: bar.update(task, completed=next(seen), probe=label)
            bar.update(task, completed=probes, probe="done")

    def fitted(self, calibration: Calibration) -> None:
        out_console.print(draw(sample_table(calibration.fit), **_STYLE))
        out_console.print(draw(coefficient_table(calibration.fit.model), **_STYLE))
        out_console.print(calibration.overheads())
