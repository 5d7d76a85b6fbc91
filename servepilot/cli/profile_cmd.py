"""`servepilot profile`: time the operators of a model's engine step on this machine's GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.cli.console import err_console, out_console, print_error
from servepilot.cli.options import Commands, add_command
from servepilot.engine.gpu.profile import (
    PROFILE_DTYPES,
    PROFILER_FILE,
    measure,
    model_shapes,
    write_json,
)
from servepilot.engine.gpu.profiler import EXIT_NO_GPU, NoGpuError

DESCRIPTION = f"""\
Time the operators one vLLM engine step of MODEL is made of, at the model's real shapes, on
this machine's GPU: every linear layer's GEMM over 1..8,192 tokens, attention prefill and
decode (PyTorch's fused SDPA; MLA's latent shapes for DeepSeek) over batch sizes and context
lengths, MoE expert GEMMs at the tokens per expert a step gives them, norms and activations.
CUDA events after a warm-up, repeated until stable; about 10 s per model on an H200.

The profile feeds `sim --profile`, `plan --profile` and `tune --engine sim --profile`, which
compose a step's time from it. Needs PyTorch with a CUDA GPU; without one it exits with code
{EXIT_NO_GPU}. On a GPU machine without servepilot, write the shapes here (--shapes-only) and
run the stand-alone profiler there (PyTorch and the standard library only):
  python {PROFILER_FILE.name} --shapes shapes.json --out gpu-profile.json
"""


def register(sub: Commands) -> None:
    help = "time a model's step operators on this GPU (a profile for sim/plan/tune)"
    add = add_command(sub, "profile", help, DESCRIPTION, run).add_argument
    add("--model", required=True, metavar="MODEL",
        help="a preset (`servepilot models list`) or a config folder")  # fmt: skip
    add("--dtype", default="bf16", choices=[d.value for d in PROFILE_DTYPES],
        help="weight format of the linear layers (default bf16)")  # fmt: skip
    add("--tp", type=int, default=1, metavar="N",
        help="tensor-parallel size: shapes are one rank's (default 1)")  # fmt: skip
    add("--out", type=Path, required=True, metavar="PROFILE.json",
        help="where to write the profile (the shapes: --shapes-only)")  # fmt: skip
    add("--shapes-only", action="store_true", help=f"write the shapes to time, for "
        f"{PROFILER_FILE.name} on another machine, and time nothing")  # fmt: skip
    add("--device", default="cuda", choices=("cuda", "cpu"), help="cpu times the same operators "
        "on the CPU: a test of the tool, not a GPU profile (default cuda)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    shapes = model_shapes(args.model, args.dtype, args.tp)
    if args.shapes_only:
        write_json(shapes, args.out)
        points = sum(len(op["points"]) for op in shapes["operators"])
        out_console.print(f"wrote {args.out}: {len(shapes['operators'])} operators, "
                          f"{points} points to time")  # fmt: skip
        return 0
    try:
        profile = measure(shapes, device=args.device, log=err_console.print)
    except NoGpuError as exc:
        print_error(exc)
        return EXIT_NO_GPU
    write_json(profile, args.out)
    out_console.print(f"wrote {args.out}: {profile['gpu']}, {profile['elapsed_s']:.0f} s")
    return 0
