"""
The end-to-end tests' tools: real pyinfra runs, real testinfra checks.

Helpers here run the project's own commands exactly as an operator types them,
and read the hosts over the lab's SSH config to prove what changed and what did
not. Every test that moves the hosts leaves them in a verified production.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
SSH_CONFIG = REPO / ".lab" / "ssh" / "config"


@dataclass
class DeployRun:
    """One ``pyinfra inventory.py deploy.py`` run: exit code, results and what it printed."""

    returncode: int
    results: dict
    output: str

    def changed_hosts(self) -> set[str]:
        return {host for op in self.results.get("operations", []) for host in op["success"]}

    def failed_hosts(self) -> set[str]:
        return set(self.results.get("failed_hosts", []) or [])


def deploy(state: str | None, *extra: str, timeout: float = 600) -> DeployRun:
    data = ["--data", f"state={state}"] if state is not None else []
    result = subprocess.run(
        [str(PYINFRA), "-y", "--json", "inventory.py", "deploy.py", *data, *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    try:
        results = json.loads(result.stdout).get("results", {}) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        results = {}
    return DeployRun(result.returncode, results, result.stdout + result.stderr)


def verify(state: str) -> subprocess.CompletedProcess[str]:
    """``pytest tests/verify --state NAME``, as the operator runs it."""
    return subprocess.run(
        [str(PYTHON), "-m", "pytest", "tests/verify", "--state", state, "-q", "-p",
         "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=600,
    )


def ssh(host: str, command: str) -> str:
    result = subprocess.run(["ssh", "-F", str(SSH_CONFIG), host, command],
                            capture_output=True, text=True, timeout=60)
    return result.stdout


def snapshot() -> dict[str, str]:
    """What a run could change on each host: driver, staged files, services, configs."""
    workstation = (
        "cat /sys/module/thunderbolt_net/initstate /sys/module/thunderbolt_net/parameters/* "
        "2>&1; od -An -tx1 /sys/module/thunderbolt_net/notes/.note.gnu.build-id 2>&1; "
        "ls -la /run/twinbolt 2>&1; ls /etc/service /etc/sv 2>&1; "
        "sha256sum /etc/sv/*/run 2>&1"
    )
    gateway = "ls /etc/service /etc/sv 2>&1; sha256sum /etc/sv/*/run /etc/twinbolt/* 2>&1"
    return {
        "wsa": ssh("wsa", workstation),
        "wsb": ssh("wsb", workstation),
        "gw": ssh("gw", gateway),
    }


def lab(*arguments: str) -> None:
    subprocess.run([str(PYTHON), "-m", "lab", *arguments], cwd=REPO, check=True,
                   capture_output=True)


@contextmanager
def fault(name: str) -> Iterator[None]:
    """A lab fault switched on for the block, and off again whatever happens."""
    lab("fault", name, "on")
    try:
        yield
    finally:
        lab("fault", name, "off")
