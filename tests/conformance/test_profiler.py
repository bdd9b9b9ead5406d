"""
SGLang's profiler as twinbolt's profile window uses it and the lab's simulator
answers it, against the source of every release the locks pin: the endpoints
and their answers (``http_server.py``), the request's fields (0.5.9's
``ProfileReqInput``, 0.5.23's ``ProfileReq``), the refusals, and where each
rank writes its trace. The source is read, not imported (it imports torch).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from packaging.version import Version

from harness.measuring import profile
from lab.sglang_sim import api
from lab.sglang_sim.profiler import (
    ALREADY_PROFILING,
    DEFAULT_DIR,
    DIR_VARIABLE,
    GPU_ACTIVITY,
    NOT_PROFILING,
    STARTED,
    STOPPED,
)
from operations.plumbing.venvs import lock_pins

REPO = Path(__file__).resolve().parents[2]
RELEASES = sorted((lock_pins(lock)["sglang"] for lock in REPO.glob("requirements-sglang-*.lock")),
                  key=Version)
# The request body's class: 0.5.9's, then 0.5.23's.
REQUEST_CLASSES = ("ProfileReqInput", "ProfileReq")
# Where the scheduler's profiler lives: 0.5.9's mixin, 0.5.23's manager.
PROFILERS = ("srt/managers/scheduler_profiler_mixin.py",
             "srt/managers/scheduler_components/profiler_manager.py")


def package(release: str) -> Path:
    for path in (REPO / f".venv-sglang-{release}").glob("lib/python*/site-packages/sglang"):
        return path
    raise AssertionError(f"no sglang {release}: `make setup` builds the conformance venvs")


def route_answers(release: str) -> dict[str, tuple[set[str], str]]:
    """Each profiler route's methods and the content of the Response it returns."""
    tree = ast.parse((package(release) / "srt/entrypoints/http_server.py").read_text())
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if (isinstance(decorator, ast.Call) and decorator.args
                    and isinstance(decorator.args[0], ast.Constant)
                    and decorator.args[0].value in ("/start_profile", "/stop_profile")):
                methods = next(ast.literal_eval(keyword.value) for keyword in decorator.keywords
                               if keyword.arg == "methods")
                content = next(ast.literal_eval(keyword.value) for call in ast.walk(node)
                               if isinstance(call, ast.Call)
                               for keyword in call.keywords if keyword.arg == "content")
                found[decorator.args[0].value] = (set(methods), content)
    return found


def request_fields(release: str) -> set[str]:
    """The fields of the class the release's ``/start_profile`` takes as its body."""
    tree = ast.parse((package(release) / "srt/managers/io_struct.py").read_text())
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    name = next(name for name in REQUEST_CLASSES if name in classes
                and any(isinstance(item, ast.AnnAssign) and item.target.id == "output_dir"
                        for item in classes[name].body))
    return {item.target.id for item in classes[name].body if isinstance(item, ast.AnnAssign)}


def profiler_source(release: str) -> str:
    return next((package(release) / path).read_text() for path in PROFILERS
                if (package(release) / path).exists())


@pytest.mark.parametrize("release", RELEASES)
def test_the_routes_take_get_and_post_and_answer_as_the_simulator_does(release: str) -> None:
    assert route_answers(release) == {"/start_profile": ({"GET", "POST"}, STARTED),
                                      "/stop_profile": ({"GET", "POST"}, STOPPED)}


@pytest.mark.parametrize("release", RELEASES)
def test_the_request_has_the_fields_the_window_sends_and_the_simulator_refuses(
        release: str) -> None:
    fields = request_fields(release)
    assert set(profile.start_body("/tmp/x")) <= fields
    assert set(api.UNSIMULATED) | set(api.UNSIMULATED_FLAGS) <= fields


@pytest.mark.parametrize("release", RELEASES)
def test_each_rank_writes_its_trace_where_and_as_the_window_reads_it(release: str) -> None:
    source = profiler_source(release)
    assert f'os.getenv("{DIR_VARIABLE}", "{DEFAULT_DIR}")' in source
    # [prefix-]<profile_id>-TP-<rank>[-DP-..][-PP-..][-EP-..][-stage].trace.json.gz
    assert re.search(r'\[self\.profile_id, f"TP-\{[^}]*tp_rank\}"\]', source)
    assert '".trace.json.gz"' in source
    assert profile.TRACE_SUFFIX == ".trace.json.gz"
    assert profile.rank_of("1765000000.5-TP-1.trace.json.gz") == 1
    assert profile.rank_of("1765000000.5-TP-0-DP-1-DECODE.trace.json.gz") == 0


@pytest.mark.parametrize("release", RELEASES)
def test_the_refusals_are_the_schedulers_own_words(release: str) -> None:
    source = profiler_source(release)
    assert ALREADY_PROFILING in source and NOT_PROFILING in source


@pytest.mark.parametrize("release", RELEASES)
def test_the_gpu_activity_is_the_one_that_records_cuda_kernels(release: str) -> None:
    assert f'"{GPU_ACTIVITY}": torch.profiler.ProfilerActivity.CUDA' in profiler_source(release)
    assert profile.start_body("/tmp/x")["activities"] == [GPU_ACTIVITY]
