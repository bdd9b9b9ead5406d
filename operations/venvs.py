"""
A pinned Python distribution in a virtualenv, checked without starting Python.

pyinfra's ``pip.packages`` decides by ``pip freeze``, which starts Python and
imports pip: about a second on the gateway, on every converge, for each of its
two venvs, though nothing is to change. The installed version is written in the
distribution's ``.dist-info/METADATA``, so this reads that file, and runs pip
only when the version there is not the pin.

pip is run directly, not through ``pip.packages``: that operation drops a
requirement's extras (``litellm[proxy]`` would be installed as bare ``litellm``,
without the proxy's own dependencies), and asks for the ``virtualenv`` tool
when the venv was made in the same run.
"""

from __future__ import annotations

from collections.abc import Iterator

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.command import PyinfraCommand
from pyinfra.operations import pip

# Every installed distribution's dist-info in the venv, as "<directory> <Version: line>".
DIST_INFO_SCRIPT = (
    'for meta in "$1"/lib/python3*/site-packages/*.dist-info/METADATA; do '
    '[ -f "$meta" ] || continue; '
    'echo "$(basename "$(dirname "$meta")") $(grep -m1 "^Version: " "$meta")"; done'
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
        return StringCommand("sh", "-c", QuoteString(DIST_INFO_SCRIPT), "-", QuoteString(venv))

    def process(self, output: list[str]) -> dict[str, str]:
        installed = {}
        for line in output:
            directory, _, version_line = line.partition(" ")
            # "<name>-<version>.dist-info": the name never holds a "-" there.
            name = directory.removesuffix(".dist-info").rpartition("-")[0]
            version = version_line.removeprefix("Version: ").strip()
            if name and version:
                installed[canonicalize_name(name)] = version
        return installed


def pinned_version(requirement: str) -> str:
    """The exact version ``requirement`` pins (``name[extras]==version``)."""
    specifiers = list(Requirement(requirement).specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==":
        raise ValueError(f"{requirement!r} is not pinned with ==")
    return specifiers[0].version


@operation(is_idempotent=True)
def pinned_package(venv: str, requirement: str) -> Iterator[PyinfraCommand]:
    """
    The virtualenv at ``venv`` exists and holds ``requirement``'s pinned version;
    pip runs only when it does not.

    + venv: the virtualenv's directory, made with ``python3 -m venv`` if missing
    + requirement: ``name[extras]==version``

    **Example:**

    .. code:: python

        venvs.pinned_package(name="LiteLLM is installed", venv="/opt/twinbolt/litellm",
                             requirement="litellm[proxy]==1.108.5")
    """
    yield from pip.virtualenv._inner(path=venv, python="python3", venv=True)
    name = canonicalize_name(Requirement(requirement).name)
    installed = host.get_fact(InstalledVersions, venv=venv).get(name)
    if installed == pinned_version(requirement):
        host.noop(f"{requirement} is installed in {venv}")
        return
    yield StringCommand(QuoteString(f"{venv}/bin/pip"), "install", "--quiet",
                        QuoteString(requirement))
