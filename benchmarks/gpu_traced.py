"""What step traces of vLLM measured, written into the profiles' meta (gpu_sim_report.py
--eager-traces, --decode-traces): the host's time to launch an eager step, and decode
attention as vLLM's own kernels ran it against the profile's operators."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_sim_cases import PROFILES
from benchmarks.gpu_sim_report import write_meta
from servepilot.plan.gpu_profile.table import load_gpu_profile


def eager_steps(trace_folders: list[Path]) -> dict[tuple[str, str], dict[str, float]]:
    """Per profile (model, dtype), the host's time for an eager step from the burst traces:
    `eager_step_ms` (a prefill alone) and `eager_mixed_step_ms` (with decoders), where
    measured."""
    from benchmarks.gpu_step_report import eager_step_ms

    found: dict[tuple[str, str], dict[str, float]] = {}
    for profile, config_dirs in _by_profile(trace_folders).items():
        for key, mixed in (("eager_step_ms", False), ("eager_mixed_step_ms", True)):
            ms = eager_step_ms(config_dirs, mixed=mixed)
            if ms is not None:
                found.setdefault(profile, {})[key] = round(ms, 1)
    return found


def eager_hosts(trace_folders: list[Path]) -> dict[tuple[str, str], dict[str, float]]:
    """Per profile (model, dtype), the host's time between eager launches
    (`eager_host_ms`, `eager_host_us_per_seq`: gpu_step_report.eager_host_fit) from burst
    traces whose steps' kernels were joined to them (gpu_step_trace.py since 2026-12-07)."""
    from benchmarks.gpu_step_report import eager_host_fit

    found: dict[tuple[str, str], dict[str, float]] = {}
    for profile, config_dirs in _by_profile(trace_folders).items():
        if (host := eager_host_fit(config_dirs)) is not None:
            found[profile] = {"eager_host_ms": round(host[0], 2),
                              "eager_host_us_per_seq": round(host[1], 1)}  # fmt: skip
    return found


def _by_profile(trace_folders: list[Path]) -> dict[tuple[str, str], list[Path]]:
    dirs: dict[tuple[str, str], list[Path]] = {}
    for folder in trace_folders:
        for config_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            dirs.setdefault(PROFILES[config_dir.name], []).append(config_dir)
    return dirs


def write_traced(profiles: Path, found: dict[tuple[str, str], dict[str, float]]) -> None:
    """Into each profile's meta, what step traces measured of it; a profile of a weight
    format no trace measured takes another format's of the same model (one host launching
    the same model's layers, with fewer or more kernels: FP8 adds its activations'
    quantisation; the same attention kernels over the same bfloat16 KV cache)."""
    for (model, dtype), measured in sorted(found.items()):
        write_meta(profiles, model, measured, dtype=dtype)
    for (model, _), measured in sorted(found.items()):
        for path in sorted(profiles.glob("*.json")):
            doc = json.loads(path.read_text())
            if doc["model"] == model and (model, doc["dtype"]) not in found:
                write_meta(profiles, model, measured, dtype=doc["dtype"])


def decode_attention(
    trace_folders: list[Path], folders: list[Path]
) -> dict[tuple[str, str], dict[str, float]]:
    """Per profile (model, dtype) that the decode traces in `trace_folders` measured, vLLM's
    decode attention against its operators' (gpu_step_report.attention_fit), composed with
    the profile of the first of `folders` that has one."""
    from benchmarks.gpu_step_report import attention_fit

    found: dict[tuple[str, str], dict[str, float]] = {}
    for folder in trace_folders:
        for config_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            model, dtype = PROFILES[config_dir.name]
            paths = [
                p
                for f in folders
                for p in sorted((f / "profiles").glob(f"*-{dtype}.json"))
                if json.loads(p.read_text())["model"] == model
            ]
            if not paths or (model, dtype) in found:
                continue
            fit = attention_fit([config_dir], load_gpu_profile(paths[0]))
            if fit is not None:
                found[(model, dtype)] = {"decode_attention_us": round(fit[0], 1),
                                         "decode_attention_scale": round(fit[1], 3)}  # fmt: skip
    return found


def write_traces(
    eager_traces: list[Path],
    decode_traces: list[Path],
    folders: list[Path],
    host_traces: list[Path],
) -> None:
    """What the burst traces (`eager_traces`: the host's eager steps; `host_traces`: its time
    between them) and the decode traces (vLLM's decode attention) measured, into the
    profiles of every folder; each said."""
    measured = [
        ("eager steps (host ms)", eager_steps(eager_traces) if eager_traces else {}),
        ("between eager launches", eager_hosts(host_traces) if host_traces else {}),
        ("decode attention (vLLM's kernels against the operators)",
         decode_attention(decode_traces, folders) if decode_traces else {}),
    ]  # fmt: skip
    for what, found in measured:
        for folder in folders:
            write_traced(folder / "profiles", found)
        for (model, dtype), values in found.items():
            print(f"{what} of {model} {dtype}: {values}")
