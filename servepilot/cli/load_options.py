"""The load and workload flags that bench, sim and tune share (load/flags.py parses them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.cli.options import record_of
from servepilot.load.arrivals import Arrival
from servepilot.load.flags import AGENTIC_DEFAULTS, LoadFlags, WorkloadFlags
from servepilot.load.levels import LevelOptions
from servepilot.load.workload import WorkloadKind, WorkloadSpec


def add_load_flags(parser: argparse.ArgumentParser, *, real_client: bool = True) -> None:
    """The load flags; `real_client` adds those only a real client has (soak, client
    processes), so a command that simulates its clients does not list what it cannot do."""
    g = parser.add_argument_group("load")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", metavar="N[,N...]", help="closed loop: requests in "
                      "flight at all times; a list runs one level each")  # fmt: skip
    mode.add_argument("--rate", metavar="R[,R...]", help="open loop: requests per second")
    add = g.add_argument
    add("--sweep", action="store_true", help="raise the load level by level until throughput "
        "stops rising (concurrency 1, 2, 4, ...; with --rate, from its first value)")  # fmt: skip
    add("--arrival", choices=[a.value for a in Arrival], default="poisson",
        help="open-loop arrivals (default poisson)")  # fmt: skip
    add("--burstiness", type=float, default=1.0, metavar="B",
        help="gamma arrivals: 1 is Poisson, below 1 burstier, above 1 smoother")  # fmt: skip
    stop = g.add_mutually_exclusive_group()
    stop.add_argument("--requests", type=int, metavar="N", help="requests per level (default: "
                      "max(100, 5 x concurrency) or max(100, 30 x rate); a trace: all its "
                      "lines)")  # fmt: skip
    stop.add_argument("--duration", metavar="T", help="time per level instead (90s, 10m)")
    add("--warmup", type=int, default=0, metavar="N",
        help="requests sent first at each level and left out of the results")  # fmt: skip
    add("--slo", metavar="K=MS,...",
        help="<ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms limits, as tune takes them; goodput "
        "counts the requests within every ttft/tpot/e2e p99 limit, the other limits are "
        "checked on each level's statistics (slo_met)")  # fmt: skip
    if not real_client:
        return
    add("--soak", metavar="T", help="one long run at one load level (e.g. 30m), reported in "
        "windows, with the target's memory growth per request")  # fmt: skip
    add("--window", metavar="T", help="soak window length (default: a tenth of the soak, at "
        "least 10s)")  # fmt: skip
    add("--processes", type=int, metavar="N",
        help="client processes (default: as many as the load needs)")  # fmt: skip


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument_group("workload").add_argument
    add("--workload", choices=[k.value for k in WorkloadKind], default="random",
        help="random (default); mixed (short and long prompts); shared_prefix (N prefixes "
        "x suffixes); multi_turn (chat sessions whose history grows); agentic (agent "
        "sessions: each turn sends the conversation so far, the real answers included, after "
        "a wait; see the agentic flags); trace (--trace FILE)")  # fmt: skip
    add("--input-tokens", type=int, default=256, metavar="N", help="prompt tokens as the "
        "server counts them, a chat template included (default 256)")  # fmt: skip
    add("--output-tokens", type=int, default=128, metavar="N",
        help="max_tokens of every request (default 128)")  # fmt: skip
    add("--long-fraction", type=float, default=0.2, metavar="F",
        help="mixed: share of long prompts (default 0.2)")  # fmt: skip
    add("--long-input-tokens", type=int, metavar="N",
        help="mixed: tokens of a long prompt (default 4 x --input-tokens)")  # fmt: skip
    add("--num-prefixes", type=int, default=8, metavar="N",
        help="shared_prefix: distinct prefixes (default 8)")  # fmt: skip
    add("--prefix-tokens", type=int, metavar="N",
        help="shared_prefix: tokens of each prefix (default 3/4 of --input-tokens)")  # fmt: skip
    add("--turns", type=int, default=4, metavar="N", help="multi_turn, agentic: turns per "
        "conversation "
        "(default 4); results then split TTFT into first turns and returning ones (turn 2 "
        "on)")  # fmt: skip
    add("--active-sessions", type=int, default=16, metavar="N",
        help="multi_turn: conversations interleaved at a time, each sending its next turn "
        "after the other N-1 sent theirs (default 16). Their histories, about N x turns x "
        "(input + output tokens), are what the server must keep between turns: above the "
        "GPU's KV tokens (plan's figure) returning turns miss the GPU cache, which a CPU tier "
        "(engine.kv_offload_gib) can catch")  # fmt: skip
    add("--trace", type=Path, metavar="FILE", help="trace: JSONL lines with timestamp, "
        "input_tokens, output_tokens, optional prefix_group and priority; replayed at its "
        "timestamps, every line once, unless --requests, --duration or --concurrency say "
        "otherwise")  # fmt: skip
    add("--priority-mix", metavar="0=W,1=W,2=W",
        help="send X-Priority 0 (interactive), 1 or 2 (batch) with these weights")  # fmt: skip
    add("--sessions", type=int, metavar="N", help="spread requests over N X-Session-Id values "
        "(not multi_turn, where each conversation is its own session: see "
        "--active-sessions)")  # fmt: skip
    add("--seed", type=int, default=0, help="workload and arrival seed (default 0)")
    _add_agentic_flags(parser)


def _add_agentic_flags(parser: argparse.ArgumentParser) -> None:
    d = AGENTIC_DEFAULTS
    add = parser.add_argument_group(
        "agentic workload",
        "Sessions of an agent and its user. Turn 1 sends a system prompt (one of a few shared "
        "ones) and a user message; every later turn sends the conversation so far, the "
        "previous answer included, plus a tool's result or the user's next message. The load "
        "counts sessions: --concurrency N keeps N sessions live (a new one starts when one "
        "ends), --rate R starts R sessions a second; --requests counts turns. A failed turn "
        "ends its session.",
    ).add_argument
    add(
        "--system-prompts",
        type=int,
        default=d.system_prompts,
        metavar="N",
        help=f"distinct system prompts the sessions share (default {d.system_prompts})",
    )
    add(
        "--system-prompt-tokens",
        type=int,
        default=d.system_prompt_tokens,
        metavar="N",
        help=f"tokens of each system prompt (default {d.system_prompt_tokens})",
    )
    add(
        "--tool-fraction",
        type=float,
        default=d.tool_fraction,
        metavar="F",
        help="share of the turns after the first that carry a tool's result rather than a "
        f"user message (default {d.tool_fraction})",
    )
    add(
        "--tool-tokens",
        type=int,
        default=d.tool_tokens,
        metavar="N",
        help=f"tokens of a tool's result (default {d.tool_tokens})",
    )
    add(
        "--think-time",
        type=float,
        default=d.think_s,
        metavar="S",
        help="mean seconds (exponential) between an answer and the user's next message "
        f"(default {d.think_s:g})",
    )
    add(
        "--tool-time",
        type=float,
        default=d.tool_s,
        metavar="S",
        help="mean seconds (exponential) between an answer and the tool's result "
        f"(default {d.tool_s:g})",
    )
    add(
        "--return-fraction",
        type=float,
        default=d.return_fraction,
        metavar="F",
        help="share of the sessions that leave once, between two turns, and come back "
        f"(default {d.return_fraction})",
    )
    add("--return-gap", type=float, default=d.return_gap_s, metavar="S",
        help="seconds such a session stays away: by then other sessions may have evicted "
        f"its context from the KV cache (default {d.return_gap_s:g})")  # fmt: skip


def levels_from_args(args: argparse.Namespace) -> LevelOptions:
    """The levels bench and sim run, from the flags of add_load_flags and add_workload_flags."""
    return record_of(LoadFlags, args).levels(workload_from_args(args))


def workload_from_args(args: argparse.Namespace) -> WorkloadSpec:
    return record_of(WorkloadFlags, args).spec()
