"""A pinned distribution in a venv: read from its dist-info, pip only when it differs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File

from operations import venvs
from operations.venvs import DIST_INFO_SCRIPT, InstalledVersions, pinned_version
from tests.unit.operation_harness import run_operation

VENV = "/opt/twinbolt/litellm"


def write_distribution(venv: Path, directory: str, version: str) -> None:
    dist_info = venv / "lib" / "python3.12" / "site-packages" / directory
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: whatever\nVersion: {version}\nSummary: Version: 9\n")


def installed_in(venv: Path) -> dict[str, str]:
    output = subprocess.run(["sh", "-c", DIST_INFO_SCRIPT, "-", str(venv)], check=True,
                            capture_output=True, text=True).stdout
    return InstalledVersions().process(output.splitlines())


def test_the_versions_are_read_from_each_dist_info_by_canonical_name(tmp_path: Path) -> None:
    write_distribution(tmp_path, "litellm-1.108.5.dist-info", "1.108.5")
    write_distribution(tmp_path, "sglang_router-0.3.2.dist-info", "0.3.2")
    write_distribution(tmp_path, "litellm_proxy_extras-0.2.1.dist-info", "0.2.1")
    assert installed_in(tmp_path) == {"litellm": "1.108.5", "sglang-router": "0.3.2",
                                      "litellm-proxy-extras": "0.2.1"}


def test_a_missing_venv_has_nothing_installed(tmp_path: Path) -> None:
    assert installed_in(tmp_path / "absent") == {}


def test_only_an_exact_pin_is_accepted() -> None:
    assert pinned_version("litellm[proxy]==1.108.5") == "1.108.5"
    for loose in ("litellm", "litellm>=1.0", "litellm>=1,<2"):
        with pytest.raises(ValueError, match="not pinned"):
            pinned_version(loose)


def venv_facts(installed: dict[str, str], venv_exists: bool = True):
    def facts(cls: type, kwargs: dict) -> object:
        if cls is InstalledVersions:
            return installed
        if cls is File:
            return {"size": 1} if venv_exists else None
        if cls is Directory:
            return {"mode": 755} if venv_exists else None
        raise AssertionError(f"unexpected fact {cls.__name__}")
    return facts


def test_the_pinned_version_installed_runs_nothing() -> None:
    assert run_operation(venvs.pinned_package, venv_facts({"litellm": "1.108.5"}), venv=VENV,
                         requirement="litellm[proxy]==1.108.5") == []


def test_another_version_is_replaced_by_pip() -> None:
    commands = run_operation(venvs.pinned_package, venv_facts({"litellm": "1.100.0"}), venv=VENV,
                             requirement="litellm[proxy]==1.108.5")
    # With its extras: the proxy's own dependencies come with them.
    assert commands == [f"{VENV}/bin/pip install --quiet 'litellm[proxy]==1.108.5'"]


def test_a_missing_venv_is_made_then_filled() -> None:
    commands = run_operation(venvs.pinned_package, venv_facts({}, venv_exists=False), venv=VENV,
                             requirement="sglang-router==0.3.2")
    assert commands == [f"python3 -m venv {VENV}",
                        f"{VENV}/bin/pip install --quiet sglang-router==0.3.2"]
