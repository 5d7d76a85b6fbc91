import json

from servepilot.core.config import Device, EngineConfig, FleetConfig
from servepilot.engine.args import (
    KvEventsPorts,
    ServerSpec,
    cores_shared,
    launch_command,
    server_args,
    server_env,
    split_cores,
    vllm_command,
)
from servepilot.plan.dtypes import resolve_dtype

SPEC = ServerSpec(model_path="/models/m", served_name="m", host="127.0.0.1", port=8123)


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_defaults_render_a_cpu_command() -> None:
    args = server_args(EngineConfig(), SPEC, Device.CPU)
    assert args[:8] == ["--model", "/models/m", "--served-model-name", "m",
                        "--host", "127.0.0.1", "--port", "8123"]  # fmt: skip
    assert _flag(args, "--kv-cache-memory-bytes") == str(2 * 2**30)
    assert _flag(args, "--max-model-len") == "2048"
    assert "--enforce-eager" in args
    assert "--gpu-memory-utilization" not in args
    # Knobs left at None keep vLLM's own defaults: no flag at all.
    for absent in (
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--block-size",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--quantization",
    ):
        assert absent not in args  # fmt: skip


def test_every_knob_becomes_its_vllm_flag() -> None:
    engine = EngineConfig(
        tensor_parallel_size=8, data_parallel_size=2, enable_expert_parallel=True,
        gpu_memory_utilization=0.92, max_model_len=8192, max_num_seqs=64,
        max_num_batched_tokens=8192, enable_chunked_prefill=False, block_size=16,
        quantization="fp8", kv_cache_dtype="fp8", enforce_eager=False,
        enable_prefix_caching=True, extra_args=("--seed", "7"),
    )  # fmt: skip
    args = server_args(engine, SPEC, Device.GPU)
    assert _flag(args, "--tensor-parallel-size") == "8"
    assert _flag(args, "--data-parallel-size") == "2"
    assert "--enable-expert-parallel" in args
    assert _flag(args, "--gpu-memory-utilization") == "0.92"
    assert _flag(args, "--max-num-seqs") == "64"
    assert _flag(args, "--max-num-batched-tokens") == "8192"
    assert _flag(args, "--block-size") == "16"
    assert _flag(args, "--quantization") == "fp8"
    assert _flag(args, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-chunked-prefill" in args
    assert "--enable-prefix-caching" in args
    assert "--enforce-eager" not in args
    assert "--kv-cache-memory-bytes" not in args
    assert args[-2:] == ["--seed", "7"]


def test_fractional_cpu_kv_space_is_exact_bytes() -> None:
    args = server_args(EngineConfig(cpu_kv_cache_space_gib=1.5), SPEC, Device.CPU)
    assert _flag(args, "--kv-cache-memory-bytes") == str(3 * 2**29)


def test_env_pins_cpu_cores_and_passes_user_env() -> None:
    env = server_env(EngineConfig(env={"FOO": "1"}), Device.CPU, (2, 3))
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "2-3", "FOO": "1"}
    assert server_env(EngineConfig(), Device.GPU, ()) == {}


def test_launch_command_uses_the_module_not_the_console_script() -> None:
    cmd = launch_command(EngineConfig(), SPEC, Device.CPU, (0,))
    assert cmd.argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    assert cmd.shell().startswith("VLLM_CPU_OMP_THREADS_BIND=0 ")


def test_cores_are_split_between_replicas() -> None:
    assert split_cores(2, 2, None) == [(0,), (1,)]
    assert split_cores(8, 2, None) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert split_cores(2, 1, None) == [(0, 1)]
    # More replicas than cores: they share, round the ring.
    assert split_cores(2, 3, None) == [(0,), (1,), (0,)]
    assert split_cores(4, 2, 1) == [(0,), (1,)]


def test_auto_dtype_is_float32_on_a_cpu_without_native_bfloat16() -> None:
    avx2 = frozenset({"avx2", "fma"})
    assert resolve_dtype("auto", Device.CPU, avx2) == "float32"
    assert resolve_dtype("auto", Device.CPU, avx2 | {"avx512_bf16"}) == "auto"
    assert resolve_dtype("auto", Device.CPU, avx2 | {"amx_bf16"}) == "auto"
    assert resolve_dtype("auto", Device.GPU, avx2) == "auto"
    assert resolve_dtype("bfloat16", Device.CPU, avx2) == "bfloat16"  # asked for: kept
    args = server_args(EngineConfig(), SPEC, Device.CPU, cpu_features=avx2)
    assert args[args.index("--dtype") + 1] == "float32"


def test_vllm_command_is_the_module_form_on_cpu_and_vllm_serve_on_gpus() -> None:
    cpu = vllm_command(FleetConfig(), "ignored", "smollm2")
    assert "python -m vllm.entrypoints.openai.api_server" in cpu
    assert "--served-model-name smollm2" in cpu and "ignored" not in cpu  # the embedded folder
    gpu = FleetConfig.model_validate(
        {"model": {"source": "llama-3.1-405b"},
         "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8, "nodes": 2},
         "engine": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}}
    )  # fmt: skip
    command = vllm_command(gpu, "meta-llama/Llama-3.1-405B-Instruct", "llama")
    assert command.startswith("vllm serve meta-llama/Llama-3.1-405B-Instruct ")
    # Pipeline stages on several nodes need vLLM's Ray executor.
    assert command.endswith("--distributed-executor-backend ray")
    one_node = gpu.with_overrides({"engine.pipeline_parallel_size": 1, "hardware.nodes": 1})
    assert "ray" not in vllm_command(one_node, "m", "llama")


def test_a_replica_with_kv_event_ports_publishes_there() -> None:
    spec = ServerSpec("/models/m", "m", "127.0.0.1", 8123, kv_events=KvEventsPorts(7001, 7002))
    config = json.loads(_flag(server_args(EngineConfig(), spec, Device.CPU), "--kv-events-config"))
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:7001",
        "replay_endpoint": "tcp://*:7002",
    }
    quiet = server_args(EngineConfig(kv_events=False), spec, Device.CPU)
    assert "--kv-events-config" not in quiet
    assert "--kv-events-config" not in server_args(EngineConfig(), SPEC, Device.CPU)


def test_printed_and_kubernetes_commands_publish_on_vllms_default_ports() -> None:
    command = vllm_command(FleetConfig(), "/models/m", "m")
    assert "tcp://*:5557" in command and "tcp://*:5558" in command


def test_replicas_that_share_cores_are_left_unbound_with_their_threads() -> None:
    # Three replica slots on two cores: split_cores gives two of them core 0. Binding both
    # there would leave core 1 idle when they are busy (and binding onto a busy core waited
    # minutes in this machine's kernel): they run unbound, one OpenMP thread each.
    assert split_cores(2, 3, None) == [(0,), (1,), (0,)]
    assert cores_shared(2, 3, None) and cores_shared(2, 3, 1) and cores_shared(4, 2, 3)
    assert not cores_shared(2, 2, None) and not cores_shared(8, 2, None)
    assert not cores_shared(4, 2, 1) and not cores_shared(2, 1, None)
    env = server_env(EngineConfig(env={"FOO": "1"}), Device.CPU, (0,), cores_shared=True)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "FOO": "1"}
    # The user's engine.env still has the last word.
    mine = EngineConfig(env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    assert (
        server_env(mine, Device.CPU, (0, 1), cores_shared=True)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    )
    assert (
        server_env(EngineConfig(), Device.CPU, (0, 1), cores_shared=True)["OMP_NUM_THREADS"] == "2"
    )
