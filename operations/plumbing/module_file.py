"""
A kernel module file on the machine that runs twinbolt, read as the kernel's
loader reads one: an ELF relocatable object (``ET_REL``) whose ``.modinfo``
section names the module (``name=thunderbolt_net``), plain or compressed as
distributions ship modules (zstd, xz, gzip). A compressed file is recognised
by its magic, as ``kmod`` recognises it, and read decompressed.

The site checks its candidate with :func:`read` when it loads, and the driver
layer reads the candidate's build-id, parameters and vermagic through it: a
file that is no module is refused in one line, before any host is touched,
instead of surfacing as a parse error in the middle of a run.
"""

from __future__ import annotations

import gzip
import io
import lzma
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

# zstd has no decompressor in this Python's standard library: the zstd command
# (the Debian package the Makefile installs) decompresses it.
ELF_MAGIC = b"\x7fELF"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b"


class NotAModule(ValueError):
    """What a file is found to be when it is not a kernel module, in a few words."""


@dataclass(frozen=True)
class ModuleFile:
    """
    What a module file declares: its ``.modinfo`` entries (a key may repeat, as
    ``parm`` does) and its GNU build-id (``None`` without the note).
    """

    modinfo: dict[str, list[str]]
    build_id: str | None

    @property
    def name(self) -> str | None:
        return next(iter(self.modinfo.get("name", [])), None)


def read(path: str | Path) -> ModuleFile:
    """
    The module in the file at ``path``; :class:`NotAModule` says what the file is
    instead, ``OSError`` that it cannot be read.
    """
    data = Path(path).read_bytes()
    image = decompressed(data)
    if not image.startswith(ELF_MAGIC):
        raise NotAModule(("" if image is data else "once decompressed, ")
                         + f"not an ELF file: it begins {image[:16]!r}")
    try:
        return module_of(ELFFile(io.BytesIO(image)))
    except ELFError as error:
        raise NotAModule(f"a malformed ELF file: {error}") from None


def module_of(elf: ELFFile) -> ModuleFile:
    """What an ELF file declares as a module, or :class:`NotAModule` if it is none."""
    if elf["e_type"] != "ET_REL":
        raise NotAModule(f"an ELF file of type {elf['e_type']}, not a relocatable object "
                         "(ET_REL), as a kernel module is")
    section = elf.get_section_by_name(".modinfo")
    if section is None:
        raise NotAModule("an ELF relocatable object with no .modinfo section: no kernel module")
    modinfo: dict[str, list[str]] = {}
    for entry in section.data().split(b"\0"):
        key, _, value = entry.decode(errors="replace").partition("=")
        if key:
            modinfo.setdefault(key, []).append(value)
    note = elf.get_section_by_name(".note.gnu.build-id")
    build_id = next((found["n_desc"] for found in note.iter_notes()), None) if note else None
    return ModuleFile(modinfo, build_id)


def decompressed(data: bytes) -> bytes:
    """``data``, decompressed if it is zstd, xz or gzip (by its magic), else as it is."""
    if data.startswith(ZSTD_MAGIC):
        return unzstd(data)
    try:
        if data.startswith(XZ_MAGIC):
            return lzma.decompress(data)
        if data.startswith(GZIP_MAGIC):
            return gzip.decompress(data)
    except (lzma.LZMAError, OSError, EOFError, zlib.error) as error:
        raise NotAModule(f"compressed data that does not decompress: {error}") from None
    return data


def unzstd(data: bytes) -> bytes:
    try:
        done = subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, check=False)
    except FileNotFoundError:
        raise NotAModule("zstd-compressed, and the zstd command that would read it is not "
                         "installed") from None
    if done.returncode != 0:
        raise NotAModule("zstd-compressed data that does not decompress: "
                         + done.stderr.decode(errors="replace").strip())
    return done.stdout
