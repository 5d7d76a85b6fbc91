"""`servepilot plan`: memory, layout, knobs, the vLLM command and cost, before any GPU is rented."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.text import Text

from servepilot.cli.console import draw, out_console, print_step, print_warning, warning_text
from servepilot.cli.options import Commands, add_command, add_config_flag, config_from_args
from servepilot.engine.cpu import cpu_flags
from servepilot.engine.planned import PlannedLaunch, plan_launch
from servepilot.fleet.devices import check_planned_fleet
from servepilot.plan import report
from servepilot.plan.gpu_profile.source import read_step_source
from servepilot.plan.launch import Launch
from servepilot.plan.presets import preset_names
from servepilot.plan.request import PlanRequest

HELP = "plan a deployment: memory, parallel layout, the four knobs, the vLLM command, cost"
DESCRIPTION = """\
Work out, before anything is started, how a model runs on vLLM on given hardware:

  memory per accelerator  weights (per rank under TP/EP/PP), activations, runtime, KV pool,
                          headroom; KV bytes per token by the model's attention type (GQA,
                          MLA, DeepSeek's sparse and compressed MLA), as vLLM computes them
  layout                  TP inside the NVLink domain, EP for MoE, DP attention for MLA when
                          the KV cache is the limit, PP across nodes when a node is too small
  knobs                   gpu_memory_utilization, max_model_len, max_num_seqs,
                          max_num_batched_tokens and chunked prefill, each with its reason
  command                 the ready vLLM command (int8, fp4 and 4-bit AWQ/GPTQ weights serve
                          a published checkpoint in that format, or a <placeholder> to fill
                          in, with no --quantization: vLLM reads it from the checkpoint; fp8
                          of 16-bit weights is --quantization fp8; a replica wider than a
                          node gets its Ray launch, node by node), and (--out) a fleet.yaml
                          for `servepilot up`
  if it does not fit      the ladder: cut max_model_len, quantize the KV cache, quantize the
                          weights, or at the original precision more accelerators of the
                          node, then more nodes, with the numbers for each step
  advice and cost         one node or distributed, $/hour, and for --qps the replicas and
                          nodes it needs by the capacity estimate, their $/hour, $ per QPS
                          and $ per 1M output tokens

Models: a preset name or a local Hugging Face folder (or its config.json). Accelerators come
from the catalog (override memory and price with --memory-gib / --price). On CPU, --memory-gib
is the KV cache space. Flags override fleet.yaml. Exit code 1 when nothing fits.

examples:
  servepilot plan --model deepseek-v3 --accelerator h200 --count 8
  servepilot plan --model llama-3.1-70b --accelerator h100 --count 8 --qps 500 --json
  servepilot plan --memory-gib 2 --max-model-len 4096 --out fleet.yaml
  servepilot up -c fleet.yaml
"""


def register(sub: Commands) -> None:
    parser = add_command(sub, "plan", HELP, DESCRIPTION, run)
    add_config_flag(parser)
    what = parser.add_argument_group("model and hardware").add_argument
    what("--model", metavar="NAME_OR_PATH",
         help=f"a preset ({', '.join(preset_names())}) or a local model folder")  # fmt: skip
    what("--accelerator", metavar="NAME",
         help="catalog name: cpu, a100-40, a100-80, h100, h200, b200, l40s")  # fmt: skip
    what("--count", type=int, metavar="N", help="accelerators per node")
    what("--nodes", type=int, metavar="N", help="number of nodes")
    what("--memory-gib", type=float, metavar="G",
         help="memory per accelerator in GiB (on CPU: the KV cache space)")  # fmt: skip
    what("--price", type=float, metavar="USD", help="price of one accelerator per hour")
    what("--catalog", metavar="YAML",
         help="accelerators to add to or override the shipped catalog")  # fmt: skip
    knob = parser.add_argument_group("precision and knobs").add_argument
    knob("--weights-dtype", metavar="D",
         help="bf16, fp16, fp32, fp8, int8, fp4, awq, gptq (default: the checkpoint's; on CPU "
              "what `dtype: auto` runs)")  # fmt: skip
    knob("--kv-dtype", metavar="D", help="auto, fp8, fp8_e4m3, fp8_e5m2, bf16")
    knob("--max-model-len", type=int, metavar="L",
         help="longest prompt + output (default: from the traffic)")  # fmt: skip
    traffic = parser.add_argument_group("traffic").add_argument
    traffic("--qps", type=float, metavar="Q", help="requests per second to sustain")
    traffic("--concurrency", type=int, metavar="N", help="requests in flight")
    traffic("--bursty", action="store_true", default=None,
            help="traffic comes in bursts: one node plus autoscaling when one node carries "
                 "the sustained --qps")  # fmt: skip
    traffic("--input-tokens", type=int, metavar="N", help="mean prompt length")
    traffic("--output-tokens", type=int, metavar="N", help="mean output length")
    traffic("--profile", type=Path, metavar="PROFILE.json",
            help="step times for the throughput and latency estimates: measured by `servepilot "
                 "calibrate`, or a GPU operator profile from `servepilot profile` (default: "
                 "the roofline of the model on the accelerator)")  # fmt: skip
    out = parser.add_argument_group("output").add_argument
    out("--json", action="store_true", help="print the plan as one JSON object")
    out("--out", type=Path, metavar="FLEET_YAML",
        help="write the planned fleet.yaml here (for `servepilot up -c`)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {
        "model.source": "model", "hardware.accelerator": "accelerator",
        "hardware.count": "count", "hardware.nodes": "nodes",
        "hardware.memory_gib": "memory_gib", "hardware.price_usd_per_hour": "price",
        "hardware.catalog": "catalog", "engine.max_model_len": "max_model_len",
        "traffic.target_qps": "qps", "traffic.concurrency": "concurrency",
        "traffic.bursty": "bursty",
        "traffic.input_tokens": "input_tokens", "traffic.output_tokens": "output_tokens",
    })  # fmt: skip
    check_planned_fleet(config)
    request = PlanRequest.from_fleet(config, cpu_flags(), args.weights_dtype, args.kv_dtype)
    if args.profile is not None:
        request = request.replace(cost_model=read_step_source(args.profile))
    answer = plan_launch(request, config.engine)
    fits = answer.runnable.fits
    if args.out is not None and fits:
        answer.write_fleet_yaml(args.out)
    if args.json:
        out_console.print_json(json.dumps(answer.as_json()), indent=2)
    else:
        _render(answer)
    if args.out is not None and fits:
        rung = f" (after: {answer.step.action})" if answer.step else ""
        print_step(f"wrote {args.out}{rung}; start it with `servepilot up -c {args.out}`")
    elif args.out is not None:
        print_warning(f"did not write {args.out}: nothing fits, even on the ladder")
    return 0 if answer.plan.fits else 1


def _render(answer: PlannedLaunch) -> None:
    plan, runnable, launch = answer.plan, answer.runnable, answer.launch
    style = "bold green" if plan.fits else "bold red"
    out_console.print(Text(report.headline(plan) + " — ") + Text(report.verdict(plan), style=style))
    out_console.print(draw(report.memory_table(plan)))
    out_console.print(report.kv_line(plan))
    if (host_tier := report.host_tier_line(plan)) is not None:
        out_console.print(host_tier)
    if plan.assessment.reason:
        out_console.print(f"layout: {plan.assessment.reason}")
    if plan.fits:
        out_console.print(draw(report.knob_table(plan)))
    if plan.ladder:
        out_console.print(draw(report.ladder_table(plan)))
    after = "" if answer.step is None else f'after "{answer.step.action}": '
    out_console.print(after + report.advice_line(runnable))
    for warning in answer.warnings(cpu_flags()):
        out_console.print(warning_text(warning))
    out_console.print(_cost(report.cost_line(runnable)))
    if runnable.estimates is not None:
        out_console.print(draw(report.estimates_table(runnable.estimates)))
    if launch is None:
        out_console.print(Text("command: none; nothing fits, even on the ladder", style="red"))
    else:
        _print_launch(f"command {after}".rstrip() if after else "command:", launch)
    if answer.alternative is not None:
        _print_launch(f"{answer.alternative[0]}:", answer.alternative[1])


def _print_launch(title: str, launch: Launch) -> None:
    if len(launch.steps) == 1:
        out_console.print(Text(title + " ", style="bold") + Text(launch.command))
        return
    out_console.print(Text(title, style="bold"))
    for line in launch.steps:
        out_console.print(Text("  " + line, style="dim" if line.startswith("#") else ""))


def _cost(line: report.CostLine) -> Text:
    return Text(line.price) + Text(line.over_line, style="yellow") + Text(line.basis, style="dim")
