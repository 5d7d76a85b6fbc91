"""A soak's memory per source: each process of a local fleet's replicas (from its process
tree in /proc) and each GPU (the node's reader), growth per request and the leak rule per
source, in the windows, the terminal warnings and the HTML report."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from servepilot.bench.console import run_warnings
from servepilot.bench.metrics import summarize
from servepilot.bench.records import RequestRecord
from servepilot.bench.report.html import render_html_report
from servepilot.bench.shortfalls import leaking_sources
from servepilot.bench.soak import MemorySample, growth_by_source, window_samples, with_soak
from servepilot.core.results import Load, LoadMode, Run
from servepilot.core.slo import Slo
from servepilot.engine.gpu.inventory import GpuDevice, GpuInventory
from servepilot.engine.process_memory import process_tree, replica_memory
from servepilot.fleet.soak_memory import fleet_memory_sampler, local_fleet, soak_memory
from servepilot.fleet.state import FleetRecord, ReplicaRecord
from tests.unit.test_bench_report import WHEN, make_result

MIB = 2**20


def fake_proc(root: Path, pid: int, ppid: int, name: str, rss_kib: int) -> None:
    entry = root / str(pid)
    entry.mkdir()
    (entry / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")
    (entry / "status").write_text(f"Name:\t{name}\nVmRSS:\t{rss_kib} kB\n")
    (entry / "comm").write_text(name + "\n")


def test_every_process_of_each_replica_from_a_proc_tree(tmp_path: Path) -> None:
    fake_proc(tmp_path, 100, 1, "python", 400_000)  # r0's API server
    fake_proc(tmp_path, 101, 100, "VLLM::EngineCor", 900_000)
    fake_proc(tmp_path, 102, 101, "VLLM::Worker_TP", 50_000)
    fake_proc(tmp_path, 200, 1, "python", 410_000)  # r1, no children
    fake_proc(tmp_path, 300, 1, "unrelated", 1)
    assert process_tree(100, tmp_path) == [100, 101, 102]
    assert replica_memory({"r0": 100, "r1": 200}, tmp_path) == {
        "r0 python (pid 100)": 400_000 * 1024,
        "r0 VLLM::EngineCor (pid 101)": 900_000 * 1024,
        "r0 VLLM::Worker_TP (pid 102)": 50_000 * 1024,
        "r1 python (pid 200)": 410_000 * 1024,
    }


def test_a_real_child_process_is_found_in_the_tree() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 5
        while child.pid not in process_tree(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        memory = replica_memory({"r0": os.getpid()})
        assert any(key.endswith(f"(pid {child.pid})") and rss > 0 for key, rss in memory.items())
    finally:
        child.kill()
        child.wait()


class TwoGpus:
    def read(self) -> GpuInventory:
        devices = (
            GpuDevice(0, "H200", 141 << 30, 5 << 30, 0.0),
            GpuDevice(1, "H200", 141 << 30, 7 << 30, 0.0),
        )
        return GpuInventory(devices=devices, source="fake")


def record(port: int, pid: int) -> FleetRecord:
    replica = ReplicaRecord("r0", "http://127.0.0.1:1", pid, "r0.log")
    return FleetRecord(1, f"http://127.0.0.1:{port}", port, 0.0, "/tmp", (replica,))


def test_a_local_fleet_is_sampled_by_process_and_by_gpu() -> None:
    sample = fleet_memory_sampler(record(8000, os.getpid()), gpus=TwoGpus())()
    assert sample["gpu0"] == 5 << 30 and sample["gpu1"] == 7 << 30
    assert any(key.startswith("r0 ") and key.endswith(f"(pid {os.getpid()})") for key in sample)


def test_only_a_fleet_on_this_machine_is_found() -> None:
    records = [record(8000, 1), record(9000, 1)]
    assert local_fleet("http://127.0.0.1:9000", records) is records[1]
    assert local_fleet("http://localhost:8000", records) is records[0]
    assert local_fleet("http://10.1.2.3:8000", records) is None
    assert local_fleet("http://127.0.0.1:7000", records) is None


class NoGpus:
    def read(self) -> GpuInventory:
        return GpuInventory(note="no NVIDIA driver")


def test_bench_and_accept_find_a_soaks_memory_sources_in_one_place() -> None:
    records = [record(8000, os.getpid())]
    cpu = soak_memory("http://127.0.0.1:8000", records, gpus=NoGpus())
    assert cpu.sampler is not None and "GPU" not in cpu.described
    assert cpu.described.endswith("each process of its 1 replica")
    assert not any(key.startswith("gpu") for key in cpu.sampler())
    gpus = soak_memory("http://127.0.0.1:8000", records, gpus=TwoGpus())
    assert gpus.described.endswith("each process of its 1 replica, and each of the 2 GPUs")
    remote = soak_memory("http://10.1.2.3:8000", records, gpus=TwoGpus())
    assert remote.sampler is None and "/metrics only" in remote.described


def soak_records() -> list[RequestRecord]:
    return [
        RequestRecord(
            index=i,
            intended_s=i,
            sent_s=i,
            chunk_s=(i + 0.5,),
            end_s=i + 0.5,
            input_tokens=10,
            output_tokens=1,
        )
        for i in range(4)
    ]


def soak_run() -> Run:
    records = soak_records()
    load = Load(mode=LoadMode.CONCURRENCY, value=2.0)
    run = summarize(load, records, Slo(), duration_s=4.0)
    api, core = "r0 python (pid 100)", "r0 VLLM::EngineCor (pid 101)"
    # 4 requests: the EngineCore grows 12 MiB (3 MiB per request, a leak), the API server
    # 2 MiB (0.5 MiB per request), GPU 0 by 16 MiB (4 MiB per request, a leak).
    samples = [
        MemorySample(1000, {api: 400 * MIB, core: 900 * MIB, "gpu0": 5000 * MIB}),
        MemorySample(1000, {api: 401 * MIB, core: 906 * MIB, "gpu0": 5008 * MIB}),
        MemorySample(1000, {api: 402 * MIB, core: 912 * MIB, "gpu0": 5016 * MIB}),
    ]
    return with_soak(run, records, 2.0, samples)


def test_growth_and_the_leak_flag_per_source() -> None:
    run = soak_run()
    growth = run.memory_growth_by_source_bytes_per_request
    assert growth == {
        "r0 python (pid 100)": 0.5 * MIB,
        "r0 VLLM::EngineCor (pid 101)": 3 * MIB,
        "gpu0": 4 * MIB,
    }
    leaks = {"r0 VLLM::EngineCor (pid 101)": 3 * MIB, "gpu0": 4 * MIB}
    assert leaking_sources(run) == leaks
    assert [w.memory_by_source_bytes["gpu0"] for w in run.windows] == [5008 * MIB, 5016 * MIB]


def test_the_terminal_and_the_html_report_name_the_leaking_sources() -> None:
    run = soak_run()
    warnings = " ".join(run_warnings(run))
    assert "r0 VLLM::EngineCor (pid 101): memory grew 3.0 MiB per request during" in warnings
    assert "python (pid 100)" not in warnings
    html = render_html_report(make_result((run,)), generated_at=WHEN)
    assert "gpu0&#x27;s memory grew by 4.00 MiB per request" in html
    assert "r0 python (pid 100) 512 KiB per request" in html
    assert "r0 VLLM::EngineCor (pid 101) 3.00 MiB per request — LEAK" in html


def test_no_requests_means_no_growth() -> None:
    samples = [MemorySample(None, {"gpu0": 1}), MemorySample(None, {"gpu0": 9})]
    assert growth_by_source(samples, 0) == {}
    assert growth_by_source(samples, 4) == {"gpu0": 2.0}


def test_each_window_gets_the_first_sample_taken_after_its_end() -> None:
    """The timer's samples drift and it is stopped when the load ends: a window whose end the
    timer missed had no memory at all (accept's 5 s soak on a loaded machine); it gets the
    sample taken after the load."""
    start, e0, e1, final = (MemorySample(n, {"gpu0": n}) for n in (0, 1, 2, 3))
    assert window_samples([start, e0, final], 2) == [e0, final]  # the timer missed none
    assert window_samples([start, final], 2) == [final, final]  # it missed the first end
    assert window_samples([start, e0, e1, final], 2) == [e0, final]  # it came with the final
    assert window_samples([start, e0, final], 3) == [e0, final, final]
    assert window_samples([start], 2) == [None, None]
    # Through with_soak: 4 requests over 2 windows of 2 s, the timer missed the first end.
    missed = with_soak(soak_run(), soak_records(), 2.0, [start, final])
    assert [w.memory_by_source_bytes for w in missed.windows] == [{"gpu0": 3}, {"gpu0": 3}]
