"""The GPU preflight: present, and holding nothing for a process twinbolt did not start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api.exceptions import OperationError
from pyinfra_fakes import FakeHost, commands

from operations.services import ServicePids
from operations.serving import gpu
from operations.serving.gpu import GpuProcesses, Gpus

SERVICES = ("sglang-replica", "sglang-tp2-rank0")
A_GPU = [{"index": "0", "name": "NVIDIA GeForce RTX 5090", "memory_total_mib": 32607}]


def run_fact(fact: type, nvidia_smi_output: str, tmp_path: Path) -> list[dict]:
    """The fact's own command, run by sh against a stand-in nvidia-smi and the real /proc."""
    stand_in = tmp_path / "nvidia-smi"
    stand_in.write_text(f"#!/bin/sh\nprintf '%s' '{nvidia_smi_output}'\n")
    stand_in.chmod(0o755)
    environment = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    output = subprocess.run(["sh", "-c", fact.command], capture_output=True, text=True,
                            env=environment, check=True).stdout
    return fact().process(output.splitlines())


def test_gpus_are_read_from_nvidia_smi(tmp_path: Path) -> None:
    assert run_fact(Gpus, "0, NVIDIA GeForce RTX 5090, 32607\n", tmp_path) == A_GPU


def test_no_nvidia_smi_means_no_gpu() -> None:
    environment = {**os.environ, "PATH": "/nonexistent"}
    output = subprocess.run(["/bin/sh", "-c", Gpus.command], capture_output=True, text=True,
                            env=environment).stdout
    assert Gpus().process(output.splitlines()) == []


def test_a_gpu_process_is_read_with_its_ancestry_and_command(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = run_fact(GpuProcesses, f"{holder.pid}, 9000\n", tmp_path)
    finally:
        holder.kill()
        holder.wait()
    [process] = found
    assert process["pid"] == holder.pid and process["used_mib"] == 9000
    # This test's own process started the holder: it is an ancestor.
    assert os.getpid() in process["lineage"] and process["lineage"][-1] == 1
    assert "time.sleep(30)" in process["command"]


def test_only_processes_outside_twinbolts_services_count() -> None:
    processes = [
        {"pid": 30, "used_mib": 28000, "lineage": [30, 20, 1], "command": "sglang scheduler"},
        {"pid": 40, "used_mib": 9000, "lineage": [40, 1], "command": "python notebook.py"},
    ]
    found = gpu.foreign_problems(processes, own_pids={20}, allowed_mib=0)
    assert found[0] == ("pid 40 (python notebook.py) holds 9000 MiB of GPU memory and was "
                        "not started by twinbolt")
    assert len(found) == 2 and "serving.foreign_gpu_memory_mib" in found[1]
    assert gpu.foreign_problems(processes, own_pids={20}, allowed_mib=9000) == []
    assert gpu.foreign_problems(processes[:1], own_pids={20}, allowed_mib=0) == []


def host_with(gpus: list[dict], processes: list[dict], service_pids: dict[str, int]) -> FakeHost:
    def pids(services: tuple[str, ...], init_system: str) -> dict[str, int]:
        return {name: pid for name, pid in service_pids.items() if name in services}

    return FakeHost({Gpus: gpus, GpuProcesses: processes, ServicePids: pids})


def test_an_idle_gpu_needs_no_service_read() -> None:
    host = FakeHost({Gpus: A_GPU, GpuProcesses: []})  # reading ServicePids would fail
    assert commands(gpu.free, host, services=SERVICES, init_system="runit") == []


def test_service_pids_are_read_in_one_command_for_every_service(tmp_path) -> None:
    sv = tmp_path / "sv"
    sv.write_text('#!/bin/sh\ncase "$2" in */sglang-replica) '
                  'echo "run: $2: (pid 4242) 73s" ;; *) echo "down: $2: 9s" ;; esac\n')
    sv.chmod(0o755)
    command = ServicePids().command(("sglang-replica", "sglang-tp2-rank0"), "runit")
    output = subprocess.run(["/bin/sh", "-c", command.get_raw_value()], capture_output=True,
                            text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True)
    assert ServicePids().process(output.stdout.splitlines()) == {"sglang-replica": 4242}


def test_free_refuses_a_stranger_naming_the_pid_and_changes_nothing() -> None:
    stranger = {"pid": 77, "used_mib": 9000, "lineage": [77, 1], "command": "sleep 120"}
    host = host_with(A_GPU, [stranger], {"sglang-replica": 20})
    with pytest.raises(OperationError, match=r"wsa: gpu layer: pid 77 \(sleep 120\) holds 9000"):
        commands(gpu.free, host, services=SERVICES, init_system="runit")


def test_free_accepts_memory_held_by_twinbolts_own_server() -> None:
    replica = {"pid": 21, "used_mib": 28000, "lineage": [21, 20, 1], "command": "sglang"}
    host = host_with(A_GPU, [replica], {"sglang-replica": 20})
    assert commands(gpu.free, host, services=SERVICES, init_system="runit") == []
    assert host.noops == ["the GPU is present and holds nothing twinbolt did not start"]


def test_free_refuses_a_host_without_a_gpu() -> None:
    with pytest.raises(OperationError, match="nvidia-smi lists no GPU"):
        commands(gpu.free, host_with([], [], {}), services=SERVICES, init_system="runit")


def test_foreign_memory_is_judged_in_all_and_a_nameless_process_says_so() -> None:
    # Each below the allowance, together above it: both are named.
    processes = [
        {"pid": 40, "used_mib": 600, "lineage": [40, 1], "command": ""},
        {"pid": 50, "used_mib": 600, "lineage": [50, 1], "command": "python notebook.py"},
    ]
    assert gpu.foreign_problems(processes, own_pids=set(), allowed_mib=1000) == [
        "pid 40 (command unknown) holds 600 MiB of GPU memory and was not started by twinbolt",
        "pid 50 (python notebook.py) holds 600 MiB of GPU memory and was not started by "
        "twinbolt",
        "stop it, or allow it with serving.foreign_gpu_memory_mib (now 1000)"]
    assert gpu.foreign_problems(processes, own_pids=set(), allowed_mib=1200) == []
