"""Read a running fleet over HTTP: the gateway's /metrics and /admin/replicas, then each
replica's /metrics (in parallel, so one slow replica costs one timeout, not one each)."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from servepilot.core.errors import FleetError, ServepilotError
from servepilot.engine.metrics import Scrape, scrape
from servepilot.observe.top.sample import FleetSample, ReplicaState, fleet_sample, replica_states

TIMEOUT_S = 3.0
_MAX_THREADS = 8


def get_text(url: str, timeout_s: float = TIMEOUT_S) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8", "replace")


def get_json(url: str, timeout_s: float = TIMEOUT_S) -> Any:
    return json.loads(get_text(url, timeout_s))


def gateway_pages(gateway_url: str) -> tuple[Scrape, tuple[ReplicaState, ...]]:
    try:
        page = scrape(get_text(f"{gateway_url}/metrics"))
        replicas = replica_states(get_json(f"{gateway_url}/admin/replicas"))
    except (OSError, ValueError) as exc:
        raise FleetError(
            f"the gateway at {gateway_url} did not answer: {exc}",
            hint="is the fleet running? `servepilot status` lists the fleets",
        ) from None
    return page, replicas


def replica_pages(
    replicas: tuple[ReplicaState, ...],
) -> tuple[dict[str, Scrape], dict[str, str], tuple[str, ...]]:
    """Each replica's parsed page and raw text by id, and a line for each that did not
    answer."""
    if not replicas:
        return {}, {}, ()
    with ThreadPoolExecutor(max_workers=min(_MAX_THREADS, len(replicas))) as pool:
        answers = list(pool.map(_read_page, replicas))
    pages, texts, problems = {}, {}, []
    for replica, (text, problem) in zip(replicas, answers, strict=True):
        if problem is not None:
            problems.append(f"{replica.replica_id}: {problem}")
            continue
        try:
            pages[replica.replica_id] = scrape(text)
            texts[replica.replica_id] = text
        except ServepilotError as exc:
            problems.append(f"{replica.replica_id}: {exc}")
    return pages, texts, tuple(problems)


def _read_page(replica: ReplicaState) -> tuple[str, str | None]:
    try:
        return get_text(f"{replica.url}/metrics"), None
    except (OSError, ValueError) as exc:
        return "", f"its /metrics did not answer ({exc})"


def poll(gateway_url: str) -> FleetSample:
    """One sample of the fleet behind `gateway_url`, stamped with the monotonic clock."""
    page, replicas = gateway_pages(gateway_url)
    pages, _, problems = replica_pages(replicas)
    return fleet_sample(time.monotonic(), page, replicas, pages, problems)
