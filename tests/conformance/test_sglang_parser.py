"""
twinbolt's SGLang command lines, parsed by real SGLang's own parser, at the oldest
release the site allows (``serving.min_sglang_version``) and the newest one the
locks pin (``requirements-sglang-VERSION.lock``).

Each release's parser runs in a subprocess with the interpreter of that release's
venv (``.venv-sglang-VERSION``, built by ``make setup``), through
``sglang_parser.py``, which says what it stubs and why. The flags, their choices
and the fields they set are upstream's, read from its parser: none is listed
here. So a flag, a choice or a field that upstream renames fails here, not on a
user's first run.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from conformance_helpers import REPO, Rendered, gpu_service
from packaging.version import Version
from sglang_parser import STUBBED

from operations.plumbing.venvs import lock_pins
from operations.serving.sglang import Sglang
from operations.site.model import Serving, site_default
from operations.site.releases import CHOICES, QUANTIZATION, QUANTIZATIONS, accepted
from operations.states import STATES, State

PARSER = Path(__file__).with_name("sglang_parser.py")
RELEASES = sorted((lock_pins(lock)["sglang"] for lock in REPO.glob("requirements-sglang-*.lock")),
                  key=Version)
SERVER_MODULE = site_default(Serving, "sglang_module")
# Where a site keeps NEXTN's draft weights apart from the model.
DRAFT = "/srv/models/qwen-27b-mtp"


@dataclass(frozen=True)
class CommandLine:
    """A rendered argv, what it is, and what SGLang's ``ServerArgs`` must hold for it."""

    what: str
    argv: list[str]
    meant: dict[str, object]


def meant(sglang: Sglang, state: State) -> dict[str, object]:
    """What the service ``state`` runs on this workstation means, in ``ServerArgs``' fields."""
    tp = state.serving == "tp2"
    speculative = state.speculative if tp else None
    return {
        "model_path": sglang.model_path,
        "served_model_name": sglang.served_model_name,
        # Every address: the router, the probes and the clients come from elsewhere.
        "host": "0.0.0.0",
        "port": sglang.port,
        "enable_metrics": True,
        "enable_cache_report": True,
        "quantization": sglang.quantization,
        "context_length": sglang.context_length,
        "mem_fraction_static": sglang.mem_fraction_static,
        "tp_size": 2 if tp else 1,
        "nnodes": 2 if tp else 1,
        "node_rank": sglang.rank if tp else 0,
        "dist_init_addr": f"{sglang.rank0_link_address}:{sglang.dist_init_port}" if tp else None,
        "speculative_algorithm": speculative and speculative.algorithm,
        "speculative_num_steps": speculative and speculative.num_steps,
        "speculative_eagle_topk": speculative and speculative.eagle_topk,
        "speculative_num_draft_tokens": speculative and speculative.num_draft_tokens,
        "speculative_draft_model_path": speculative and sglang.draft_model_path,
    }


def command_lines(rendered: Rendered) -> list[CommandLine]:
    """
    Every SGLang command line of every state, on both workstations, as the site
    renders them, and again with the draft weights set apart.
    """
    drafted = [replace(sglang, draft_model_path=DRAFT) for sglang in rendered.workstations]
    return [
        CommandLine(f"{state.name}: {gpu_service(sglang, state).name}"
                    + (" (draft weights apart)" if sglang.draft_model_path else ""),
                    gpu_service(sglang, state).command, meant(sglang, state))
        for workstations in (rendered.workstations, drafted)
        for state in STATES.values()
        for sglang in workstations
    ]


def quantization_lines(rendered: Rendered) -> dict[str, CommandLine]:
    """Production's replica with each ``--quantization`` the site allows, by the value."""
    production = STATES["production"]
    lines = {}
    for quantization in QUANTIZATIONS:
        sglang = replace(rendered.workstations[0], quantization=quantization)
        lines[quantization] = CommandLine(
            f"production's replica with --quantization {quantization}",
            gpu_service(sglang, production).command, meant(sglang, production))
    return lines


@pytest.fixture(scope="module")
def lines(rendered: Rendered) -> list[CommandLine]:
    return command_lines(rendered)


@pytest.fixture(scope="module")
def quantizations(rendered: Rendered) -> dict[str, CommandLine]:
    return quantization_lines(rendered)


def venv_python(release: str) -> Path:
    return REPO / f".venv-sglang-{release}" / "bin" / "python"


@pytest.fixture(scope="module")
def upstream(lines: list[CommandLine], quantizations: dict[str, CommandLine]) -> dict[str, dict]:
    """
    Each pinned release's answer (``sglang_parser.py``) about every command line:
    ``parsed`` maps each line's ``what`` to the fields it set, or why it was refused.
    """
    asked = [*lines, *quantizations.values()]
    for line in asked:
        # The interpreter and the module are the workstation's; the parser gets the rest.
        assert line.argv[1:3] == ["-m", SERVER_MODULE], line.what
    request = {"command_lines": [line.argv[3:] for line in asked],
               "fields": list(asked[0].meant), "choices_of": list(CHOICES)}
    answers = {}
    for release in RELEASES:
        python = venv_python(release)
        assert python.exists(), f"{python} is missing: `make setup` builds the conformance venvs"
        run = subprocess.run([str(python), str(PARSER)], input=json.dumps(request),
                             capture_output=True, text=True, timeout=120, cwd=REPO)
        assert run.returncode == 0, f"SGLang {release}'s parser did not answer:\n{run.stderr}"
        answer = json.loads(run.stdout)
        answer["parsed"] = {line.what: parsed
                            for line, parsed in zip(asked, answer["parsed"], strict=True)}
        answers[release] = answer
    return answers


def test_the_locks_pin_the_minimum_release_and_a_newer_one() -> None:
    assert RELEASES[0] == site_default(Serving, "min_sglang_version")
    assert len(RELEASES) >= 2, "the newest supported release needs a lock of its own"


@pytest.mark.parametrize("release", RELEASES)
def test_each_venv_holds_its_release_and_what_sglang_asks_for(upstream: dict,
                                                                release: str) -> None:
    answer = upstream[release]
    assert answer["version"] == release
    assert answer["server_module"], f"SGLang {release} has no module {SERVER_MODULE}"
    assert answer["unmet_requirements"] == []


def test_every_stub_stands_for_a_module_some_release_imports(upstream: dict) -> None:
    # A stub no release needs any more would hide an import that should fail.
    used = set().union(*(answer["stubbed"] for answer in upstream.values()))
    assert used == set(STUBBED)


def misread(line: CommandLine, parsed: dict, release: str) -> list[str]:
    """How SGLang ``release`` refuses or misreads ``line``; empty when it reads what was meant."""
    if "refused" in parsed:
        return [f"{line.what}: SGLang {release} refuses it: {parsed['refused']}"]
    wrong = {field: value for field, value in parsed["fields"].items()
             if value != line.meant[field]}
    if wrong:
        return [f"{line.what}: SGLang {release} reads {wrong}, twinbolt meant "
                f"{ {field: line.meant[field] for field in wrong} }"]
    return []


@pytest.mark.parametrize("release", RELEASES)
def test_every_rendered_command_line_parses_and_means_what_twinbolt_meant(
        upstream: dict, lines: list[CommandLine], release: str) -> None:
    problems = [problem for line in lines
                for problem in misread(line, upstream[release]["parsed"][line.what], release)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_table_is_what_upstreams_parser_offers(upstream: dict, release: str) -> None:
    for flag in CHOICES:
        assert accepted(flag, release) == upstream[release]["choices"][flag], (
            f"operations/site/releases.py disagrees with SGLang {release}'s {flag}")


@pytest.mark.parametrize("release", RELEASES)
def test_each_quantization_parses_exactly_where_the_table_says(
        upstream: dict, quantizations: dict[str, CommandLine], release: str) -> None:
    problems = []
    for quantization, line in quantizations.items():
        parsed = upstream[release]["parsed"][line.what]
        if quantization in accepted(QUANTIZATION, release):
            problems += misread(line, parsed, release)
        elif f"invalid choice: '{quantization}'" not in parsed.get("refused", ""):
            problems.append(f"{line.what}: SGLang {release} should refuse it, and answers {parsed}")
    assert not problems, "\n".join(problems)
