"""engine.kv_offload_gib: the CPU tier of a GPU replica's KV cache, from fleet.yaml to vLLM's
flags, the plan's second KV figure (as vLLM's CPUOffloadingSpec sizes it) and the pods'
memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from servepilot.cli.main import main
from servepilot.core.config import Device, EngineConfig, KvOffloadBackend, parse_config
from servepilot.core.errors import ConfigError
from servepilot.engine.args import ServerSpec, server_args
from servepilot.plan import report
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.export import plan_json
from servepilot.plan.kv import kv_cache_shape
from servepilot.plan.kv_offload import KvOffload, cpu_tier_tokens
from servepilot.plan.parallel import Parallelism
from servepilot.plan.planner import make_plan
from servepilot.plan.presets import load_model
from servepilot.plan.request import PlanRequest
from tests.unit.k8s_support import by_kind, rendered

SPEC = ServerSpec(model_path="/m", served_name="m", host="127.0.0.1", port=8000)
GIB = 2**30
LLAMA_8B: dict[str, Any] = {
    "model": {"source": "llama-3.1-8b", "weights": "dummy"},
    "hardware": {"device": "gpu", "accelerator": "h200-141", "count": 1},
}


def _fleet(engine: dict[str, Any], **hardware: Any) -> Any:
    data = {**LLAMA_8B, "engine": engine, "kubernetes": {"model_path": "/models/llama"}}
    data["hardware"] = {**LLAMA_8B["hardware"], **hardware}
    return parse_config(data, origin="test")


def _plan(engine: dict[str, Any], **hardware: Any) -> Any:
    return make_plan(PlanRequest.from_fleet(_fleet(engine, **hardware), frozenset()))


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_size_and_backend_become_vllms_flags_on_gpus_only() -> None:
    engine = EngineConfig(kv_offload_gib=128)
    args = server_args(engine, SPEC, Device.GPU)
    assert _flag(args, "--kv-offloading-size") == "128"
    assert _flag(args, "--kv-offloading-backend") == "native"
    lmcache = EngineConfig(kv_offload_gib=1.5, kv_offload_backend=KvOffloadBackend.LMCACHE)
    args = server_args(lmcache, SPEC, Device.GPU)
    assert _flag(args, "--kv-offloading-size") == "1.5"
    assert _flag(args, "--kv-offloading-backend") == "lmcache"
    assert "--kv-offloading-size" not in server_args(EngineConfig(), SPEC, Device.GPU)


def test_fleet_yaml_refuses_it_on_cpu_and_a_size_of_zero() -> None:
    with pytest.raises(ConfigError, match=r"kv_offload_gib needs hardware\.device: gpu"):
        parse_config({"engine": {"kv_offload_gib": 8}}, origin="test")
    with pytest.raises(ConfigError, match=r"engine\.kv_offload_gib"):
        _fleet({"kv_offload_gib": 0})
    with pytest.raises(ConfigError, match=r"engine\.kv_offload_backend"):
        _fleet({"kv_offload_gib": 8, "kv_offload_backend": "disk"})
    sim = _fleet({"kind": "sim", "kv_offload_gib": 8})
    assert sim.engine.kv_offload_gib == 8
    with pytest.raises(ConfigError, match="kv_offload_gib with the cpu accelerator"):
        _plan({"kv_offload_gib": 8}, accelerator="cpu")


def test_llama_8b_holds_8192_tokens_per_gib_in_whole_blocks_at_any_tp() -> None:
    # 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B a token; 16-token blocks of 2 MiB.
    spec = load_model("llama-3.1-8b")
    for tp in (1, 2):
        shape = kv_cache_shape(spec, kv_dtype=KvDtype.AUTO, compute_dtype=WeightDtype.BF16, tp=tp)
        par = Parallelism(tp=tp)
        assert cpu_tier_tokens(KvOffload(8), shape, par) == 65_536
        # 8 GiB + 3 MiB: one more whole 2 MiB block, the odd MiB is left unused.
        assert cpu_tier_tokens(KvOffload(8 + 3 / 1024), shape, par) == 65_536 + 16
    # PP 2: a rank holds 16 layers' 1 MiB block, x world_size 2 = the same 2 MiB.
    staged = kv_cache_shape(spec, kv_dtype=KvDtype.AUTO, compute_dtype=WeightDtype.BF16, pp=2)
    assert cpu_tier_tokens(KvOffload(8), staged, Parallelism(pp=2)) == 65_536
    # fp8 KV halves the bytes: twice the tokens.
    fp8 = kv_cache_shape(spec, kv_dtype=KvDtype.FP8, compute_dtype=WeightDtype.BF16)
    assert cpu_tier_tokens(KvOffload(8), fp8, Parallelism()) == 131_072
    shape = kv_cache_shape(spec, kv_dtype=KvDtype.AUTO, compute_dtype=WeightDtype.BF16)
    # Each data-parallel engine gets its own tier of the given size.
    assert cpu_tier_tokens(KvOffload(8), shape, Parallelism(dp=2)) == 131_072


def test_plan_text_and_json_show_the_host_tier_beside_the_gpu() -> None:
    plan = _plan({"kv_offload_gib": 128})
    assert plan.option.kv_cpu_tokens == 1_048_576
    line = report.kv_line(plan)
    gpu = f"{plan.option.kv_capacity_tokens:,} tokens per replica on the GPU"
    assert f"{gpu} + 1,048,576 in host memory (128 GiB, native offloading)" in line
    assert "pinned when the replicas start" in (report.host_tier_line(plan) or "")
    data = plan_json(plan)
    assert data["kv_cpu_tokens"] == 1_048_576
    assert data["kv_offload"] == {
        "size_gib": 128.0,
        "backend": "native",
        "host_bytes_per_replica": 128 * GIB,
        "host_bytes_per_node": 128 * GIB,
    }
    off = plan_json(_plan({}))
    assert off["kv_cpu_tokens"] is None and off["kv_offload"] is None
    assert report.host_tier_line(_plan({})) is None


def _catalog(tmp_path: Path, host_gib: int) -> str:
    path = tmp_path / "catalog.yaml"
    entry = {"name": "h200-141", "host_memory_bytes_per_node": host_gib * GIB}
    path.write_text(yaml.safe_dump({"accelerators": [entry]}))
    return str(path)


def test_the_replicas_of_a_node_must_fit_its_host_memory_when_the_catalog_knows_it(
    tmp_path: Path,
) -> None:
    # 8 replicas of TP1 on one node pin 8 x 200 GiB = 1,600 GiB.
    engine = {"kv_offload_gib": 200}
    with pytest.raises(ConfigError, match=r"8 replica\(s\) per node pin 1,600.0 GiB"):
        _plan(engine, count=8, catalog=_catalog(tmp_path, 1024))
    fits = _plan(engine, count=8, catalog=_catalog(tmp_path, 2048))
    assert "1,600.0 GiB per node of its 2,048.0 GiB" in (report.host_tier_line(fits) or "")
    # The shipped catalog records no host memory: nothing is checked, nothing invented.
    unknown = _plan(engine, count=8)
    assert unknown.fits and "of its" not in (report.host_tier_line(unknown) or "")


def test_plan_out_and_the_pods_carry_the_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "fleet.yaml", tmp_path / "planned.yaml"
    source.write_text(yaml.safe_dump({**LLAMA_8B, "engine": {"kv_offload_gib": 64}}))
    assert main(["plan", "-c", str(source), "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["engine"]["kv_offload_gib"] == 64
    capsys.readouterr()
    assert main(["plan", "-c", str(source), "--json"]) == 0
    command = json.loads(capsys.readouterr().out)["vllm_command"]
    assert "--kv-offloading-size 64 --kv-offloading-backend native" in command
    container = _replica_container(_fleet({"kv_offload_gib": 64}))
    assert "--kv-offloading-size 64" in " ".join(container["command"])
    limits = container["resources"]["limits"]
    plain_limits = _replica_container(_fleet({}))["resources"]["limits"]
    # The pod's memory limit grows by the pinned tier (one GPU a replica: all of it).
    assert int(limits["memory"].removesuffix("Gi")) == (
        int(plain_limits["memory"].removesuffix("Gi")) + 64
    )


def _replica_container(config: Any) -> dict[str, Any]:
    (container,) = [
        c
        for d in by_kind(rendered(config), "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        if "nvidia.com/gpu" in c["resources"]["limits"]
    ]
    return container
