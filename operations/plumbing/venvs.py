"""
A virtualenv holding exactly what a hash-pinned lock file says, checked without
starting Python.

The gateway's software (LiteLLM, sglang-router) comes from a lock twinbolt
uploads: every distribution pinned with ``==`` and its hashes, installed with
``pip install --require-hashes``, so what runs is what the lab tested, byte for
byte. pip runs only when an installed version differs from its pin: pyinfra's
``pip.packages`` decides by ``pip freeze``, which starts Python and imports pip
(about a second per venv per converge), whereas the version is written in each
distribution's ``.dist-info/METADATA``, which this reads.

``python3 -m venv`` needs the ``venv`` module with ``ensurepip``, which Debian and
Ubuntu ship apart, in ``python3-venv`` (absent from Ubuntu 24.04 by default):
it is installed with apt when missing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.command import PyinfraCommand
from pyinfra.operations import apt, files, pip

from operations.plumbing.facts import EmptyMeansSomething, shell_script

# Every installed distribution's "Version:" line, as "<path>/<name>-<version>.dist-info/METADATA:
# Version: <version>", by one grep (a shell loop over some hundred dist-infos took 0.3 s).
DIST_INFO_SCRIPT = (
    'grep -m1 -H "^Version: " "$1"/lib/python3*/site-packages/*.dist-info/METADATA '
    '2>/dev/null || true'
)


class InstalledVersions(FactBase):
    """
    The distributions installed in the virtualenv at ``venv``, by canonical name,
    with their versions; empty without the venv.

    .. code:: python

        {"litellm": "1.108.5", "sglang-router": "0.3.2", …}
    """

    default = dict

    def command(self, venv: str) -> StringCommand:
        return shell_script(DIST_INFO_SCRIPT, venv)

    def process(self, output: list[str]) -> dict[str, str]:
        installed = {}
        for line in output:
            path, _, version_line = line.partition("/METADATA:")
            # "<name>-<version>.dist-info": the name never holds a "-" there.
            name = path.rpartition("/")[2].removesuffix(".dist-info").rpartition("-")[0]
            version = version_line.removeprefix("Version: ").strip()
            if name and version:
                installed[canonicalize_name(name)] = version
        return installed


class VenvModule(EmptyMeansSomething):
    """Whether ``python3`` can make a virtualenv with pip in it (``venv`` and ``ensurepip``)."""

    def command(self) -> str:
        return "python3 -c 'import venv, ensurepip' 2>/dev/null && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


def lock_pins(lock: Path) -> dict[str, str]:
    """
    The distributions a lock file pins, by canonical name, with their versions.

    A lock is pip's requirements format with hashes: ``name==version \\`` lines,
    each followed by indented ``--hash`` and comment lines.
    """
    pins = {}
    for line in lock.read_text().splitlines():
        if not line or line[0] in " #\t-":
            continue
        text = line.rstrip(" \\")
        requirement = Requirement(text)
        specifiers = list(requirement.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==":
            raise ValueError(f"{lock}: {text!r} is not pinned with ==")
        pins[canonicalize_name(requirement.name)] = specifiers[0].version
    return pins


@operation(is_idempotent=True)
def locked(venv: str, lock: Path, pip_options: Sequence[str] = ()) -> Iterator[PyinfraCommand]:
    """
    The virtualenv at ``venv`` exists and holds what ``lock`` pins; pip runs only
    when some installed version differs.

    + venv: the virtualenv's directory, made with ``python3 -m venv`` if missing
    + lock: a hash-pinned requirements file on this machine, uploaded into the venv
    + pip_options: where pip finds the distributions (``--index-url URL``, or
      ``--no-index --find-links DIR``); pip's own configuration if none

    **Example:**

    .. code:: python

        venvs.locked(name="LiteLLM is installed", venv="/opt/twinbolt/litellm",
                     lock=Path("requirements-litellm.lock"))
    """
    pins = lock_pins(lock)
    installed = host.get_fact(InstalledVersions, venv=venv)
    differ = sorted(name for name, version in pins.items() if installed.get(name) != version)
    if not differ:
        host.noop(f"{venv} holds the {len(pins)} distributions {lock.name} pins")
        return
    if not installed and not host.get_fact(VenvModule):
        yield from apt.packages._inner(packages=["python3-venv"], update=True)
    yield from pip.virtualenv._inner(path=venv, python="python3", venv=True)
    remote_lock = f"{venv}/{lock.name}"
    yield from files.put._inner(src=str(lock), dest=remote_lock, mode="644")
    yield StringCommand(QuoteString(f"{venv}/bin/pip"), "install", "--quiet", "--require-hashes",
                        *(QuoteString(option) for option in pip_options), "-r",
                        QuoteString(remote_lock))
