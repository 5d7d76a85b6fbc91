"""The fleet record `up` keeps while it runs (`fleet.state` reads and writes it): while the
replicas load, which are ready and which awaited; once the gateway serves, the replicas it
lists and the autoscaler's last decision."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from servepilot.core.config import FleetConfig
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.autoscale.decision import Decision
from servepilot.fleet.serve import ServedGateway
from servepilot.fleet.state import (
    AutoscaleRecord,
    FleetRecord,
    FleetState,
    ReplicaRecord,
    write_record,
)


class ServingRecord:
    """The fleet record once the gateway serves; rewritten at each autoscaling decision
    (the replicas it lists, so `down` finds every process, and the decision for `status`)."""

    def __init__(
        self,
        served: ServedGateway,
        run_dir: Path,
        rows: Callable[[], tuple[ReplicaRecord, ...]],
        config: FleetConfig,
    ) -> None:
        """`rows`: the replicas serving at the time of writing."""
        self.served = served
        self.run_dir = run_dir
        self._rows = rows
        scaling = config.autoscale
        self.autoscale = (
            AutoscaleRecord(scaling.policy.value, scaling.min_replicas, scaling.max_replicas)
            if scaling.enabled
            else None
        )
        self.started_at_s = time.time()

    def write(self) -> None:
        served, run_dir = self.served, str(self.run_dir)
        write_record(FleetRecord(os.getpid(), served.url, served.port, self.started_at_s,
                                 run_dir, self._rows(), autoscale=self.autoscale))  # fmt: skip

    def on_decision(self, step: Callable[[str], None]) -> Callable[[Decision], None]:
        """Report a change (`step`: on up's output), then record the decision."""

        def heard(decision: Decision) -> None:
            if decision.direction != "hold":
                step(decision.line())
            if self.autoscale is not None:
                self.autoscale = replace(self.autoscale, last_decision=decision.line(),
                                         last_decision_at_s=decision.at_s)  # fmt: skip
            self.write()

        return heard


class StartingRecord:
    """The fleet record while the replicas load: which are ready, which are awaited."""

    def __init__(
        self, gateway_url: str, port: int, run_dir: Path, awaited: Sequence[ReplicaRecord]
    ) -> None:
        self.gateway_url = gateway_url
        self.port = port
        self.run_dir = run_dir
        self.rows = {row.replica_id: row for row in awaited}
        self.started_at_s = time.time()
        self.write()

    def await_rows(self, awaited: Sequence[ReplicaRecord]) -> None:
        """The replicas awaited, known once launched (their pids); rewritten."""
        self.rows = {row.replica_id: row for row in awaited}
        self.write()

    def write(self) -> None:
        write_record(
            FleetRecord(os.getpid(), self.gateway_url, self.port, self.started_at_s,
                        str(self.run_dir), tuple(self.rows.values()), FleetState.STARTING)
        )  # fmt: skip

    def ready(self, said: Callable[[ReplicaInfo], None]) -> Callable[[ReplicaInfo], None]:
        """The on-ready callback: `said` the replica, then record it as ready (at its URL)."""

        def on_ready(info: ReplicaInfo) -> None:
            said(info)
            row = self.rows[info.replica_id]
            self.rows[info.replica_id] = replace(row, url=info.url, ready=True)
            self.write()

        return on_ready
