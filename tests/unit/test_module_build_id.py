"""
The one reader of a module file's build-id, run here as the hosts run it (``sh``,
``readelf``, the decompressors) on a real ELF module in each form distributions
ship: plain, and compressed as Ubuntu (``.ko.zst``) and others (``.ko.xz``,
``.ko.gz``) install it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lab import modules
from operations.thunderbolt.driver import ModuleFileBuildId

COMPRESS = {".ko": None, ".ko.zst": ["zstd", "-q", "-c"], ".ko.xz": ["xz", "-c"],
            ".ko.gz": ["gzip", "-c"]}


def read_build_id(env: dict[str, str] | None = None, **arguments: str) -> str | None:
    reader = ModuleFileBuildId()
    output = subprocess.run(["sh", "-c", reader.command(**arguments).get_raw_value()],
                            capture_output=True, text=True, check=True, env=env).stdout
    return reader.process(output.splitlines())


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return modules.build("stock", tmp_path_factory.mktemp("module") / "thunderbolt_net.ko")


@pytest.mark.parametrize("suffix", COMPRESS)
def test_each_form_reads_as_the_plain_files_build_id(plain: Path, tmp_path: Path,
                                                     suffix: str) -> None:
    shipped = tmp_path / f"thunderbolt_net{suffix}"
    if COMPRESS[suffix] is None:
        shipped.write_bytes(plain.read_bytes())
    else:
        shipped.write_bytes(subprocess.run([*COMPRESS[suffix], str(plain)], check=True,
                                           capture_output=True).stdout)
        assert shipped.read_bytes()[:4] != b"\x7fELF"
    assert read_build_id(path=str(shipped)) == modules.build_id(plain)


def test_with_no_path_it_reads_the_file_modprobe_would_load(plain: Path, tmp_path: Path) -> None:
    shipped = tmp_path / "thunderbolt_net.ko.zst"
    shipped.write_bytes(subprocess.run(["zstd", "-q", "-c", str(plain)], check=True,
                                       capture_output=True).stdout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    modinfo = bin_dir / "modinfo"
    modinfo.write_text(f'#!/bin/sh\n[ "$1 $2" = "-n thunderbolt_net" ] && echo {shipped}\n')
    modinfo.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    assert read_build_id(env=env, module="thunderbolt_net") == modules.build_id(plain)


def test_a_missing_file_has_no_build_id(tmp_path: Path) -> None:
    assert read_build_id(path=str(tmp_path / "absent.ko.zst")) is None
