"""The vLLM trial runner: launch the trial's fleet as `servepilot up` does, sweep it, stop it.

Replicas start through `fleet.local.LocalReplicas` (the code `up` runs: same command line,
same core binding, same readiness wait and failure diagnosis) with the gateway in front of
them on a free loopback port (`fleet.serve.start_gateway`, each replica with `up`'s budget).
Each load level is bench's: the workload of `seed + level` by the server's tokenizer,
`run_load`, `summarize`. Whatever happens (a failed start, a crash mid-sweep, Ctrl-C) the
gateway and every replica are stopped before `run` returns or raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from servepilot.bench.chat_template import measure_chat_frame
from servepilot.bench.client import Target
from servepilot.bench.metrics import summarize
from servepilot.bench.runner import run_load
from servepilot.bench.tokenizer import open_tokenizer
from servepilot.bench.workload import build_workload
from servepilot.core import loop
from servepilot.core.config import AuthConfig, FleetConfig
from servepilot.core.errors import EngineError, EngineStartError, ServepilotError
from servepilot.core.results import Load, Run
from servepilot.core.slo import Slo
from servepilot.engine.metrics import EngineMetric, scrape
from servepilot.engine.model_source import ResolvedModel, resolve_model
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.local import LocalReplicas
from servepilot.fleet.serve import ServedGateway, Upstream, start_gateway
from servepilot.load.levels import default_requests
from servepilot.load.loadplan import LoadPlan
from servepilot.load.workload import WorkloadSpec
from servepilot.plan.request import fleet_vllm_defaults
from servepilot.routing.admission.budget import replica_capacity
from servepilot.tune.loadsweep import LoadSweep, next_load
from servepilot.tune.planspace import PlanSpace
from servepilot.tune.score import Failure, FailureCause, Measurement, Outcome
from servepilot.tune.space import TrialConfig

DRAIN_S = 5.0


@dataclass(frozen=True, slots=True)
class VllmTrialRunner:
    space: PlanSpace
    workload: WorkloadSpec
    sweep: LoadSweep
    sla: Slo
    run_dir: Path
    on_level: Callable[[Run], None]
    on_step: Callable[[str], None]

    def run(self, config: TrialConfig) -> Outcome:
        fleet = self.space.fleet(config)
        model = resolve_model(fleet.model, progress=self.on_step)
        return loop.run(self._trial(fleet, model, self.run_dir / f"trial-{config.key}"))

    async def _trial(self, fleet: FleetConfig, model: ResolvedModel, run_dir: Path) -> Outcome:
        replicas = LocalReplicas(fleet, model, run_dir)
        started = time.monotonic()
        self.on_step(f"starting {fleet.replicas.count} vLLM replica(s); logs in {run_dir}")
        try:
            infos = await replicas.start()
        except EngineStartError as exc:
            return _start_failure(exc)
        served: ServedGateway | None = None
        try:
            startup_s = time.monotonic() - started
            self.on_step(f"ready in {startup_s:.0f} s; sweeping the load")
            defaults = fleet_vllm_defaults(fleet)
            upstreams = [
                Upstream(
                    i.replica_id,
                    i.url,
                    replica_capacity(fleet, defaults, i.kv.kv_capacity_tokens if i.kv else None),
                )
                for i in infos
            ]
            # On loopback, on a free port, without API keys: the trial's own client is the
            # only one; routing, admission and protection stay as configured.
            gateway = fleet.gateway.model_copy(
                update={"host": "127.0.0.1", "port": 0, "auth": AuthConfig()}
            )
            served = await start_gateway(gateway, upstreams)
            runs = await self._sweep(served.url, infos[0].url, model.served_name, replicas)
            crashed = replicas.exited()
            if crashed:
                proc, code = crashed[0]
                detail = f"replica {proc.replica_id} exited with code {code} (log: {proc.log_path})"
                return Failure(FailureCause.CRASHED, detail)
            return Measurement(
                runs=tuple(runs),
                capacity=sum(u.capacity or 1 for u in upstreams),
                preemptions=await _preemptions(infos),
                kv_capacity_tokens=_kv_tokens(infos),
                startup_s=startup_s,
            )
        except ServepilotError as exc:
            return Failure(FailureCause.BENCH_FAILED, exc.message)
        finally:
            if served is not None:
                await served.stop(DRAIN_S)
            await replicas.stop()

    async def _sweep(
        self, url: str, replica_url: str, model: str, replicas: LocalReplicas
    ) -> list[Run]:
        target = Target(base_url=url, model=model)
        # The replica's own /tokenize: through the gateway, tokenizing a level's prompts
        # would take the admission budget a small max_num_seqs leaves, and be shed (429).
        tokenizer = open_tokenizer(replica_url, model, None)
        # As bench sends them: chat texts less the template, so the server counts
        # --input-tokens (and the sim runner, which adds no template on chat, agrees).
        chat = await asyncio.to_thread(measure_chat_frame, tokenizer, target.endpoint)
        sized = functools.partial(build_workload, chat_template_tokens=chat.overhead_tokens)
        runs: list[Run] = []
        while (load := next_load(self.sweep, self.sla, runs).load) is not None:
            if replicas.exited():
                break
            plan = LoadPlan(load=load, max_requests=self._requests(load), seed=self.workload.seed)
            spec = dataclasses.replace(self.workload, seed=self.workload.seed + len(runs))
            count = plan.max_requests or 0
            requests = await asyncio.to_thread(sized, spec, tokenizer, count)
            outcome = await run_load(target, plan, requests)
            run = summarize(
                load, outcome.records, self.sla, duration_s=outcome.duration_s,
                client=outcome.client,
            )  # fmt: skip
            runs.append(run)
            self.on_level(run)
        return runs

    def _requests(self, load: Load) -> int:
        return self.sweep.requests_per_level or default_requests(load)


def _start_failure(exc: EngineStartError) -> Failure:
    memory = "memory" in exc.cause.lower()
    cause = FailureCause.OUT_OF_MEMORY if memory else FailureCause.DID_NOT_START
    return Failure(cause, f"{exc.message}; probable cause: {exc.cause}")


def _kv_tokens(infos: list[ReplicaInfo]) -> int | None:
    known = [i.kv.kv_capacity_tokens for i in infos if i.kv is not None]
    return sum(known) if known else None


async def _preemptions(infos: list[ReplicaInfo]) -> int:
    total = 0.0
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for info in infos:
            try:
                async with session.get(f"{info.url}/metrics") as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError, OSError):
                continue
            total += _count(text)
    return int(total)


def _count(text: str) -> float:
    try:
        return scrape(text, (EngineMetric.PREEMPTIONS,)).total(EngineMetric.PREEMPTIONS)
    except EngineError:
        return 0.0
