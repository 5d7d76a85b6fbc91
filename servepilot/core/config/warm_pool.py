"""The warm pool's rules over the whole fleet configuration (replicas.asleep,
engine.sleep_mode), checked by `up` once the flags are applied: `--replicas` sets
replicas.count after fleet.yaml is read, so a field validator would judge too early.

How the pool holds its replicas: asleep (vLLM's sleep mode, engine.sleep_mode: true: weights
in host memory, GPU memory freed, woken in about a second), or, where the engine has no sleep
mode to use (hardware.device: cpu without engine.sleep_mode), parked: loaded and running, out
of rotation, back at once, holding all its memory."""

from __future__ import annotations

from servepilot.core.config.engine import EngineKind
from servepilot.core.config.fleet import FleetConfig
from servepilot.core.config.hardware import Device
from servepilot.core.errors import ConfigError


def check_warm_pool(config: FleetConfig) -> None:
    """ConfigError, naming the fields, when replicas.asleep or engine.sleep_mode cannot be
    served as set."""
    problem = _warm_pool_problem(config)
    if problem is not None:
        raise ConfigError(problem, hint="see `servepilot config` (replicas.asleep)")


def pool_parks(config: FleetConfig) -> bool:
    """Whether the warm pool parks its replicas (no sleep mode) rather than putting them to
    sleep; meaningful once `check_warm_pool` passed."""
    return config.replicas.asleep > 0 and not config.engine.sleep_mode


def _warm_pool_problem(config: FleetConfig) -> str | None:
    asleep, engine = config.replicas.asleep, config.engine
    if 0 < config.replicas.count <= asleep:
        return (
            f"replicas.asleep ({asleep}) must be below replicas.count "
            f"({config.replicas.count}): at least one replica serves"
        )
    on_cpu = config.hardware.device is Device.CPU
    if asleep > 0 and not engine.sleep_mode and not on_cpu:
        return (
            "replicas.asleep > 0 needs engine.sleep_mode: true (vLLM's --enable-sleep-mode); "
            "only on hardware.device: cpu are replicas parked without it"
        )
    if engine.sleep_mode and engine.kind is EngineKind.VLLM and on_cpu:
        return (
            "engine.sleep_mode needs hardware.device: gpu (vLLM's sleep mode is CUDA-only); "
            "engine.kind: sim models it on CPU; without it, replicas.asleep parks replicas"
        )
    return None
