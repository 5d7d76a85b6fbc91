"""doctor's evidence: recorded and replayed unchanged; `nvidia-smi topo -m` read as the driver
prints it; this machine's facts."""

from pathlib import Path

from servepilot.core.config import FleetConfig, parse_config
from servepilot.engine.cpu import cpu_flags
from servepilot.engine.gpu.inventory import GpuLink
from servepilot.engine.gpu.smi import parse_topology
from servepilot.observe.doctor.evidence import EnvFacts, Evidence, ReplicaEvidence, load, save
from servepilot.observe.doctor.gather import environment
from servepilot.observe.doctor.topology import nvlink_clique

GPU_NODE = Path(__file__).parent.parent / "data" / "doctor" / "gpu_node"


def test_saved_evidence_loads_back_the_same(tmp_path: Path) -> None:
    evidence = Evidence(
        config=parse_config({"engine": {"max_num_seqs": 64}}, origin="test"),
        gateway_metrics="servepilot_retries_total 0.0\n",
        replicas=(
            ReplicaEvidence("r0", "vllm:num_requests_running 1.0\n", "KV cache\n"),
            ReplicaEvidence("r1", None, ""),
        ),
        env=EnvFacts(
            shm_bytes=2**26,
            cpu_flags=frozenset({"avx2"}),
            gpu_topology=None,
            placement_groups=(("g0", "PENDING"),),
        ),
    )
    save(evidence, tmp_path / "case")
    assert load(tmp_path / "case") == evidence


def test_an_empty_folder_is_a_case_with_no_evidence(tmp_path: Path) -> None:
    assert load(tmp_path) == Evidence(config=FleetConfig())


def test_the_topology_matrix_of_two_nvlink_islands() -> None:
    links, _ = parse_topology(load(GPU_NODE).env.gpu_topology or "")
    assert len(links) == 28  # every pair of 8 GPUs, once
    assert links[0, 3] is GpuLink.NVLINK and links[3, 4] is GpuLink.CROSS_NUMA
    assert nvlink_clique(links, 0, 8) == 4
    assert nvlink_clique(links, 4, 4) == 4
    assert nvlink_clique(links, 2, 4) == 2  # GPU2, GPU3; GPU4 is across the SMP link


def test_a_pcie_only_pair() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-15\nGPU1\tPHB\t X \t0-15\n"
    links, _ = parse_topology(text)
    assert links == {(0, 1): GpuLink.SAME_NUMA}
    assert nvlink_clique(links, 0, 2) == 1


def test_this_machines_facts() -> None:
    env = environment()
    assert env.cpu_flags == cpu_flags()
    assert env.shm_bytes is None or env.shm_bytes > 0
    assert env.placement_groups == ()


def test_a_real_one_gpu_topology_printed_into_a_pipe() -> None:
    # Driver 580 on an H200: the header underlined with escape codes even into a pipe.
    text = (GPU_NODE.parent / "h200_topo_m.txt").read_text()
    assert "\x1b[4mGPU0" in text
    assert parse_topology(text) == ({}, {0: 0})  # one GPU: no pair to link; NUMA node 0
