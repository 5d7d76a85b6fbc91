"""Read a vLLM replica's startup log: the KV capacity it found, or why it failed to start."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

# vLLM v1 prints, once the KV cache is allocated (kv_cache_utils.py):
#   "CPU KV cache size: 93,184 tokens"  (GPU on CUDA)
#   "Maximum concurrency for 2,048 tokens per request: 45.50x"
_KV_SIZE = re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: ([\d,]+) tokens")
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
    conc = _CONCURRENCY.findall(log)
    model_len, factor = conc[-1] if conc else (None, None)
    return KvCapacity(
        kv_capacity_tokens=_int(sizes[-1]),
        max_model_len_tokens=_int(model_len) if model_len else None,
        max_concurrency=float(factor.replace(",", "")) if factor else None,
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
        "run `make serve` (or `pip install -e '.[cpu]'`) to install vLLM for CPU",
    ),
)


def diagnose_failure(log: str, exit_code: int | None) -> tuple[str, str | None]:
    """(probable cause, hint) for a replica that exited or stalled before it was ready."""
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
