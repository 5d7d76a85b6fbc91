"""Two probes of what the simulator's step model leaves out, run on the lent GPU (issue 34).

`bursts CONFIG`: how fast vLLM's API server hands a burst to its engine. `servepilot up` the
config (dummy weights), then bursts of N requests sent at once (a closed loop of N with N
requests, 8 output tokens) of P-token prompts, through the gateway and straight at vLLM,
each twice. With 64-token prompts the engine prefills a whole burst in one or two steps, so
the spread of the first tokens is the host's: the last of N waits for the N - 1 before it
at every stage that handles one request at a time. Two bursts of long answers time the API
server's streaming (`BURSTS`). bench's requests.csv, vLLM's histograms before and after
(gpu_sim_validate's `measure`) and each process's CPU (cpu.json) come back.

`moe-routing CONFIG`: how many of a MoE layer's experts a step really touches with the
suite's dummy weights. vLLM in this process (eager, so forward hooks run), a hook on every
MoE layer's router: per forward, the tokens and the distinct experts their top-k picked.
Decode batches of B sequences (1,000-token random prompts, bench's sampling: temperature 1)
and prefill chunks, against what uniform routing touches (the profile's `moe_load`).

    python3 benchmarks/gpu_host_probe.py --out "$OUT/hp" bursts llama-8b
    python3 benchmarks/gpu_host_probe.py --out "$OUT/hp" moe-routing deepseek-v2-lite
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_bringup import GPU_ENV, PORT, sp
from benchmarks.gpu_sim_cases import CONFIGS, Run
from benchmarks.gpu_sim_validate import _replica_url, fleet_yaml, gpu_name, measure, warm_up
from benchmarks.router_cost import cpu_s

ANSWER_TOKENS = 8
"""Two were too few: a dummy model's first tokens can decode to nothing, and bench counts a
stream without content as failed (7 of 16 on 2026-12-06)."""
BURSTS = ((16, 64, 8), (64, 64, 8), (256, 64, 8), (64, 1000, 8), (16, 4000, 8), (64, 64, 512),
          (256, 64, 256))  # fmt: skip
"""(requests at once, prompt tokens, output tokens). 64 prompt tokens at the least: the chat
template takes 30 of them (on 2026-12-06 bench refused 16-token prompts for it). The long
answers time the API server's streaming: its CPU beyond the same burst's with 8 tokens, per
token streamed, is the profile's `output_us_per_token` (the fleet simulator's
`FleetReplica.stream`), if it streams on one core."""


def burst_name(n: int, prompt: int, output: int) -> str:
    """burst{n}x{prompt}, and o{output} after it for a long answer."""
    return f"burst{n}x{prompt}" + (f"o{output}" if output != ANSWER_TOKENS else "")


def bursts(config: str, out: Path, deadline: float, reuse: bool) -> dict[str, Any]:
    import yaml

    folder = out / config
    folder.mkdir(parents=True, exist_ok=True)
    fleet = folder / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(fleet_yaml(config, gpu_name()), sort_keys=False))
    code, ready_s = (0, 0.0) if reuse else sp(["up", "-c", str(fleet), "--detach"],
                                              folder / "up.txt", 400)  # fmt: skip
    summary: dict[str, Any] = {"config": config, "up_exit": code, "up_s": round(ready_s, 1),
                               "runs": []}  # fmt: skip
    if code != 0:
        return summary
    url = f"http://127.0.0.1:{PORT}"
    if not reuse:
        warm_up(url, folder)
    replica = _replica_url(url)
    seed = 200_000
    for rep in (1, 2):
        for n, prompt, output in BURSTS:
            flags = ("--requests", str(n), "--input-tokens", str(prompt),
                     "--output-tokens", str(output), "--warmup", "0")  # fmt: skip
            run = Run(config, burst_name(n, prompt, output), flags, (str(n),))
            for way, target in (("gateway", None), ("direct", replica)):
                if time.monotonic() + 20 > deadline:
                    print(f"  left out (deadline): {run.name} {way} rep {rep}", flush=True)
                    continue
                seed += 1
                rep_dir = folder / f"{run.name}-{way}" / f"rep{rep}"
                before = cpu_by_role()
                row = measure(run, rep_dir, url, deadline, seed, target=target)
                after = cpu_by_role()
                cpu = {k: round(after[k] - before[k], 3) for k in after}
                (rep_dir / "cpu.json").write_text(json.dumps(cpu) + "\n")
                summary["runs"].append({**row, "way": way, "rep": rep, "cpu_s": cpu})
    sp(["down", "--port", str(PORT)], folder / "down.txt", 120)
    return summary


def cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) so far of vLLM's API server, its engine core and the
    gateway, from /proc: in a burst of short prompts the API server's CPU per request is its
    intake, if it takes requests one at a time on one core."""
    out = {"api_server": 0.0, "engine_core": 0.0, "gateway": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cpu = cpu_s([int(entry.name)])
        except OSError:
            continue
        if comm.startswith("VLLM::EngineCor"):
            out["engine_core"] += cpu
        elif "vllm" in cmdline and ("serve" in cmdline or "api_server" in cmdline):
            out["api_server"] += cpu
        elif "servepilot" in cmdline and ("gateway" in cmdline or "--detached-run-dir" in cmdline):
            # `up --detach` serves the gateway in the background `up` it starts (on
            # 2026-12-06 the probe looked for a gateway process and found none).
            out["gateway"] += cpu
    return out


def uniform_active(tokens: int, experts: int, top_k: int) -> float:
    """Experts that `tokens` tokens touch when each picks `top_k` of `experts` uniformly."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def moe_routing(config: str, out: Path) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the hooks' counts stay readable
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from servepilot.engine.dummy_model import dummy_model_folder
    from servepilot.engine.model_source import ensure_embedded

    folder = dummy_model_folder(CONFIGS[config]["model"]["source"], ensure_embedded)
    cfg = json.loads((folder / "config.json").read_text())
    experts, top_k = int(cfg["n_routed_experts"]), int(cfg["num_experts_per_tok"])
    llm = LLM(model=str(folder), load_format="dummy", enforce_eager=True, max_model_len=4096,
              max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.85,
              seed=0)  # fmt: skip

    def install(model: Any) -> list[str]:
        import torch

        stats: list[tuple[int, int, int]] = []
        gates = [(n, m) for n, m in model.named_modules() if n.endswith("mlp.gate")]

        def hook_for(layer: int) -> Any:
            def hook(_module: Any, _inputs: Any, output: Any) -> None:
                logits = output[0] if isinstance(output, tuple) else output
                picked = logits.float().topk(top_k, dim=-1).indices
                stats.append((layer, int(logits.shape[0]), int(torch.unique(picked).numel())))

            return hook

        for layer, (_, module) in enumerate(gates):
            module.register_forward_hook(hook_for(layer))
        model._servepilot_routing = stats
        return [n for n, _ in gates]

    def take(model: Any) -> list[tuple[int, int, int]]:
        rows = list(model._servepilot_routing)
        model._servepilot_routing.clear()
        return rows

    names = llm.apply_model(install)[0]
    print(f"  {len(names)} routers hooked ({names[:1]} ...)", flush=True)
    rng = random.Random(0)
    result: dict[str, Any] = {"config": config, "experts": experts, "top_k": top_k,
                              "routers": len(names), "decode": [], "prefill": []}  # fmt: skip
    for batch in (1, 4, 16, 64, 256):
        prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(1000, 49_000) for _ in range(1000)])
                   for _ in range(batch)]  # fmt: skip
        params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, seed=batch)
        llm.generate(prompts, params, use_tqdm=False)
        rows = llm.apply_model(take)[0]
        decode = [r for r in rows if r[1] == batch]
        per_layer: dict[int, list[int]] = {}
        for layer, _, active in decode:
            per_layer.setdefault(layer, []).append(active)
        layers = [statistics.mean(v) for _, v in sorted(per_layer.items())]
        entry = {"batch": batch, "forwards": len(decode) // max(1, len(names)),
                 "active_mean": round(statistics.mean(layers), 2) if layers else None,
                 "active_by_layer": [round(v, 1) for v in layers],
                 "uniform": round(uniform_active(batch, experts, top_k), 2)}  # fmt: skip
        result["decode"].append(entry)
        print(f"  decode batch {batch:4d}: experts touched per layer {entry['active_mean']} "
              f"(uniform routing {entry['uniform']}); by layer {entry['active_by_layer']}",
              flush=True)  # fmt: skip
    for tokens in (16, 64, 256, 1024, 4096):
        prompt = TokensPrompt(prompt_token_ids=[rng.randrange(1000, 49_000) for _ in range(tokens)])
        llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
        rows = [r for r in llm.apply_model(take)[0] if r[1] == tokens]
        layers = [active for _, _, active in rows]
        mean = round(statistics.mean(layers), 2) if layers else None
        entry = {"tokens": tokens, "active_mean": mean,
                 "uniform": round(uniform_active(tokens, experts, top_k), 2)}  # fmt: skip
        result["prefill"].append(entry)
        print(f"  prefill {tokens:5d} tokens: experts touched per layer {entry['active_mean']} "
              f"(uniform {entry['uniform']})", flush=True)  # fmt: skip
    (out / f"moe-routing-{config}.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=540.0)
    parser.add_argument("--reuse", action="store_true", help="the fleet is already up")
    parser.add_argument("probe", choices=("bursts", "moe-routing"))
    parser.add_argument("config", choices=sorted(CONFIGS))
    args = parser.parse_args()
    os.environ.update(GPU_ENV)
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    if args.probe == "bursts":
        summary = bursts(args.config, args.out, deadline, args.reuse)
    else:
        summary = moe_routing(args.config, args.out)
    print(json.dumps(summary)[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
