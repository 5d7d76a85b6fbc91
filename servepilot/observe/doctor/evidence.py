"""What doctor looks at, recorded: metrics pages, replica logs and facts of the environment.

The rules are pure functions of an `Evidence`, so a case seen on one machine can be saved
(`servepilot doctor --save DIR`) and diagnosed again anywhere, and the tests replay recorded
cases (tests/data/doctor/). The folder holds `fleet.yaml`, `gateway.metrics`, per replica
`<id>.metrics` and `<id>.log`, and `env.json`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servepilot.core.config import FleetConfig, load_config
from servepilot.core.errors import EngineError
from servepilot.engine.metrics import Scrape, scrape

GATEWAY_PAGE = "gateway.metrics"
ENV_FILE = "env.json"
CONFIG_FILE = "fleet.yaml"


@dataclass(frozen=True, slots=True)
class ReplicaEvidence:
    replica_id: str
    metrics: str | None = None
    """The replica's /metrics text; None when it did not answer."""
    log: str = ""
    """The replica's log (its startup lines and what vLLM printed since); "" when unknown."""


@dataclass(frozen=True, slots=True)
class EnvFacts:
    shm_bytes: int | None = None
    """Size of /dev/shm; None when there is none to measure."""
    cpu_flags: frozenset[str] = frozenset()
    gpu_topology: str | None = None
    """`nvidia-smi topo -m` as printed; None without GPUs."""
    placement_groups: tuple[tuple[str, str], ...] = ()
    """(name, state) of each replica's Ray placement group, when the fleet runs on Ray."""

    def as_dict(self) -> dict[str, object]:
        return {
            "shm_bytes": self.shm_bytes,
            "cpu_flags": sorted(self.cpu_flags),
            "gpu_topology": self.gpu_topology,
            "placement_groups": [list(group) for group in self.placement_groups],
        }


@dataclass(frozen=True, slots=True)
class Evidence:
    config: FleetConfig = field(default_factory=FleetConfig)
    gateway_metrics: str | None = None
    replicas: tuple[ReplicaEvidence, ...] = ()
    env: EnvFacts = field(default_factory=EnvFacts)

    def pages(self) -> dict[str, Scrape]:
        """Each replica's parsed /metrics by id (those that answered with Prometheus text)."""
        pages = {}
        for replica in self.replicas:
            if replica.metrics is None:
                continue
            with contextlib.suppress(EngineError):
                pages[replica.replica_id] = scrape(replica.metrics)
        return pages

    def gateway_page(self) -> Scrape | None:
        if self.gateway_metrics is None:
            return None
        try:
            return scrape(self.gateway_metrics)
        except EngineError:
            return None


def save(evidence: Evidence, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = evidence.config.model_dump(mode="json", exclude_unset=True)
    (folder / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    if evidence.gateway_metrics is not None:
        (folder / GATEWAY_PAGE).write_text(evidence.gateway_metrics, encoding="utf-8")
    for replica in evidence.replicas:
        if replica.metrics is not None:
            (folder / f"{replica.replica_id}.metrics").write_text(replica.metrics, "utf-8")
        (folder / f"{replica.replica_id}.log").write_text(replica.log, encoding="utf-8")
    (folder / ENV_FILE).write_text(json.dumps(evidence.env.as_dict(), indent=2), "utf-8")


def load(folder: Path) -> Evidence:
    """A recorded case; files it lacks are evidence that was not there."""
    config_path = folder / CONFIG_FILE
    ids = sorted(
        {p.stem for p in folder.iterdir() if p.suffix in (".metrics", ".log")} - {"gateway"}
    )
    return Evidence(
        config=load_config(config_path if config_path.is_file() else None),
        gateway_metrics=_read(folder / GATEWAY_PAGE),
        replicas=tuple(
            ReplicaEvidence(i, _read(folder / f"{i}.metrics"), _read(folder / f"{i}.log") or "")
            for i in ids
        ),
        env=_env(folder / ENV_FILE),
    )


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _env(path: Path) -> EnvFacts:
    if not path.is_file():
        return EnvFacts()
    doc = json.loads(path.read_text(encoding="utf-8"))
    return EnvFacts(
        shm_bytes=doc.get("shm_bytes"),
        cpu_flags=frozenset(doc.get("cpu_flags", ())),
        gpu_topology=doc.get("gpu_topology"),
        placement_groups=tuple((str(n), str(s)) for n, s in doc.get("placement_groups", ())),
    )
