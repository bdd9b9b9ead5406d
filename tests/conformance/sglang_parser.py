"""
Real SGLang's own argument parser, asked about twinbolt's command lines.

Run by ``test_sglang_parser.py`` with the interpreter of a conformance venv
(``.venv-sglang-VERSION``: sglang without its dependencies, and
``requirements-conformance.lock``), never imported by the tests themselves. It
reads a JSON request on stdin and writes a JSON answer on stdout::

    {"command_lines": [["--model-path", "/m", ...], ...],
     "fields": ["tp_size", ...], "choices_of": ["--quantization"]}

and answers, for each command line, what ``ServerArgs`` holds in those fields or
why the parser refused it; the choices upstream's parser offers for each flag
asked about; the release; and what was stubbed.

The parser is upstream's: ``ServerArgs.add_cli_args`` on an ``ArgumentParser``,
then ``ServerArgs.from_cli_args``, as ``prepare_server_args`` does, with two
differences, both stricter or narrower, never looser:

- ``allow_abbrev=False``: SGLang's own parser takes a unique prefix of a flag, so
  a flag upstream renames (``--enable-cache-report`` to ``--enable-cache-report-x``)
  would still parse there, and only a release after would refuse it. Here the
  exact name must exist;
- ``__post_init__`` does not run: in 0.5.9 it resolves the arguments against the
  GPU and the model's files (memory, CUDA graphs, the model's config), which this
  machine does not have; from 0.5.23 on it does nothing (``resolve_once`` does that).
  ``from_cli_args`` still builds the dataclass from every parsed argument.

Importing ``sglang.srt.server_args`` imports much of SGLang, and with it modules
its parser never calls. Those are stubbed (:data:`STUBBED`), never installed:
torch and triton would bring the multi-gigabyte CUDA build; the rest would only
make the venv larger. A stub module answers every attribute but dunders with a
stub: callable (a decorator returns what it decorates), subscriptable, iterable
and empty, false, zero, a valid base class, and a string, so that module-level
code such as ``getattr(torch, device)`` runs. ``torch`` is a CPU build: no
``npu``, ``hpu``, ``musa`` or ``mlu`` attribute, so SGLang's platform probes find
no accelerator; each stub's ``__version__`` is the one the release pins, if it
pins one. A choice list built from a stub would be empty, and refuse every value:
a stub cannot make a value parse that upstream refuses.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import re
import sys
import types
from collections.abc import Iterator
from typing import NoReturn

# The top-level modules that SGLang's server_args imports (in some supported
# release) and its parser never calls.
STUBBED = (
    "torch", "torchvision", "triton",
    "transformers", "huggingface_hub", "safetensors", "sentencepiece",
    "numpy", "PIL", "regex",
    "IPython", "aiohttp", "starlette", "openai", "partial_json_parser",
)
# What a CPU build of torch lacks: the accelerators of other vendors' plugins.
TORCH_ABSENT = {"npu", "hpu", "musa", "mlu"}
# A stub has no dunder attribute (Python's own protocols probe them), but these,
# which SGLang reads off a stubbed class: 0.5.23's patches of transformers walk
# PretrainedConfig.__class_validators__ (and find none).
STUB_DUNDERS = {"__class_validators__"}

imported: set[str] = set()


class Stub(str):
    """Whatever a stubbed module's attribute is: see the module's docstring."""

    def __new__(cls, name: str) -> Stub:
        return super().__new__(cls, name)

    def __getattr__(self, item: str) -> Stub:
        if item.startswith("__") and item.endswith("__") and item not in STUB_DUNDERS:
            raise AttributeError(item)
        return Stub(f"{self}.{item}")

    def __call__(self, *args: object, **kwargs: object) -> object:
        # A decorator returns what it decorates.
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Stub):
            return args[0]
        return Stub(f"{self}()")

    def __getitem__(self, key: object) -> Stub:
        return Stub(f"{self}[]")

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def __setattr__(self, key: str, value: object) -> None:
        pass

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 0.0

    def __or__(self, other: object) -> Stub:
        return self

    __ror__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __or__
    __truediv__ = __or__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __mro_entries__(self, bases: tuple) -> tuple[type]:
        # class Config(PretrainedConfig, some_keyword=...): a plain class of its own.
        return (type(str(self).rpartition(".")[2] or "Stub", (), {
            "__init_subclass__": classmethod(lambda cls, **kwargs: None),
            "__getattr__": lambda instance, item: Stub(item),
        }),)


class StubModule(types.ModuleType):
    def __getattr__(self, item: str) -> Stub:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        if self.__name__ == "torch" and item in TORCH_ABSENT:
            raise AttributeError(item)
        return Stub(f"{self.__name__}.{item}")


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every module under :data:`STUBBED` first, as a :class:`StubModule`."""

    def __init__(self, versions: dict[str, str]) -> None:
        self.versions = versions

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] not in STUBBED:
            return None
        imported.add(name.partition(".")[0])
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        module.__version__ = self.versions.get(spec.name, "0")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def pinned_versions() -> dict[str, str]:
    """The ``==`` pins of the installed sglang's own requirements, by module-like name."""
    pins = {}
    for requirement in importlib.metadata.requires("sglang") or []:
        found = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*==\s*([^;,\s]+)", requirement)
        if found:
            pins[found.group(1).lower().replace("-", "_")] = found.group(2)
    return pins


def unmet_requirements() -> list[str]:
    """
    sglang's own requirements that what is installed beside it does not meet:
    what stands in for its dependencies must be what it asks for.
    """
    from packaging.requirements import Requirement

    unmet = []
    for line in importlib.metadata.requires("sglang") or []:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"sglang asks for {requirement}, {installed} is installed")
    return unmet


class Refused(Exception):
    """What argparse would have printed before exiting 2."""


class StrictParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refused(message)


def answer(request: dict) -> dict:
    sys.meta_path.insert(0, StubFinder(pinned_versions()))
    import sglang
    from sglang.srt.server_args import ServerArgs

    class Unresolved(ServerArgs):
        def __post_init__(self) -> None:
            pass

    parser = StrictParser(prog="sglang.launch_server", allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    actions = parser._option_string_actions
    parsed = []
    for argv in request["command_lines"]:
        try:
            server_args = Unresolved.from_cli_args(parser.parse_args(argv))
        except Refused as refused:
            parsed.append({"refused": str(refused)})
            continue
        except (TypeError, ValueError) as error:
            parsed.append({"refused": f"from_cli_args: {error}"})
            continue
        parsed.append({"fields": {field: getattr(server_args, field, "(no such field)")
                                  for field in request["fields"]}})
    return {
        "version": sglang.__version__,
        "server_module": importlib.util.find_spec("sglang.launch_server") is not None,
        "choices": {flag: list(getattr(actions.get(flag), "choices", None) or [])
                    for flag in request["choices_of"]},
        "parsed": parsed,
        "stubbed": sorted(imported),
        "unmet_requirements": unmet_requirements(),
    }


if __name__ == "__main__":
    request = json.load(sys.stdin)
    out, sys.stdout = sys.stdout, sys.stderr  # SGLang's import-time chatter is not the answer.
    json.dump(answer(request), out, default=str)
