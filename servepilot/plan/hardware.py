"""The accelerator catalog: what one device holds, moves and computes, and what it costs.

The shipped catalog is servepilot/plan/accelerators.yaml (every number there cites its
source or says "nominal"). `load_catalog(path)` lays a user file with the same schema over
it: an entry naming a known accelerator (or alias) is merged field by field, a new name must
give every required field. Names are matched case-insensitively and in the spellings
nvidia-smi prints ("NVIDIA H100 80GB HBM3" finds h100-80).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servepilot.core.errors import ConfigError
from servepilot.core.yamlfile import parse_yaml, read_user_file
from servepilot.plan.dtypes import BF16_FLAGS, WeightDtype

GIB = 2**30
SHIPPED_CATALOG = "accelerators.yaml"


class AcceleratorKind(enum.StrEnum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One accelerator as the planner sees it. Rates are dense (no 2:4 sparsity)."""

    name: str
    kind: AcceleratorKind
    memory_bytes: int
    """Device total as CUDA reports it (what vLLM multiplies by gpu_memory_utilization);
    on a CPU host, the KV cache space (--kv-cache-memory-bytes): weights sit beside it."""
    hbm_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None
    """None: no FP8 tensor cores (A100); FP8 weights then run weight-only."""
    fp4_flops: float | None
    int8_ops: float | None
    nvlink_bytes_per_s: float | None
    """Per GPU, both directions together (NVIDIA's figure); None: no NVLink."""
    nvlink_domain: int
    """GPUs one NVLink fabric joins (8 on an HGX board, 1 without NVLink)."""
    internode_bytes_per_s: float
    """Network bandwidth of one node (all its NICs together)."""
    price_usd_per_hour: float
    """Per accelerator, on demand."""
    price_source: str
    source: str
    aliases: tuple[str, ...] = ()
    fp32_flops: float | None = None
    """None: not recorded; FP32 work is then costed at the 16-bit rate."""
    bf16_native: bool = True
    """False on CPUs without AVX512-BF16/AMX, where bfloat16 is emulated (slower than fp32)."""
    pcie_bytes_per_s: float | None = None
    """Host link, both directions; the GPUs' only path to each other without NVLink."""
    gpus_per_node: int = 8
    measured_hbm_bandwidth_bytes_per_s: float | None = None
    """What a device-to-device copy reaches (bytes read + written per second); None: not
    measured, the roofline uses the datasheet's `hbm_bandwidth_bytes_per_s`."""
    measured_bf16_flops: float | None = None
    """A large dense BF16 GEMM's rate; None: not measured (datasheet rate used)."""
    measured_fp8_flops: float | None = None
    measured_source: str | None = None
    """How and when the measured ceilings were taken."""
    host_memory_bytes_per_node: int | None = None
    """Host (CPU) memory of one node, which a CPU tier of the KV cache pins; None: not
    recorded, and plan then checks nothing against it."""

    @property
    def roofline_bandwidth_bytes_per_s(self) -> float:
        """The bandwidth ceiling a cost model should use: measured where known."""
        return self.measured_hbm_bandwidth_bytes_per_s or self.hbm_bandwidth_bytes_per_s

    def roofline_flops_for(self, dtype: WeightDtype) -> float:
        """`flops_for`, with the measured rate in its place where one is known: datasheet
        peaks are not reached by real GEMMs (H200: 687 of 989 TFLOP/s in BF16)."""
        rate = self.flops_for(dtype)
        if dtype is WeightDtype.FP8 and self.fp8_flops is not None:
            return self.measured_fp8_flops or rate
        sixteen_bit = dtype is not WeightDtype.FP32 and rate == self.bf16_flops
        if sixteen_bit and self.measured_bf16_flops is not None:
            return self.measured_bf16_flops  # native 16-bit, or weight-only formats
        return rate

    @property
    def ceilings(self) -> str:
        """Where the roofline's ceilings come from, for reports."""
        if self.measured_source:
            return f"measured: {self.measured_source}"
        return "datasheet"

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def tp_domain(self) -> int:
        """The widest tensor-parallel group inside one node: the NVLink domain, or the whole
        node over PCIe for GPUs without NVLink (vLLM runs TP over PCIe, only slower)."""
        if self.kind is AcceleratorKind.CPU:
            return 1
        if self.nvlink_bytes_per_s is None:
            return self.gpus_per_node
        return min(self.nvlink_domain, self.gpus_per_node)

    @property
    def intranode_bytes_per_s(self) -> float | None:
        """GPU-to-GPU bandwidth inside a node: NVLink, else PCIe."""
        return self.nvlink_bytes_per_s or self.pcie_bytes_per_s

    def flops_for(self, dtype: WeightDtype) -> float:
        """Matrix-multiply rate for weights stored as `dtype`.

        Formats the hardware cannot multiply in run weight-only: vLLM dequantizes them inside
        the kernel (Marlin and friends) and multiplies in 16 bits, so they get the 16-bit
        rate: FP8 on A100, INT8 without int8 tensor cores, FP4 before Blackwell, and AWQ/GPTQ
        (4-bit weights, 16-bit activations) everywhere."""
        native = {
            WeightDtype.FP32: self.fp32_flops,
            WeightDtype.FP8: self.fp8_flops,
            WeightDtype.INT8: self.int8_ops,
            WeightDtype.FP4: self.fp4_flops,
        }.get(dtype)
        return self.bf16_flops if native is None else native

    def host_mismatch(self, dtype: WeightDtype, host_flags: frozenset[str]) -> str | None:
        """Why this entry's rates misjudge a CPU host that multiplies bfloat16 natively when
        the entry says it emulates it (the `cpu` entry is an AVX2 machine's figures): costed
        at the emulated rate, every step looks several times slower than it runs. None when
        the entry fits the host (or is a GPU)."""
        sixteen_bit = dtype in (WeightDtype.BF16, WeightDtype.FP16)
        if self.kind is not AcceleratorKind.CPU or self.bf16_native or not sixteen_bit:
            return None
        if not host_flags & BF16_FLAGS:
            return None
        native = ", ".join(sorted(host_flags & BF16_FLAGS))
        return (
            f"this CPU multiplies bfloat16 natively ({native}), but the `{self.name}` "
            "catalog entry costs it at an emulated rate (its figures are an AVX2 machine's): "
            "roofline step times here are too slow; measure this host with `servepilot "
            "calibrate` and pass --profile"
        )

    def supports_native(self, dtype: WeightDtype) -> bool:
        """Whether the hardware multiplies in `dtype` itself (not dequantizing first)."""
        if dtype is WeightDtype.FP32:
            return True
        if dtype in (WeightDtype.BF16, WeightDtype.FP16):
            return self.bf16_native
        return {
            WeightDtype.FP8: self.fp8_flops,
            WeightDtype.INT8: self.int8_ops,
            WeightDtype.FP4: self.fp4_flops,
        }.get(dtype) is not None


# ---- names --------------------------------------------------------------------------------


def normalize_name(text: str) -> str:
    """Lower case, `-` for spaces and underscores, no `nvidia-` prefix: "NVIDIA H100 80GB
    HBM3" (nvidia-smi's name) becomes "h100-80gb-hbm3"."""
    key = "-".join(text.strip().lower().replace("_", " ").split())
    return key.removeprefix("nvidia-")


def accelerator_names(catalog: Mapping[str, Accelerator] | None = None) -> list[str]:
    """Catalog names (not aliases), in catalog order."""
    return list(shipped_catalog() if catalog is None else catalog)


def get_accelerator(name: str, catalog: Mapping[str, Accelerator] | None = None) -> Accelerator:
    """The accelerator called `name` or one of its aliases, in any case."""
    entries = shipped_catalog() if catalog is None else catalog
    key = normalize_name(name)
    for acc in entries.values():
        if key == acc.name or key in acc.aliases:
            return acc
    spellings = [s for acc in entries.values() for s in (acc.name, *acc.aliases)]
    close = difflib.get_close_matches(key, spellings, n=1, cutoff=0.5)
    guess = f"; did you mean `{_owner(entries, close[0])}`?" if close else ""
    raise ConfigError(
        f"unknown accelerator {name!r}{guess}",
        hint=f"known: {', '.join(entries)}; add others in a user catalog file (same schema "
        "as servepilot/plan/accelerators.yaml)",
    )


def _owner(entries: Mapping[str, Accelerator], spelling: str) -> str:
    return next(a.name for a in entries.values() if spelling in (a.name, *a.aliases))


# ---- overrides ----------------------------------------------------------------------------


def with_overrides(
    acc: Accelerator,
    *,
    memory_gib: float | None = None,
    price_usd_per_hour: float | None = None,
    hbm_bandwidth_gb_s: float | None = None,
    bf16_tflops: float | None = None,
) -> Accelerator:
    """A copy with the given numbers replaced (user units: GiB, GB/s, TFLOP/s); each must be
    a finite number > 0. The replaced numbers are noted in `source` / `price_source`."""
    given = {
        "memory_gib": memory_gib,
        "price_usd_per_hour": price_usd_per_hour,
        "hbm_bandwidth_gb_s": hbm_bandwidth_gb_s,
        "bf16_tflops": bf16_tflops,
    }
    for field, value in given.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{field}: must be a number > 0, got {value!r}")
    changes: dict[str, Any] = {}
    noted: list[str] = []
    if memory_gib is not None:
        # int(), like EngineConfig.cpu_kv_cache_bytes, so plan and the launched replica agree
        # on the CPU KV space to the byte.
        changes["memory_bytes"] = int(memory_gib * GIB)
        noted.append(f"memory {memory_gib:g} GiB")
    if hbm_bandwidth_gb_s is not None:
        changes["hbm_bandwidth_bytes_per_s"] = hbm_bandwidth_gb_s * 1e9
        changes["measured_hbm_bandwidth_bytes_per_s"] = None  # the user's figure wins
        noted.append(f"bandwidth {hbm_bandwidth_gb_s:g} GB/s")
    if bf16_tflops is not None:
        changes["bf16_flops"] = bf16_tflops * 1e12
        changes["measured_bf16_flops"] = None
        noted.append(f"bf16 {bf16_tflops:g} TFLOP/s")
    if price_usd_per_hour is not None:
        changes["price_usd_per_hour"] = price_usd_per_hour
        changes["price_source"] = "given by the user"
    if noted:
        changes["source"] = f"{acc.source}; overridden by the user: {', '.join(noted)}"
    return dataclasses.replace(acc, **changes)


# ---- the YAML catalog ---------------------------------------------------------------------


def _rate(*, required: bool = True) -> Any:
    """A rate field: finite and > 0; optional ones may be null (the hardware lacks it)."""
    return Field(gt=0, allow_inf_nan=False) if required else Field(None, gt=0, allow_inf_nan=False)


class _Entry(BaseModel):
    """One catalog entry as written in YAML (field names as in Accelerator)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    kind: AcceleratorKind
    memory_bytes: int = Field(gt=0)
    hbm_bandwidth_bytes_per_s: float = _rate()
    bf16_flops: float = _rate()
    fp32_flops: float | None = _rate(required=False)
    bf16_native: bool = True
    fp8_flops: float | None = _rate(required=False)
    fp4_flops: float | None = _rate(required=False)
    int8_ops: float | None = _rate(required=False)
    nvlink_bytes_per_s: float | None = _rate(required=False)
    nvlink_domain: int = Field(ge=1)
    pcie_bytes_per_s: float | None = _rate(required=False)
    gpus_per_node: int = Field(default=8, ge=1)
    measured_hbm_bandwidth_bytes_per_s: float | None = _rate(required=False)
    measured_bf16_flops: float | None = _rate(required=False)
    measured_fp8_flops: float | None = _rate(required=False)
    measured_source: str | None = None
    host_memory_bytes_per_node: int | None = Field(default=None, gt=0)
    internode_bytes_per_s: float = _rate()
    price_usd_per_hour: float = _rate()
    price_source: str = Field(min_length=1)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _nvlink_domain_has_nvlink(self) -> _Entry:
        if self.nvlink_domain > 1 and self.nvlink_bytes_per_s is None:
            raise ValueError("nvlink_domain > 1 needs nvlink_bytes_per_s (null: no NVLink)")
        return self

    def to_accelerator(self) -> Accelerator:
        values = self.model_dump()
        values["name"] = normalize_name(self.name)
        values["aliases"] = tuple(dict.fromkeys(normalize_name(a) for a in self.aliases))
        return Accelerator(**values)


@functools.cache
def shipped_catalog() -> Mapping[str, Accelerator]:
    """The catalog servepilot ships (read once; read-only)."""
    resource = resources.files("servepilot.plan").joinpath(SHIPPED_CATALOG)
    catalog = _merge({}, resource.read_text(encoding="utf-8"), origin=str(resource))
    return MappingProxyType(catalog)


def load_catalog(path: Path | None = None) -> dict[str, Accelerator]:
    """The shipped catalog, extended and overridden by the user catalog at `path`."""
    catalog = dict(shipped_catalog())
    if path is None:
        return catalog
    text = read_user_file(path, what="accelerator catalog")
    return _merge(catalog, text, origin=str(path))


def _merge(base: dict[str, Accelerator], text: str, *, origin: str) -> dict[str, Accelerator]:
    """`base` with the entries of the YAML `text` laid over it (a new dict)."""
    catalog = dict(base)
    seen: set[str] = set()
    for index, raw in enumerate(_raw_entries(text, origin)):
        where = f"{origin}: accelerators[{index}] ({raw['name']})"
        known = _find(catalog, normalize_name(raw["name"]))
        if known is not None and known.name in seen:
            raise ConfigError(f"{where}: {known.name} appears twice in this file")
        acc = _validate(raw, known, where)
        catalog[acc.name] = acc  # over a known one, the name is kept: its place too
        seen.add(acc.name)
        _check_spellings(catalog, acc, where)
    return catalog


def _raw_entries(text: str, origin: str) -> list[dict[str, Any]]:
    data = parse_yaml(text, origin=origin)
    if not isinstance(data, dict) or set(data) != {"accelerators"}:
        raise ConfigError(
            f"{origin}: expected one top-level key, `accelerators`, holding a list of entries",
            hint="see servepilot/plan/accelerators.yaml for the schema",
        )
    entries = data["accelerators"]
    if not isinstance(entries, list):
        raise ConfigError(f"{origin}: accelerators: expected a list of entries")
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str | int):
            raise ConfigError(f"{origin}: accelerators[{index}]: expected a mapping with a `name`")
        raw["name"] = str(raw["name"])
    return entries


def _validate(raw: dict[str, Any], known: Accelerator | None, where: str) -> Accelerator:
    """Validate one entry; over a known accelerator, the given fields replace its own and
    the given aliases are added to its own."""
    values = dict(raw)
    if known is not None:
        values = {**dataclasses.asdict(known), **raw, "name": known.name}
        values["aliases"] = (*known.aliases, *raw.get("aliases", ()))
    try:
        return _Entry.model_validate(values).to_accelerator()
    except ValidationError as exc:
        lines = [_describe(err) for err in exc.errors()]
        raise ConfigError(
            f"{where} is not valid:\n" + "\n".join(f"  - {line}" for line in lines),
            hint="see servepilot/plan/accelerators.yaml for the fields and their units",
        ) from None


def _describe(err: Any) -> str:
    field = ".".join(str(part) for part in err["loc"]) or "(entry)"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(field, list(_Entry.model_fields), n=1)
        return f"{field}: unknown field" + (f"; did you mean `{close[0]}`?" if close else "")
    if err["type"] == "missing":
        return f"{field}: required (a new accelerator needs every field)"
    return f"{field}: {err['msg']} (got {err.get('input')!r})"


def _find(catalog: Mapping[str, Accelerator], key: str) -> Accelerator | None:
    return next((a for a in catalog.values() if key == a.name or key in a.aliases), None)


def _check_spellings(catalog: Mapping[str, Accelerator], acc: Accelerator, where: str) -> None:
    """Every name and alias must find exactly one accelerator."""
    for other in catalog.values():
        if other is acc:
            continue
        clash = {acc.name, *acc.aliases} & {other.name, *other.aliases}
        if clash:
            raise ConfigError(
                f"{where}: {', '.join(sorted(clash))} already names {other.name}",
                hint="pick another name or alias",
            )
