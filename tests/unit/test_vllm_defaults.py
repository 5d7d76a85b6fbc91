"""servepilot/core/vllm_defaults.py against the installed vLLM's own logic: a vLLM upgrade
that changes a default fails here."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

import pytest

from servepilot.core.config import Device
from servepilot.core.vllm_defaults import UsageContext, VllmDefaults, vllm_defaults

GIB = 2**30


@dataclass(frozen=True)
class _Platform:
    """The four questions EngineArgs.get_batch_defaults asks vLLM's current platform."""

    cpu: bool
    memory_bytes: int = 0
    name: str = ""

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return self.memory_bytes

    def get_device_name(self, device_id: int = 0) -> str:
        return self.name

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return self.cpu


def _vllms(
    monkeypatch: pytest.MonkeyPatch, platform: _Platform, world_size: int = 1
) -> dict[UsageContext, tuple[int, int]]:
    """(max_num_seqs, max_num_batched_tokens) by usage context, as vLLM computes them on
    `platform`."""
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext as VllmUsage

    monkeypatch.setattr(arg_utils, "current_platform", platform)
    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size)
    ours = {
        UsageContext.OPENAI_API_SERVER: VllmUsage.OPENAI_API_SERVER,
        UsageContext.LLM_CLASS: VllmUsage.LLM_CLASS,
    }
    return {usage: (seqs[theirs], tokens[theirs]) for usage, theirs in ours.items()}


def _ours(device: Device, memory_gib: float, name: str, world_size: int = 1) -> dict[Any, Any]:
    found = {}
    for usage in UsageContext:
        d = vllm_defaults(device, memory_gib, device_name=name, usage=usage, world_size=world_size)
        found[usage] = (d.max_num_seqs, d.max_num_batched_tokens)
    return found


@pytest.mark.parametrize(
    ("name", "memory_bytes"),
    [
        ("NVIDIA L4", 22 * GIB),  # below the threshold
        ("NVIDIA A100-SXM4-80GB", 80 * GIB),  # above it, but an A100
        ("NVIDIA H100 80GB HBM3", 85_520_809_984),  # above it (CUDA's 79.6 GiB)
        ("NVIDIA H200", 141 * GIB),
        ("NVIDIA B200", 179 * GIB),  # the largest class
        ("", 0),  # vLLM could not ask the device (Ray's driver without GPUs)
    ],
)
def test_gpu_defaults_are_vllms(
    monkeypatch: pytest.MonkeyPatch, name: str, memory_bytes: int
) -> None:
    vllms = _vllms(monkeypatch, _Platform(cpu=False, memory_bytes=memory_bytes, name=name))
    assert _ours(Device.GPU, memory_bytes / GIB, name) == vllms


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_cpu_defaults_are_vllms(monkeypatch: pytest.MonkeyPatch, world_size: int) -> None:
    vllms = _vllms(monkeypatch, _Platform(cpu=True, memory_bytes=64 * GIB), world_size)
    assert _ours(Device.CPU, 64, "cpu", world_size) == vllms


def test_known_answers() -> None:
    """The numbers plan, admission and doctor act on, written out."""
    assert vllm_defaults(Device.CPU, 0) == VllmDefaults(128, 2048, 128)
    assert vllm_defaults(Device.GPU, 141, device_name="h200-141") == VllmDefaults(1024, 8192, 16)
    assert vllm_defaults(Device.GPU, 80, device_name="a100-80").max_num_seqs == 256
    assert vllm_defaults(Device.GPU, 48, device_name="l40s-48").max_num_seqs == 256


def test_block_sizes_are_vllms() -> None:
    """CUDA's default is CacheConfig's constant; CPU's is set in CpuPlatform's
    check_and_update_config, which needs a whole VllmConfig, so its assignment is read."""
    from vllm.config.cache import CacheConfig
    from vllm.platforms.cpu import CpuPlatform

    assert vllm_defaults(Device.GPU, 80).block_size_tokens == CacheConfig.DEFAULT_BLOCK_SIZE
    source = inspect.getsource(CpuPlatform.check_and_update_config)
    unspecified = re.search(
        r"elif not cache_config\.user_specified_block_size:\s+cache_config\.block_size = (\d+)",
        source,
    )
    assert unspecified is not None
    assert vllm_defaults(Device.CPU, 0).block_size_tokens == int(unspecified.group(1))
