"""Which running fleet `top`, `doctor`, `accept`, `sleep` and `wake` look at: the one --url
names, or the one `servepilot up` runs here on --port, else the only one `up` runs here (found
by its record, as `status` finds it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servepilot.core.errors import FleetError
from servepilot.core.urls import base_url
from servepilot.fleet.control import no_fleet_on
from servepilot.fleet.logs import replica_log_name
from servepilot.fleet.state import FleetRecord, FleetState, read_records


@dataclass(frozen=True, slots=True)
class FleetTarget:
    gateway_url: str
    record: FleetRecord | None
    """The fleet's record when `up` runs it here (its run folder holds the replicas' logs);
    None for a gateway given by --url that no record names."""

    def replica_logs(self) -> dict[str, str]:
        """Each replica's log by id, from the run folder of the `up` that runs the fleet."""
        if self.record is None:
            return {}
        logs = {}
        for replica in self.record.replicas:
            path = Path(self.record.run_dir) / replica_log_name(replica.replica_id)
            if path.is_file():
                logs[replica.replica_id] = path.read_text(encoding="utf-8", errors="replace")
        return logs


def find_fleet(url: str | None, port: int | None = None) -> FleetTarget:
    """The fleet at `url`, else the one serving on `port`, else the only one serving."""
    serving = [r for r in read_records() if r.is_alive() and r.state is FleetState.SERVING]
    if port is not None:
        serving = [r for r in serving if r.port == port]
        if not serving:
            raise no_fleet_on(port)
    if url is not None:
        root = base_url(url, "--url")
        named = next((r for r in serving if r.gateway_url.rstrip("/") == root), None)
        return FleetTarget(root, named)
    if not serving:
        raise FleetError(
            "no fleet is serving here", hint="start one with `servepilot up`, or pass --url"
        )
    if len(serving) > 1:
        urls = ", ".join(r.gateway_url for r in serving)
        raise FleetError(f"fleets serve at {urls}", hint="pass --port or --url to pick one")
    return FleetTarget(serving[0].gateway_url, serving[0])
