"""A real Prometheus server (Debian's `prometheus`) on loopback for a test: a temporary config
scraping the given targets every second, its TSDB in a temporary folder; always stopped."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.fleetproc import free_port

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus missing: `make prometheus` installs Debian's package"
)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> dict[str, Any]:
        """/api/v1/query's answer; a query that does not parse answers status "error"."""
        body = urllib.parse.urlencode({"query": expr}).encode()
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query", body, timeout=10) as resp:
                answer: dict[str, Any] = json.load(resp)
        except urllib.error.HTTPError as exc:
            answer = json.load(exc)
        return answer

    def targets_up(self) -> dict[str, float]:
        """`up` per scraped instance."""
        result = self.query("up")["data"]["result"]
        return {r["metric"]["instance"]: float(r["value"][1]) for r in result}

    def wait_for_targets(self, count: int, timeout_s: float = 30.0) -> dict[str, float]:
        """Until `count` targets have been scraped (static targets are picked up after the
        scrape manager's first reload, about 5 s); returns `up` per instance."""
        deadline = time.monotonic() + timeout_s
        while len(up := self.targets_up()) < count and time.monotonic() < deadline:
            time.sleep(0.5)
        return up

    def wait_for_scrapes(self, count: int) -> None:
        """Until every target has been scraped `count` more times (1 s apart)."""
        time.sleep(count + 0.5)


@contextlib.contextmanager
def running_prometheus(
    tmp_path: Path, jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()
) -> Iterator[Prometheus]:
    """`jobs`: job name -> host:port targets."""
    assert PROMETHEUS is not None
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]}
            for job, targets in jobs.items()
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, tmp_path / "prometheus.log")
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/-/ready") as resp:
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"prometheus not ready in 30 s:\n{log.read_text()[-3000:]}")
