"""The accelerator catalog: known answers, names, the precision matrix, overrides, user files."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from servepilot.core.config import EngineConfig
from servepilot.core.errors import ConfigError
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.hardware import (
    GIB,
    Accelerator,
    AcceleratorKind,
    accelerator_names,
    get_accelerator,
    load_catalog,
    with_overrides,
)

SHIPPED = ["cpu", "a100-40", "a100-80", "h100-80", "h200-141", "b200", "l40s"]


def test_the_shipped_catalog_holds_the_seven_accelerators_in_order() -> None:
    assert accelerator_names() == SHIPPED
    assert list(load_catalog()) == SHIPPED


def test_h100_known_answers() -> None:
    h100 = get_accelerator("h100-80")
    assert h100.kind is AcceleratorKind.GPU
    # CUDA's device total on CUDA 12.8 drivers (deviceQuery: 81090 MiB), not "80 GB".
    assert h100.memory_bytes == 85_028_896_768
    assert h100.memory_gib == pytest.approx(79.19, abs=0.005)
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h100.bf16_flops == pytest.approx(989.4e12)  # dense: half the sparse 1,979
    assert h100.fp8_flops == pytest.approx(1978.9e12)
    assert h100.nvlink_bytes_per_s == 900e9
    assert h100.nvlink_domain == 8
    assert h100.internode_bytes_per_s == 400e9  # 8 x 400 Gb/s


@pytest.mark.parametrize(
    ("name", "gib", "bandwidth", "bf16"),
    [
        ("a100-40", 39.59, 1.555e12, 312e12),
        ("a100-80", 79.15, 2.039e12, 312e12),
        ("h200-141", 139.80, 4.8e12, 989.4e12),
        ("b200", 178.35, 8.0e12, 2.25e15),
        ("l40s", 44.52, 864e9, 362.05e12),  # 362.05 is the datasheet's dense figure
    ],
)
def test_data_sheet_numbers(name: str, gib: float, bandwidth: float, bf16: float) -> None:
    acc = get_accelerator(name)
    assert acc.memory_gib == pytest.approx(gib, abs=0.005)
    assert acc.hbm_bandwidth_bytes_per_s == pytest.approx(bandwidth)
    assert acc.bf16_flops == pytest.approx(bf16)


def test_every_entry_names_its_sources() -> None:
    for acc in load_catalog().values():
        assert acc.source.strip() and acc.price_source.strip(), acc.name
        assert acc.price_usd_per_hour > 0
    assert "nominal" in get_accelerator("cpu").price_source


def test_cpu_memory_is_servepilots_default_kv_space() -> None:
    cpu = get_accelerator("cpu")
    assert cpu.kind is AcceleratorKind.CPU
    assert cpu.memory_bytes == int(EngineConfig().cpu_kv_cache_space_gib * GIB)
    assert cpu.tp_domain == 1


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("h100", "h100-80"),
        ("H100-SXM", "h100-80"),
        ("h100_sxm5", "h100-80"),
        ("NVIDIA H100 80GB HBM3", "h100-80"),  # as nvidia-smi prints it
        ("a100", "a100-80"),
        ("NVIDIA A100-SXM4-40GB", "a100-40"),
        ("H200", "h200-141"),
        ("NVIDIA B200", "b200"),
        ("L40S", "l40s"),
        ("  CPU ", "cpu"),
    ],
)
def test_aliases_and_case(spelling: str, name: str) -> None:
    assert get_accelerator(spelling).name == name


def test_unknown_names_list_the_catalog_with_a_guess() -> None:
    with pytest.raises(ConfigError) as err:
        get_accelerator("h10")
    text = str(err.value)
    assert "did you mean `h100-80`" in text
    assert all(name in text for name in SHIPPED)
    with pytest.raises(ConfigError, match="unknown accelerator 'tpu-v5'"):
        get_accelerator("tpu-v5")


@pytest.mark.parametrize(
    ("name", "fp8", "fp4", "int8"),
    [
        ("cpu", False, False, False),
        ("a100-40", False, False, True),
        ("a100-80", False, False, True),
        ("h100-80", True, False, True),
        ("h200-141", True, False, True),
        ("b200", True, True, True),
        ("l40s", True, False, True),  # Ada has FP8 tensor cores
    ],
)
def test_native_precision_matrix(name: str, fp8: bool, fp4: bool, int8: bool) -> None:
    acc = get_accelerator(name)
    assert acc.supports_native(WeightDtype.FP8) is fp8
    assert acc.supports_native(WeightDtype.FP4) is fp4
    assert acc.supports_native(WeightDtype.INT8) is int8
    assert acc.supports_native(WeightDtype.FP32)
    # 4-bit AWQ/GPTQ weights are dequantized to 16 bits before every multiply.
    assert not acc.supports_native(WeightDtype.AWQ)
    assert acc.flops_for(WeightDtype.AWQ) == acc.bf16_flops


def test_formats_without_hardware_support_run_at_the_16_bit_rate() -> None:
    a100 = get_accelerator("a100-80")
    assert a100.flops_for(WeightDtype.FP8) == a100.bf16_flops  # weight-only FP8 (Marlin)
    assert a100.flops_for(WeightDtype.INT8) == 624e12
    h100 = get_accelerator("h100-80")
    assert h100.flops_for(WeightDtype.FP8) == pytest.approx(2 * h100.bf16_flops, rel=1e-3)
    assert h100.flops_for(WeightDtype.FP4) == h100.bf16_flops
    assert get_accelerator("b200").flops_for(WeightDtype.FP4) == 9e15
    assert h100.flops_for(WeightDtype.FP32) == pytest.approx(66.9e12)


def test_bf16_is_emulated_on_the_avx2_cpu() -> None:
    cpu = get_accelerator("cpu")
    assert not cpu.supports_native(WeightDtype.BF16)
    assert cpu.flops_for(WeightDtype.FP32) > cpu.flops_for(WeightDtype.BF16)
    assert get_accelerator("h100").supports_native(WeightDtype.BF16)


def test_l40s_has_no_nvlink_but_runs_tp_over_pcie() -> None:
    l40s = get_accelerator("l40s")
    assert l40s.nvlink_bytes_per_s is None
    assert l40s.nvlink_domain == 1
    assert l40s.tp_domain == 8
    assert l40s.intranode_bytes_per_s == 64e9
    assert get_accelerator("h100").intranode_bytes_per_s == 900e9


# ---- overrides ----------------------------------------------------------------------------


def test_overrides_replace_numbers_and_say_so() -> None:
    cpu = get_accelerator("cpu")
    changed = with_overrides(
        cpu, memory_gib=0.5, price_usd_per_hour=0.25, hbm_bandwidth_gb_s=12, bf16_tflops=0.05
    )
    assert changed.memory_bytes == 536_870_912 == int(0.5 * GIB)
    assert changed.price_usd_per_hour == 0.25
    assert changed.price_source == "given by the user"
    assert changed.hbm_bandwidth_bytes_per_s == 12e9
    assert changed.bf16_flops == pytest.approx(50e9)
    assert "overridden by the user: memory 0.5 GiB" in changed.source
    assert cpu.memory_bytes == 2 * GIB  # the catalog's own is untouched
    assert with_overrides(cpu) == cpu


@pytest.mark.parametrize(
    "field", ["memory_gib", "price_usd_per_hour", "hbm_bandwidth_gb_s", "bf16_tflops"]
)
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_override_errors_name_the_field(field: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: must be a number > 0"):
        with_overrides(get_accelerator("h100"), **{field: bad})


# ---- user catalogs ------------------------------------------------------------------------

MI300X = """\
  - name: MI300X
    aliases: [mi300x-192]
    kind: gpu
    memory_bytes: 205_822_885_888
    hbm_bandwidth_bytes_per_s: 5.3e+12
    bf16_flops: 1307.4e+12
    fp8_flops: 2614.9e+12
    int8_ops: 2614.9e+12
    nvlink_bytes_per_s: 896.0e+9
    nvlink_domain: 8
    internode_bytes_per_s: 400.0e+9
    price_usd_per_hour: 4.0
    price_source: our contract
    source: test entry
"""


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my-accelerators.yaml"
    path.write_text(body, encoding="utf-8")
    return path


def test_a_user_catalog_extends_and_overrides_the_shipped_one(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "accelerators:\n" + MI300X + "  - name: H100\n"
        "    aliases: [our-h100]\n"
        "    price_usd_per_hour: 2.49\n"
        "    price_source: reserved, 1 year\n",
    )
    catalog = load_catalog(path)
    assert list(catalog) == [*SHIPPED, "mi300x"]  # overrides keep their place
    mi300x = get_accelerator("MI300X-192", catalog)
    assert mi300x.name == "mi300x"
    assert mi300x.fp4_flops is None and mi300x.gpus_per_node == 8  # optional fields
    h100 = catalog["h100-80"]
    assert (h100.price_usd_per_hour, h100.price_source) == (2.49, "reserved, 1 year")
    shipped = get_accelerator("h100-80")
    assert h100.aliases == (*shipped.aliases, "our-h100")  # given aliases are added
    assert get_accelerator("our-h100", catalog) is h100
    assert h100.memory_bytes == shipped.memory_bytes  # fields not given are kept
    assert shipped.price_usd_per_hour != 2.49  # the shipped catalog is untouched
    with pytest.raises(ConfigError):
        get_accelerator("mi300x")


def _error(tmp_path: Path, body: str) -> str:
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_catalog(path)
    text = str(err.value)
    assert str(path) in text
    return text


def test_a_new_entry_must_give_every_required_field(tmp_path: Path) -> None:
    text = _error(tmp_path, "accelerators:\n  - name: tpu-v5e\n    kind: gpu\n")
    assert "accelerators[0] (tpu-v5e)" in text
    assert "memory_bytes: required" in text
    assert "hbm_bandwidth_bytes_per_s: required" in text


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("memory_bytes: -1", "memory_bytes: Input should be greater than 0"),
        ("hbm_bandwith_bytes_per_s: 1", "did you mean `hbm_bandwidth_bytes_per_s`"),
        ("kind: fpga", "kind: Input should be 'cpu' or 'gpu'"),
        ("bf16_flops: .inf", "bf16_flops: Input should be a finite number"),
        ("nvlink_bytes_per_s: null", "nvlink_domain > 1 needs nvlink_bytes_per_s"),
    ],
)
def test_bad_fields_name_the_file_entry_and_field(
    tmp_path: Path, change: str, expected: str
) -> None:
    field = change.split(":")[0]
    lines = [line for line in MI300X.splitlines() if not line.strip().startswith(field)]
    text = _error(tmp_path, "accelerators:\n" + "\n".join([*lines, f"    {change}"]) + "\n")
    assert "accelerators[0] (MI300X)" in text
    assert expected in text


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("accelerators: [\n", "not valid YAML at line"),
        ("gpus:\n  - name: x\n", "expected one top-level key, `accelerators`"),
        ("accelerators:\n  - kind: gpu\n", "accelerators[0]: expected a mapping with a `name`"),
        (
            "accelerators:\n  - name: x100\n    aliases: [h100]\n"
            + MI300X[MI300X.index("    kind") :],
            "h100 already names h100-80",
        ),
        (
            "accelerators:\n  - name: h100\n    price_usd_per_hour: 1\n"
            "  - name: h100-sxm\n    price_usd_per_hour: 2\n",
            "h100-80 appears twice",
        ),
    ],
)
def test_bad_files_give_a_clear_error(tmp_path: Path, body: str, expected: str) -> None:
    assert expected in _error(tmp_path, body)


def test_a_missing_catalog_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_catalog(tmp_path / "absent.yaml")


def test_accelerators_are_frozen() -> None:
    acc = get_accelerator("cpu")
    assert isinstance(acc, Accelerator)
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.memory_bytes = 1  # type: ignore[misc]


def test_the_cpu_entry_says_it_misjudges_a_host_with_native_bfloat16() -> None:
    cpu, h100 = get_accelerator("cpu"), get_accelerator("h100-80")
    amx = frozenset({"avx2", "amx_bf16"})
    avx2 = frozenset({"avx2", "fma"})
    note = cpu.host_mismatch(WeightDtype.BF16, amx)
    assert note is not None and "(amx_bf16)" in note and "`cpu` catalog entry" in note
    # The entry fits: an AVX2 host emulates bf16 as the entry does; fp32 has its own rate.
    assert cpu.host_mismatch(WeightDtype.BF16, avx2) is None
    assert cpu.host_mismatch(WeightDtype.FP32, amx) is None
    # An entry that multiplies bf16 natively, or a GPU, never misjudges the host's CPU.
    assert dataclasses.replace(cpu, bf16_native=True).host_mismatch(WeightDtype.BF16, amx) is None
    assert h100.host_mismatch(WeightDtype.BF16, amx) is None
