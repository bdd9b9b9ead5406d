"""
Measurement windows: bounded runs of real requests, each bracketed by the link
counters of both workstations and the servers' own counters.

- ``single``: one request of 512 output tokens: TTFT, total time, output tok/s.
- ``concurrent``: 6 simultaneous requests of 256 tokens: the aggregate output
  tok/s of the window and each request's own tok/s, kept apart (an aggregate is
  not a per-request figure).
- ``prefix``: one long prefix (120K tokens) and a word of its own: its TTFT
  from an empty cache, and the cached tokens the server reports.
- ``long``: the longest input the state allows (about 200K tokens) plus 64
  output tokens, labelled ``cold`` or ``warm`` by the cached tokens the server
  reports: a warm result is never called a cold prefill.
- ``sweep``: a concurrency sweep, one window per level (default 1, 2, 4, 8
  and 16 simultaneous requests, ``sweep@1`` ... ``sweep@16``), each bounded by
  its requests' output tokens and bracketed by its own counters: per level the
  aggregate and per-request tok/s, TTFT and time per output token
  (:mod:`harness.measuring.sweep`).
- ``profile``: one request of 128 output tokens under SGLang's own profiler,
  on every server: per rank, the share of its time in all-reduce, in compute
  and idle, one all-reduce's latency, and the time lost in stalls that
  coincide with a TP socket's retransmissions; and NCCL's own lines naming
  its transport (:mod:`harness.measuring.profile`, :mod:`harness.measuring.traces`).
- ``prefix_warm`` and ``long_warm``: the same windows warm. The cache is primed
  first, unmeasured (``prefix_warm`` sends the prefix with another word,
  ``long_warm`` the same input), then the window is measured and reports its
  hit rate, the share of the measured prompt the server found cached.

``prefix`` and ``long`` are cut to the server's context length (a real server
refuses a longer prompt, and a refusal measures nothing); each summary says
what it asked for and what it sent.

Every prompt starts with a word of its own, so nothing of one window (or an
earlier run) is ever a cached prefix of another: "cold" is cold by construction
and "warm" only where a window means it.

Cold and warm are also kept apart by the server's word, as a warm cache can
inflate a throughput by far (vllm-project/vllm#52884): every window starts
from an empty cache (SGLang's ``/flush_cache`` on each server), and a cold
window whose requests still report cached tokens is marked invalid, its figures
left out of every comparison; so is a warm window whose measured request found
nothing cached (its priming did not hold). A warm window keeps its own name, so
its figures never stand in a cold window's place.

A window is also left out when something else ran beside it: its readings say
what (:mod:`harness.judging.disturbance`), and it is measured again once at the end.

Each window is declared once, at the end of this module (:data:`DECLARED`): how
it is measured, its sizes, its report's row and headline figures, and its
comparison's columns. A report, a comparison and experiment.py's options read
it there, so a new window is a new declaration and its tests.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from statistics import mean
from typing import Annotated, Any

import httpx
from pydantic import AfterValidator, ConfigDict, Field, PositiveFloat, PositiveInt, create_model

from harness.hosts import counters
from harness.hosts.topology import Endpoint
from harness.judging import disturbance, field_report
from harness.measuring import profile, server_stats, sweep
from harness.measuring.client import Sample, rate, session, span, stream_generate
from harness.measuring.profile import PROFILE
from harness.progress import reporting, say, where

WARM_SUFFIX = "_warm"
# The single stream, whose roofline a report sets beside it (harness.judging.roofline).
SINGLE = "single"
# The most simultaneous requests one level of the sweep may send.
MAX_LEVEL = 256
# The longest input leaves room for the few tokens a chat template (or a
# tokenizer that counts the prompt differently) adds, so that the server does
# not refuse it.
CHAT_TEMPLATE_ALLOWANCE = 256
PROMPT_TEXT = "describe the cable between the two workstations"
# The words of a figure's verdict: a higher rate is faster, a longer time slower.
RATE = ("faster", "slower")
LONGER = ("slower", "faster")

LinkSnapshots = Callable[[], Awaitable[dict[str, counters.LinkSnapshot]]]


def prompt(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens that no earlier request shares a prefix with."""
    words = [uuid.uuid4().hex, *PROMPT_TEXT.split()]
    return " ".join(words + ["x"] * max(0, tokens - len(words)))


@dataclass
class Measurement:
    """What every window needs: the endpoint, the HTTP client and the counter readers."""

    endpoint: Endpoint
    settings: WindowSettings
    client: httpx.AsyncClient
    link_snapshot: LinkSnapshots
    server_info: dict[str, Any]
    profile_hosts: profile.ProfileHosts | None = None
    # The CPU seconds others used on this machine so far (harness.judging.disturbance).
    machine_cpu: Callable[[], float] = disturbance.machine_cpu_seconds

    @property
    def cache_report(self) -> bool:
        # Without --enable-cache-report SGLang reports no cached tokens at all, and
        # "none reported" would read as "cold".
        return bool(self.server_info.get("enable_cache_report"))

    async def stream(self, samples: list[tuple[Sample, str]]) -> list[Sample]:
        """
        Stream every (sample, prompt) at once, through ``/generate``: the one
        API whose answers carry each request's verify steps.
        """
        return list(await asyncio.gather(
            *(stream_generate(self.client, self.endpoint.url, text, sample)
              for sample, text in samples)))

    async def context_length(self) -> int | None:
        """
        The state's context window: ``max_model_len`` of ``/v1/models`` (the
        model's own length when ``--context-length`` is not set), else the flag.
        """
        response = await self.client.get(f"{self.endpoint.servers[0]}/v1/models")
        if response.status_code == 200:
            for model in response.json().get("data", []):
                if model.get("max_model_len"):
                    return int(model["max_model_len"])
        return self.server_info.get("context_length")


def progress_line(name: str, samples: list[Sample], waiting_for: str) -> Callable[[float], str]:
    """The progress line of a window: how many requests stream, and what they have received."""

    def line(elapsed: float) -> str:
        done = sum(1 for s in samples if s.completion_tokens is not None or s.error)
        streaming = sum(1 for s in samples if s.first_token_at is not None) - done
        waiting = len(samples) - done - streaming
        parts = [f"{done} done", f"{streaming} streaming ({sum(s.chunks for s in samples)} "
                 "chunks)"]
        if waiting:
            parts.append(f"{waiting} waiting for {waiting_for}")
        return f"  [{name}] {elapsed:5.1f}s  " + ", ".join(parts)

    return line


async def run_samples(measurement: Measurement, name: str, requests: list[tuple[Sample, str]],
                      waiting_for: str = "the first token") -> list[Sample]:
    samples = [sample for sample, _ in requests]
    async with reporting(progress_line(name, samples, waiting_for)):
        return await measurement.stream(requests)


# The windows: each returns its samples and its summary.


async def single(measurement: Measurement) -> tuple[list[Sample], dict[str, Any]]:
    settings = measurement.settings
    (sample,) = await run_samples(measurement, "single",
                                  [(Sample("single", settings.single_tokens), prompt(16))])
    return [sample], {
        "ttft_seconds": sample.ttft,
        "seconds": sample.seconds,
        "completion_tokens": sample.completion_tokens,
        "output_tok_s": sample.output_rate,
        "tokens_per_chunk": sample.tokens_per_chunk,
    }


async def concurrent(measurement: Measurement) -> tuple[list[Sample], dict[str, Any]]:
    settings = measurement.settings
    requests = [(Sample(f"concurrent-{index}", settings.concurrent_tokens), prompt(16))
                for index in range(settings.concurrent_requests)]
    samples = await run_samples(measurement, "concurrent", requests)
    finished = [s for s in samples if s.error is None]
    per_request = [s.output_rate for s in finished]
    seconds = span(finished)
    return samples, {
        "requests": len(samples),
        "completion_tokens": sum(s.completion_tokens for s in finished),
        "seconds": seconds,
        # One figure for the window; never averaged with the per-request ones.
        "aggregate_output_tok_s": rate(sum(s.completion_tokens for s in finished), seconds)
        if len(finished) == len(samples) else None,
        "per_request_output_tok_s": _spread(per_request),
        "ttft_seconds": _spread([s.ttft for s in finished]),
    }


async def sweep_level(measurement: Measurement, name: str,
                      ) -> tuple[list[Sample], dict[str, Any]]:
    """One level of the sweep: as many simultaneous requests as the level names."""
    level = sweep.level_of(name)
    requests = [(Sample(f"{name}-{index}", measurement.settings.sweep_tokens), prompt(16))
                for index in range(level)]
    samples = await run_samples(measurement, name, requests)
    return samples, sweep.level_summary(level, samples)


async def profiled(measurement: Measurement) -> tuple[list[Sample], dict[str, Any]]:
    """
    One request under SGLang's profiler on every server, the TP sockets
    sampled meanwhile; then every rank's trace read, and NCCL's lines.
    """
    hosts = measurement.profile_hosts
    if hosts is None:
        raise ValueError("the profile window needs the workstations: measure it through "
                         "experiment.py")
    directory = profile.trace_directory()
    samplers = hosts.samplers(measurement.settings.request_timeout_seconds)
    try:
        await asyncio.gather(*(sampler.start() for sampler in samplers))
        started = await post_all(measurement, "start_profile", profile.start_body(directory),
                                 "started")
        (sample,) = await run_samples(measurement, PROFILE, [
            (Sample(PROFILE, measurement.settings.profile_tokens), prompt(16))])
        stopped = await post_all(measurement, "stop_profile", None, "stopped")
    finally:
        # No sampler outlives the window, even one cut short.
        samples = await asyncio.gather(*(sampler.stop() for sampler in samplers))
    say(f"{where(f'window {PROFILE}')}: fetching the traces from {directory}")
    fetched, nccl = await asyncio.gather(hosts.fetch(directory), hosts.nccl_lines())
    return [sample], {
        "ttft_seconds": sample.ttft,
        "completion_tokens": sample.completion_tokens,
        "output_tok_s": sample.output_rate,
        "profiler": {"start": started, "stop": stopped},
        **profile.analyse(fetched, list(samples)),
        "nccl": nccl,
    }


async def fitted(measurement: Measurement, wanted: int, output_tokens: int,
                 ) -> tuple[int, dict[str, Any]]:
    """
    ``wanted`` input tokens cut to what the context leaves beside
    ``output_tokens`` and to the longest input the server admits (its KV cache
    pool's ``max_req_input_len``), each less the chat template's tokens, and
    the summary's account of it.
    """
    context = await measurement.context_length()
    admitted = measurement.server_info.get("max_req_input_len")
    limits = [wanted]
    if context is not None:
        limits.append(context - output_tokens - CHAT_TEMPLATE_ALLOWANCE)
    if admitted is not None:
        limits.append(admitted - 1 - CHAT_TEMPLATE_ALLOWANCE)
    tokens = min(limits)
    account: dict[str, Any] = {"context_length": context, "max_req_input_len": admitted,
                               "wanted_tokens": wanted, "shortened": tokens < wanted}
    if tokens < wanted:
        say(f"  {wanted:,} input tokens do not fit {fits(context, admitted)}: "
            f"sending {tokens:,}")
    return tokens, account


def fits(context: int | None, admitted: int | None) -> str:
    """What a prompt must fit: the context, and the longest input the KV cache admits."""
    parts = [f"the context of {context:,}" if context is not None else None,
             f"the {admitted:,} input tokens the KV cache admits" if admitted is not None
             else None]
    return " and ".join(part for part in parts if part)


@dataclass(frozen=True)
class Prefill:
    """
    A prefill window's prompts, chosen before the window: a warm one primes
    with ``primer`` before its counters are read, then measures ``measured``.
    """

    name: str
    output_tokens: int
    tokens: int
    account: dict[str, Any]
    primer: str
    measured: str


async def prefix(measurement: Measurement) -> Prefill:
    """A shared prefix, then a word of each request's own: a warm one finds the prefix cached."""
    settings = measurement.settings
    tokens, account = await fitted(measurement, settings.prefix_tokens,
                                   settings.prefix_output_tokens + 1)
    shared = prompt(tokens)
    return Prefill("prefix", settings.prefix_output_tokens, tokens,
                   {**account, "prefix_tokens": tokens}, f"{shared} first", f"{shared} second")


async def long(measurement: Measurement) -> Prefill:
    """The longest input the context allows: a warm one finds it all cached but its end."""
    settings = measurement.settings
    tokens, account = await fitted(measurement, settings.long_tokens,
                                   settings.long_output_tokens)
    text = prompt(tokens)
    return Prefill("long", settings.long_output_tokens, tokens, account, text, text)


async def send_prefill(measurement: Measurement, prefill: Prefill, label: str,
                       text: str) -> Sample:
    (sample,) = await run_samples(
        measurement, prefill.name, [(Sample(label, prefill.output_tokens), text)],
        waiting_for=f"the prefill of {prefill.tokens:,} tokens")
    return sample


async def prime(measurement: Measurement, prefill: Prefill) -> dict[str, Any]:
    """Send a warm window's primer once, unmeasured: what the server said of it."""
    say(f"{where(f'window {prefill.name}{WARM_SUFFIX}')}: priming the cache, unmeasured")
    sample = await send_prefill(measurement, prefill, f"{prefill.name}-primer", prefill.primer)
    return {**_prefill(sample, measurement.cache_report), "error": sample.error}


async def measure_prefill(measurement: Measurement, prefill: Prefill,
                          primed: dict[str, Any] | None,
                          ) -> tuple[list[Sample], dict[str, Any]]:
    """The measured request of a prefill window, cold (``primed`` None) or warm."""
    sample = await send_prefill(measurement, prefill, prefill.name, prefill.measured)
    summary = {
        **prefill.account,
        "temperature": "cold" if primed is None else "warm",
        **_prefill(sample, measurement.cache_report),
        "seconds": sample.seconds,
        "output_tok_s": sample.output_rate,
    }
    if primed is not None:
        summary |= {"primed": primed, "hit_rate": hit_rate(sample)}
    return [sample], summary


def hit_rate(sample: Sample) -> float | None:
    """The share of the measured prompt the server found cached."""
    if sample.cached_tokens is None or not sample.prompt_tokens:
        return None
    return sample.cached_tokens / sample.prompt_tokens


def _prefill(sample: Sample, cache_report: bool) -> dict[str, Any]:
    """A long request's prefill, labelled by what the server says it had cached."""
    if sample.error is not None or sample.cached_tokens is None:
        label = None
    elif not cache_report:
        label = "unknown (the server runs without --enable-cache-report)"
    elif sample.cached_tokens:
        label = "warm"
    else:
        label = "cold"
    return {
        "prompt_tokens": sample.prompt_tokens,
        "cached_tokens": sample.cached_tokens,
        "prefill": label,
        "ttft_seconds": sample.ttft,
    }


def _spread(values: list[float | None]) -> dict[str, float | None]:
    known = [value for value in values if value is not None]
    return {
        "mean": mean(known) if known else None,
        "min": min(known, default=None),
        "max": max(known, default=None),
    }


# The declarations: each window once, with all that a measurement, its report,
# a comparison and experiment.py's command line know of it.

Result = tuple[list[Sample], dict[str, Any]]
Runner = Callable[[], Awaitable[Result]]
Ready = Callable[[Measurement, str], Awaitable[Runner]]
# A headline figure, from a window's result (empty when none of it counts) and its report.
Reader = Callable[[dict[str, Any], dict[str, Any]], Any]
# The report's number format, handed to a window's cells: measuring never imports a report.
Shown = Callable[..., str]


@dataclass(frozen=True)
class Setting:
    """
    A size of a window, which experiment.py's ``--<name>`` (dashes for
    underscores) may change: its type as :data:`WindowSettings` checks it, its
    default, and what it sizes.
    """

    name: str
    kind: Any
    default: int | float | tuple[int, ...]
    sizes: str


@dataclass(frozen=True)
class Figure:
    """
    A figure a window gives its report's headline, as ``key``: ``read`` from the
    window's result, or from its warm twin's (``warm``). With a ``title`` it has
    a column of the comparison, shown to ``digits``, with a ratio and its
    verdict's ``words`` where it has them; a ``charted`` one, a panel of its chart.
    """

    key: str
    read: Reader
    title: str | None = None
    digits: int = 1
    words: tuple[str, str] | None = None
    charted: bool = False
    warm: bool = False


@dataclass(frozen=True)
class Label:
    """
    The word a window's result is labelled by (a prefill's ``cold`` or
    ``warm``), a headline figure, in a column of the comparison's table beside
    the figure it qualifies, that one shown to ``digits`` in ``unit``.
    """

    key: str
    title: str
    beside: str
    digits: int
    unit: str


@dataclass(frozen=True)
class Cells:
    """A window's own cells of its report's row; None where it has no such figure."""

    rate: str | None = None
    aggregate: str | None = None
    ttft: str | None = None
    tokens: str | None = None


def one_at_a_time(settings: Any) -> int:
    """A window's requests sent one after another, however it is sized."""
    return 1


@dataclass(frozen=True)
class Window:
    """
    A window, declared once: how it is measured, its sizes, its report's row and
    headline figures, and its comparison's columns.

    + name: the window, as ``--window`` names it and its result is named
    + ready: the window ready to be measured, by its result's name
    + cells: its own cells of its report's row, from its summary
    + settings: its sizes, each an option of experiment.py
    + figures: what it gives its report's headline, and the comparison's columns
    + label: what its result is labelled by, in the comparison's table
    + at_once: the most requests it sends at once, for the client's connections
    + warm: measured cold and, as ``<name>_warm``, warm (primed, then measured);
      its figures in the comparison's table of cold and warm prefills
    + levelled: measured at each level of ``--concurrency``, one window each
      (``sweep@<level>``, :mod:`harness.measuring.sweep`)
    + decoding: its output tokens count in the link's bytes per 1,000 of them (a
      prefill moves its whole prompt's activations for a handful)
    """

    name: str
    ready: Ready
    cells: Callable[[dict[str, Any], Shown], Cells]
    settings: tuple[Setting, ...] = ()
    figures: tuple[Figure, ...] = ()
    label: Label | None = None
    at_once: Callable[[Any], int] = one_at_a_time
    warm: bool = False
    levelled: bool = False
    decoding: bool = True

    def names(self) -> tuple[str, ...]:
        """What ``--window`` takes for it: its name and, measured warm too, its warm twin's."""
        return (self.name, f"{self.name}{WARM_SUFFIX}") if self.warm else (self.name,)

    def read_from(self, figure: Figure) -> str:
        """The result one of its figures is read from: its own, or its warm twin's."""
        return f"{self.name}{WARM_SUFFIX}" if figure.warm else self.name


def summarised(*path: str) -> Reader:
    """A figure of a window's summary, at ``path``; None without it."""

    def read(window: dict[str, Any], report: dict[str, Any]) -> Any:
        found = window.get("summary", {})
        for key in path[:-1]:
            found = found.get(key, {})
        return found.get(path[-1])

    return read


def accept_length(window: dict[str, Any], report: dict[str, Any]) -> float | None:
    """The accept length of the window's own requests (:func:`server_stats.window_accept`)."""
    return window.get("server", {}).get("accept_length")


def accept_length_cumulative(window: dict[str, Any], report: dict[str, Any]) -> bool:
    """Whether that accept length is cumulative (:func:`server_stats.cumulative`)."""
    return bool(window) and server_stats.cumulative(window)


def roofline_tok_s(window: dict[str, Any], report: dict[str, Any]) -> float | None:
    """The single stream's roofline, which its report carries (:mod:`harness.judging.roofline`)."""
    return ((report.get("roofline") or {}).get("bound") or {}).get("tok_s")


def one_request(summary: dict[str, Any], number: Shown) -> Cells:
    """A window of one request: its output tok/s and its TTFT."""
    return Cells(rate=number(summary["output_tok_s"]), ttft=number(summary["ttft_seconds"], 3))


def per_request(summary: dict[str, Any], number: Shown) -> Cells:
    """The concurrent window: per request the mean tok/s and their range; the aggregate."""
    rates = summary["per_request_output_tok_s"]
    return Cells(rate=(f"{number(rates['mean'])} per request "
                       f"({number(rates['min'])}–{number(rates['max'])})"),
                 aggregate=number(summary["aggregate_output_tok_s"]),
                 ttft=number(summary["ttft_seconds"]["mean"], 3))


def per_level(summary: dict[str, Any], number: Shown) -> Cells:
    """A level of the sweep: per request the median tok/s and the 99th percentile; the aggregate."""
    rates = summary["per_request_output_tok_s"]
    return Cells(rate=f"{number(rates['p50'])} per request, p50 (p99 {number(rates['p99'])})",
                 aggregate=number(summary["aggregate_output_tok_s"]),
                 ttft=number(summary["ttft_seconds"]["p50"], 3))


def prefilled(summary: dict[str, Any], number: Shown) -> Cells:
    """
    A prefill window: one request, and its prompt: the tokens the server found
    cached, the hit rate of a warm one, and what it was cut from to fit.
    """
    tokens = (f"{number(summary['prompt_tokens'])}: cached "
              f"{number(summary['cached_tokens'])} ({summary['prefill']} prefill)")
    if summary.get("hit_rate") is not None:
        tokens += f", hit rate {summary['hit_rate']:.0%} after priming"
    if summary.get("shortened"):
        tokens += (f"; cut from {number(summary['wanted_tokens'])} to fit "
                   + fits(summary["context_length"], summary.get("max_req_input_len")))
    return replace(one_request(summary, number), tokens=tokens)


def once(run: Callable[[Measurement], Awaitable[Result]]) -> Ready:
    """A window measured as it is: nothing to choose or prime before its counters are read."""

    async def ready(measurement: Measurement, name: str) -> Runner:
        return lambda: run(measurement)

    return ready


async def each_level(measurement: Measurement, name: str) -> Runner:
    """A level of the sweep, the one its name holds."""
    return lambda: sweep_level(measurement, name)


def primed(prompts: Callable[[Measurement], Awaitable[Prefill]]) -> Ready:
    """
    A prefill window: its prompts chosen and, for its warm twin, the cache
    primed, before its counters are read.
    """

    async def ready(measurement: Measurement, name: str) -> Runner:
        prefill = await prompts(measurement)
        primed = await prime(measurement, prefill) if name.endswith(WARM_SUFFIX) else None
        return lambda: measure_prefill(measurement, prefill, primed)

    return ready


def cold_and_warm(name: str, prompts: Callable[[Measurement], Awaitable[Prefill]],
                  settings: tuple[Setting, ...], labelled: bool = False) -> Window:
    """
    A prefill window, measured cold and warm: each one's TTFT and the warm one's
    hit rate, in columns of their own; ``labelled``, its cold result's label
    (:func:`_prefill`) beside its TTFT in the comparison's table.
    """
    ttft = summarised("ttft_seconds")
    warm = f"{name}{WARM_SUFFIX}"
    figures = (Figure(f"{name}_ttft_s", ttft, f"{name} TTFT s, cold", 3, LONGER),
               Figure(f"{warm}_ttft_s", ttft, f"{name} TTFT s, warm", 3, LONGER, warm=True),
               Figure(f"{warm}_hit_rate", summarised("hit_rate"), f"{name} hit rate, warm", 3,
                      warm=True))
    label = None
    if labelled:
        label = Label(f"{name}_prefill", f"{name} prefill", f"{name}_ttft_s", 2, "s TTFT")
        figures += (Figure(label.key, summarised("prefill")),)
    return Window(name, primed(prompts), prefilled, settings=settings, figures=figures,
                  label=label, warm=True, decoding=False)


def ascending(levels: tuple[int, ...]) -> tuple[int, ...]:
    """The sweep's levels, refused unless ascending, distinct, and at most :data:`MAX_LEVEL`."""
    if not levels or list(levels) != sorted(set(levels)) or levels[-1] > MAX_LEVEL:
        raise ValueError(f"the sweep's levels must be ascending, distinct, and at most "
                         f"{MAX_LEVEL}: got {','.join(map(str, levels))}")
    return levels


# The windows' sizes default to the field report's request shapes where it gives
# them (harness.judging.field_report): its long input was 199,860 tokens, here about 200K.
DECLARED = {window.name: window for window in (
    Window(SINGLE, once(single), one_request, settings=(
        Setting("single_tokens", PositiveInt, field_report.SINGLE_OUTPUT_TOKENS.value,
                "output tokens of the single-stream request"),
    ), figures=(
        Figure("single_tok_s", summarised("output_tok_s"), "single tok/s", 1, RATE,
               charted=True),
        Figure("roofline_single_tok_s", roofline_tok_s, "roofline single tok/s", 1),
        Figure("single_ttft_s", summarised("ttft_seconds")),
        # The state's accept length: the comparison's column for it follows every window's.
        Figure("accept_length", accept_length),
        Figure("accept_length_cumulative", accept_length_cumulative),
    )),
    Window("concurrent", once(concurrent), per_request, settings=(
        Setting("concurrent_requests", PositiveInt, field_report.CONCURRENT_REQUESTS.value,
                "the concurrent window's requests"),
        Setting("concurrent_tokens", PositiveInt, field_report.CONCURRENT_OUTPUT_TOKENS.value,
                "output tokens of each of its requests"),
    ), figures=(
        Figure("aggregate_tok_s", summarised("aggregate_output_tok_s"), "aggregate tok/s", 1,
               RATE, charted=True),
        Figure("per_request_tok_s", summarised("per_request_output_tok_s", "mean"),
               "per-request tok/s", 1),
    ), at_once=lambda settings: settings.concurrent_requests),
    Window(sweep.NAME, each_level, per_level, settings=(
        Setting("concurrency", Annotated[tuple[PositiveInt, ...], AfterValidator(ascending)],
                (1, 2, 4, 8, 16), "the sweep's levels, simultaneous requests, ascending"),
        Setting("sweep_tokens", PositiveInt, 256, "output tokens of each request of the sweep"),
    ), figures=(
        # Each level's figures (harness.measuring.sweep), by level.
        Figure(sweep.NAME, lambda _, report: sweep.figures(report)),
    ), at_once=lambda settings: max(settings.concurrency), levelled=True),
    Window(PROFILE, once(profiled), one_request, settings=(
        Setting("profile_tokens", PositiveInt, 128, "output tokens of the profiled request"),
    ), figures=(
        # Each rank's shares and stalls, and NCCL's transport (harness.measuring.profile).
        Figure(PROFILE, lambda _, report: profile.figures(report)),
    )),
    cold_and_warm("prefix", prefix, settings=(
        Setting("prefix_tokens", PositiveInt, field_report.PREFIX_TOKENS.value,
                "the shared prefix sent twice; capped by the state's context length"),
        Setting("prefix_output_tokens", PositiveInt, 16, "output tokens of each prefix request"),
    )),
    cold_and_warm("long", long, settings=(
        Setting("long_tokens", PositiveInt, 200_000,
                "the longest input wanted; capped by the state's context length"),
        Setting("long_output_tokens", PositiveInt, field_report.LONG_OUTPUT_TOKENS.value,
                "output tokens of the long request"),
    ), labelled=True),
)}
# Not a window's own: how long any request may wait for its next byte.
TIMEOUT = Setting("request_timeout_seconds", PositiveFloat, 600.0,
                  "the longest wait for the next byte of a response")


def settings() -> tuple[Setting, ...]:
    """Every window's settings, in the order declared, then the timeout every request shares."""
    return (*(setting for window in DECLARED.values() for setting in window.settings), TIMEOUT)


WindowSettings = create_model(
    "WindowSettings", __config__=ConfigDict(extra="forbid", frozen=True), __module__=__name__,
    __doc__="The sizes of the windows, which the command line may shorten: each one's "
            "declared by its window, its description saying what it sizes.",
    **{setting.name: (setting.kind, Field(setting.default, description=setting.sizes))
       for setting in settings()})


def names() -> list[str]:
    """What ``--window`` takes, in the order a measurement runs them by default."""
    return [name for window in DECLARED.values() for name in window.names()]


def window_of(name: str) -> Window | None:
    """The window a result of ``name`` is of (itself, its warm twin, or a level); None if none."""
    return next((window for window in DECLARED.values() if name in window.names()
                 or (window.levelled and sweep.level_of(name) is not None)), None)


def both_temperatures(names: list[str]) -> list[str]:
    """``names`` with the cold and the warm window of each prefill window named, cold first."""
    planned: list[str] = []
    for name in names:
        window = window_of(name)
        twins = window.names() if window is not None and window.warm else (name,)
        planned += [twin for twin in twins if twin not in planned]
    return planned


def levels(names: list[str], concurrency: tuple[int, ...]) -> list[str]:
    """``names`` with the sweep, where named, as one window per level, lowest first."""
    levelled = {window.name for window in DECLARED.values() if window.levelled}
    return [level for name in names
            for level in ([sweep.level_name(n) for n in concurrency] if name in levelled
                          else [name])]


async def ready(measurement: Measurement, name: str) -> Runner:
    """The window ready to be measured, as its declaration readies it."""
    window = window_of(name)
    if window is None:
        raise ValueError(f"no window is declared as {name!r} (have {', '.join(names())})")
    return await window.ready(measurement, name)


async def run_window(measurement: Measurement, name: str) -> dict[str, Any]:
    """
    One window, bracketed by both workstations' link counters and the servers'
    counters, read before the first request and after the last answer.
    """
    flushed = await flush_caches(measurement)
    measure = await ready(measurement, name)
    say(f"{where(f'window {name}')}: reading counters")
    servers = measurement.endpoint.servers
    links_before, servers_before = await asyncio.gather(
        measurement.link_snapshot(), server_stats.snapshot(measurement.client, servers))
    machine_before = measurement.machine_cpu()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    origin = time.perf_counter()
    samples, summary = await measure()
    seconds = time.perf_counter() - origin
    machine = measurement.machine_cpu() - machine_before
    links_after, servers_after = await asyncio.gather(
        measurement.link_snapshot(), server_stats.snapshot(measurement.client, servers))
    deltas = {host: counters.delta(links_before[host], links_after[host])
              for host in links_before}
    beside = {host: disturbance.host_reading(links_before[host], links_after[host], deltas[host])
              for host in links_before}
    late = server_stats.window_timer_lateness(servers_before, servers_after)
    disturbed = disturbance.reasons(beside, machine, seconds, late)
    errors = [f"{sample.label}: {sample.error}" for sample in samples if sample.error]
    result = {
        "name": name,
        "started_at": started_at,
        "seconds": seconds,
        "summary": summary,
        "errors": errors,
        "flushed": flushed,
        "invalid": (cached_in_cold(name, samples, measurement.cache_report)
                    or nothing_cached_in_warm(name, samples, measurement.cache_report)),
        # What else ran while it was measured, and why that disturbed it, if it did.
        "beside": {"hosts": beside, "machine_cpu_seconds": machine,
                   "timer_late_seconds": late},
        "disturbed": "; ".join(disturbed) or None,
        "samples": [sample.to_json(origin) for sample in samples],
        "link": {
            "before": {host: asdict(snap) for host, snap in links_before.items()},
            "after": {host: asdict(snap) for host, snap in links_after.items()},
            "delta": deltas,
            "totals": counters.window_totals(deltas),
        },
        "server": {
            **server_stats.window_accept(samples, servers_before, servers_after),
            "generated_tokens": server_stats.window_generated(servers_before, servers_after),
            "before": [_server_counters(snap) for snap in servers_before],
            "after": [_server_counters(snap) for snap in servers_after],
        },
    }
    say(f"{where(f'window {name}')}: done in {seconds:.1f}s"
        + (f", {len(errors)} failed" if errors else "")
        + (f"; disturbed: {result['disturbed']}" if disturbed else ""))
    return result


async def flush_caches(measurement: Measurement) -> dict[str, str]:
    """
    Empty every server's prefix cache before a window (SGLang's ``/flush_cache``):
    what each answered. A server that refuses leaves the window to the check of
    :func:`cached_in_cold`.
    """
    return await post_all(measurement, "flush_cache", None, "flushed")


async def post_all(measurement: Measurement, path: str, body: dict[str, Any] | None,
                   done: str) -> dict[str, str]:
    """
    ``path``, one of SGLang's admin endpoints, posted to every server with its
    admin key: ``done`` from each that answered 200, else why not.
    """
    answers = {}
    for url in measurement.endpoint.servers:
        try:
            response = await measurement.client.post(f"{url}/{path}", json=body,
                                                     headers=measurement.endpoint.admin_headers)
        except httpx.HTTPError as error:
            answers[url] = f"{type(error).__name__}: {error}"
            continue
        answers[url] = (done if response.status_code == 200
                        else f"HTTP {response.status_code}: {response.text.strip()[:200]}")
    return answers


def is_cold(name: str) -> bool:
    """Whether a window is measured from an empty cache: every declared one but a warm twin."""
    window = window_of(name)
    return window is not None and name != f"{window.name}{WARM_SUFFIX}"


def cached_in_cold(name: str, samples: list[Sample], cache_report: bool) -> str | None:
    """Why a cold window is invalid: a request of it reported cached tokens; None if none did."""
    warm = [f"{sample.label} ({sample.cached_tokens:,})" for sample in samples
            if is_cold(name) and cache_report and sample.cached_tokens]
    if not warm:
        return None
    return (f"a cold window found cached tokens in {', '.join(warm)}: left out of the "
            "figures")


def nothing_cached_in_warm(name: str, samples: list[Sample], cache_report: bool) -> str | None:
    """Why a warm window is invalid: its finished request found nothing cached; None if it did."""
    cold = [sample.label for sample in samples
            if not is_cold(name) and cache_report and sample.cached_tokens == 0]
    if not cold:
        return None
    return (f"a warm window found nothing cached in {', '.join(cold)} after priming: left "
            "out of the figures")


def _server_counters(snap: server_stats.ServerSnapshot) -> dict[str, Any]:
    return {"url": snap.url, "generation_tokens": snap.generation_tokens,
            "avg_spec_accept_length": snap.avg_spec_accept_length, "error": snap.error}


class EndpointDown(RuntimeError):
    """The state's server does not answer ``/server_info``: nothing to measure."""


async def run(endpoint: Endpoint, names: list[str], settings: WindowSettings,
              link_snapshot: LinkSnapshots, profile_hosts: profile.ProfileHosts | None = None,
              machine_cpu: Callable[[], float] = disturbance.machine_cpu_seconds,
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """
    Run the named windows one after another, in the order given, the sweep one
    level at a time; then each window that was disturbed (:mod:`harness.judging.disturbance`)
    once more, marked ``again``.

    Returns the first server's ``/server_info`` (redacted, for the report's
    configuration) and each window's result.
    """
    # Enough connections for the window that sends the most requests at once, or
    # for the snapshots' /server_info and /metrics of every server at once.
    concurrency = max(*(window.at_once(settings) for window in DECLARED.values()),
                      2 * len(endpoint.servers))
    async with session(concurrency, settings.request_timeout_seconds, endpoint.headers) as client:
        first = await server_stats.read_server(client, endpoint.servers[0])
        if first.error:
            raise EndpointDown(f"{endpoint.servers[0]}/server_info: {first.error}")
        measurement = Measurement(endpoint, settings, client, link_snapshot, first.info,
                                  profile_hosts, machine_cpu)
        results = [await run_window(measurement, name)
                   for name in levels(names, settings.concurrency)]
        # Measured again once, last: the disturbed result stays in the report, named.
        for name in [result["name"] for result in results if result["disturbed"]]:
            say(f"{where(f'window {name}')}: measuring it again, once, as it was disturbed")
            results.append({**await run_window(measurement, name), "again": True})
    return first.info, results
