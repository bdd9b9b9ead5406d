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
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from statistics import mean
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, field_validator

from harness.hosts import counters
from harness.hosts.topology import Endpoint
from harness.judging import disturbance, field_report
from harness.measuring import profile, server_stats, sweep
from harness.measuring.client import Sample, rate, session, span, stream_generate
from harness.measuring.profile import PROFILE
from harness.progress import reporting, say, where

WARM_SUFFIX = "_warm"
# The prefill windows, each measured cold and warm ("<name>_warm").
PREFILLS = ("prefix", "long")
SWEEP = "sweep"
WINDOWS = ("single", "concurrent", SWEEP, PROFILE, "prefix", "prefix_warm", "long", "long_warm")
# Measured from an empty cache; the others prime it, then measure warm.
COLD = ("single", "concurrent", PROFILE, *PREFILLS)
# The most simultaneous requests one level of the sweep may send.
MAX_LEVEL = 256
# The longest input leaves room for the few tokens a chat template (or a
# tokenizer that counts the prompt differently) adds, so that the server does
# not refuse it.
CHAT_TEMPLATE_ALLOWANCE = 256
PROMPT_TEXT = "describe the cable between the two workstations"

LinkSnapshots = Callable[[], Awaitable[dict[str, counters.LinkSnapshot]]]


class WindowSettings(BaseModel):
    """
    The sizes of the windows, which the CLI may shorten. The single and
    concurrent windows, the prefix and the long window's output default to the
    field report's request shapes (:mod:`harness.judging.field_report`); its long input
    was 199,860 tokens, here about 200K.

    + single_tokens: output tokens of the single-stream request
    + concurrent_requests, concurrent_tokens: the concurrent window's requests and their length
    + concurrency: the sweep's levels, simultaneous requests, ascending
    + sweep_tokens: output tokens of each request of the sweep
    + profile_tokens: output tokens of the profiled request
    + prefix_tokens: the shared prefix sent twice; capped by the state's context length
    + prefix_output_tokens: output tokens of each prefix request
    + long_tokens: the longest input wanted; capped by the state's context length
    + long_output_tokens: output tokens of the long request
    + request_timeout_seconds: the longest wait for the next byte of a response
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    single_tokens: PositiveInt = field_report.SINGLE_OUTPUT_TOKENS.value
    concurrent_requests: PositiveInt = field_report.CONCURRENT_REQUESTS.value
    concurrent_tokens: PositiveInt = field_report.CONCURRENT_OUTPUT_TOKENS.value
    concurrency: tuple[PositiveInt, ...] = (1, 2, 4, 8, 16)
    sweep_tokens: PositiveInt = 256
    profile_tokens: PositiveInt = 128
    prefix_tokens: PositiveInt = field_report.PREFIX_TOKENS.value
    prefix_output_tokens: PositiveInt = 16
    long_tokens: PositiveInt = 200_000
    long_output_tokens: PositiveInt = field_report.LONG_OUTPUT_TOKENS.value
    request_timeout_seconds: PositiveFloat = 600.0

    @field_validator("concurrency")
    @classmethod
    def ascending_levels(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if not levels or list(levels) != sorted(set(levels)) or levels[-1] > MAX_LEVEL:
            raise ValueError(f"the sweep's levels must be ascending, distinct, and at most "
                             f"{MAX_LEVEL}: got {','.join(map(str, levels))}")
        return levels


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


RUNNERS = {"single": single, "concurrent": concurrent, PROFILE: profiled}
PROMPTS = {"prefix": prefix, "long": long}
Runner = Callable[[], Awaitable[tuple[list[Sample], dict[str, Any]]]]


def both_temperatures(names: list[str]) -> list[str]:
    """``names`` with the cold and the warm window of each prefill window named, cold first."""
    planned: list[str] = []
    for name in names:
        cold = name.removesuffix(WARM_SUFFIX)
        twins = (cold, cold + WARM_SUFFIX) if cold in PREFILLS else (name,)
        planned += [twin for twin in twins if twin not in planned]
    return planned


def levels(names: list[str], concurrency: tuple[int, ...]) -> list[str]:
    """``names`` with the sweep, where named, as one window per level, lowest first."""
    return [level for name in names
            for level in ([sweep.level_name(n) for n in concurrency] if name == SWEEP else [name])]


async def ready(measurement: Measurement, name: str) -> Runner:
    """
    The window ready to be measured: a prefill window's prompts chosen and, if
    warm, its cache primed, before its counters are read.
    """
    if name in RUNNERS:
        return lambda: RUNNERS[name](measurement)
    if sweep.level_of(name) is not None:
        return lambda: sweep_level(measurement, name)
    prefill = await PROMPTS[name.removesuffix(WARM_SUFFIX)](measurement)
    primed = await prime(measurement, prefill) if name.endswith(WARM_SUFFIX) else None
    return lambda: measure_prefill(measurement, prefill, primed)


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
    """Whether a window is measured from an empty cache: every level of the sweep is."""
    return name in COLD or sweep.level_of(name) is not None


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
    # Enough connections for the concurrent window, or for the snapshots'
    # /server_info and /metrics of every server at once.
    concurrency = max(settings.concurrent_requests, *settings.concurrency,
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
