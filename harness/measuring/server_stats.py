"""
What the SGLang servers say about a window: tokens generated and the
speculative accept length.

A window's accept length is taken first from its own requests: SGLang's
``/generate`` reports each finished request's ``completion_tokens`` and
``spec_verify_ct`` (its ``meta_info.spec_accept_length`` is their ratio), so
the window's figure is the sum of one over the sum of the other
(:func:`requests_accept_length`): every verify step of every request, counted
once, as the server's own accept length counts them.

Only where the requests do not report their verify steps does it fall back to
``/server_info``: ``internal_states[0].avg_spec_accept_length`` is cumulative
since the server started, so the window's figure is derived from two snapshots.
Each gives the tokens generated so far, ``G`` (``sglang:generation_tokens_total``
of ``/metrics``), and the average ``A``; the verify steps so far are
``S = G / A``; the window's accept length is ``(G1 - G0) / (S1 - S0)``. SGLang
folds its steps into ``A`` only every ``decode_log_interval`` decode batches
(40 by default; ``scheduler_metrics_mixin.log_decode_stats``), so ``A`` may lag
``G`` by that many batches: a window shorter than that may see no change at all,
and the report says the figure is cumulative and may lag (:func:`caveat`).

Both snapshots are taken while the window's own requests are not running, so
``G`` and ``A`` describe the same instant, up to that lag.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.measuring.client import Sample

GENERATION_TOKENS = "sglang:generation_tokens_total"
# The lab's simulator only: how late the timers standing for its GPU's time woke.
TIMERS = "lab_sim:timers_total"
TIMER_LATE_SECONDS = "lab_sim:timer_late_seconds_total"
# Server args that hold credentials; their values never reach a report.
SECRET = re.compile(r"(^|_)(key|secret|password|token)$", re.IGNORECASE)
REDACTED = "(redacted)"
# SGLang's default --decode-log-interval, for a /server_info that does not report it.
DECODE_LOG_INTERVAL = 40
REQUESTS = "requests"
CUMULATIVE = "cumulative"


@dataclass(frozen=True)
class ServerSnapshot:
    """One SGLang server at one instant; ``info`` is its ``/server_info``, redacted."""

    url: str
    generation_tokens: float | None = None
    avg_spec_accept_length: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # The lab's simulator's timers and how late they woke in all; None elsewhere.
    timers: float | None = None
    timer_late_seconds: float | None = None

    @property
    def verify_steps(self) -> float | None:
        """Verify steps since start, ``G / A``; ``None`` without speculative decoding."""
        if self.generation_tokens is None or self.avg_spec_accept_length is None:
            return None
        if not self.avg_spec_accept_length:
            return 0.0
        return self.generation_tokens / self.avg_spec_accept_length


# A key on a command line: SGLang 0.5.23's launch_command is its argv after
# --config's YAML was merged in, keys included.
KEY_FLAG = re.compile(r"(--[\w-]*(?:key|secret|password|token)[ =])\S+", re.IGNORECASE)


def redact(info: dict[str, Any]) -> dict[str, Any]:
    """
    ``/server_info`` without credentials: the values of ``api_key`` and the like,
    and any key flag's value in a command line it quotes.
    """
    return {key: REDACTED if SECRET.search(key) and value is not None
            else KEY_FLAG.sub(rf"\1{REDACTED}", value) if isinstance(value, str) else value
            for key, value in info.items()}


def metric(text: str, name: str) -> float | None:
    """The sum of a Prometheus metric over its label sets, or ``None`` when absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith((name + "{", name + " "))]
    return sum(values) if values else None


async def read_server(client: httpx.AsyncClient, url: str) -> ServerSnapshot:
    try:
        info_response, metrics_response = await asyncio.gather(
            client.get(f"{url}/server_info"), client.get(f"{url}/metrics"))
        info_response.raise_for_status()
        metrics_response.raise_for_status()
    except httpx.HTTPError as error:
        return ServerSnapshot(url, error=f"{type(error).__name__}: {error}")
    info = info_response.json()
    states = info.get("internal_states") or [{}]
    return ServerSnapshot(
        url,
        generation_tokens=metric(metrics_response.text, GENERATION_TOKENS),
        avg_spec_accept_length=states[0].get("avg_spec_accept_length"),
        info=redact(info),
        timers=metric(metrics_response.text, TIMERS),
        timer_late_seconds=metric(metrics_response.text, TIMER_LATE_SECONDS),
    )


async def snapshot(client: httpx.AsyncClient, urls: tuple[str, ...]) -> list[ServerSnapshot]:
    """Every server's counters, read at once."""
    return list(await asyncio.gather(*(read_server(client, url) for url in urls)))


def window_accept_length(before: list[ServerSnapshot],
                         after: list[ServerSnapshot]) -> float | None:
    """
    Tokens per verify step over the window, across the servers; ``None`` without
    speculative decoding or when a snapshot is missing.
    """
    tokens = steps = 0.0
    for first, last in zip(before, after, strict=True):
        if None in (first.verify_steps, last.verify_steps):
            return None
        tokens += last.generation_tokens - first.generation_tokens
        steps += last.verify_steps - first.verify_steps
    return tokens / steps if steps > 0 else None


def window_timer_lateness(before: list[ServerSnapshot],
                          after: list[ServerSnapshot]) -> float | None:
    """
    How late, on average, the simulator's timers woke in the window (seconds);
    ``None`` from a server that does not say (every real one) or without a timer.
    """
    pairs = [(b, a) for b, a in zip(before, after, strict=True)
             if None not in (b.timers, a.timers, b.timer_late_seconds, a.timer_late_seconds)]
    timers = sum(a.timers - b.timers for b, a in pairs)
    if not pairs or timers <= 0:
        return None
    return sum(a.timer_late_seconds - b.timer_late_seconds for b, a in pairs) / timers


def window_generated(before: list[ServerSnapshot],
                     after: list[ServerSnapshot]) -> float | None:
    """Tokens the servers generated over the window (the client's usage should agree)."""
    if any(snap.generation_tokens is None for snap in (*before, *after)):
        return None
    return sum(last.generation_tokens - first.generation_tokens
               for first, last in zip(before, after, strict=True))


def requests_accept_length(samples: list[Sample]) -> float | None:
    """
    Completion tokens over verify steps of the window's finished requests;
    ``None`` when none finished or one of them reports no verify steps (no
    speculative decoding, or an API that does not report them).
    """
    finished = [sample for sample in samples if sample.error is None]
    if not finished or any(sample.verify_steps is None for sample in finished):
        return None
    steps = sum(sample.verify_steps for sample in finished)
    return sum(sample.completion_tokens for sample in finished) / steps if steps else None


def window_accept(samples: list[Sample], before: list[ServerSnapshot],
                  after: list[ServerSnapshot]) -> dict[str, Any]:
    """
    The window's accept length and where it came from: its requests
    (``source`` ``"requests"``), else the cumulative snapshots (``"cumulative"``,
    which may lag); both figures are kept, so a report shows the lag.
    """
    from_requests = requests_accept_length(samples)
    cumulative = window_accept_length(before, after)
    if from_requests is not None:
        chosen, source = from_requests, REQUESTS
    elif cumulative is not None:
        chosen, source = cumulative, CUMULATIVE
    else:
        chosen = source = None
    return {"accept_length": chosen, "accept_length_source": source,
            "requests_accept_length": from_requests, "cumulative_accept_length": cumulative}


def cumulative(window: dict[str, Any]) -> bool:
    """
    Whether a report's window's accept length is the cumulative snapshots'
    (which may lag), not its requests'. Reports from before the requests'
    figure have only the snapshots'.
    """
    server = window["server"]
    return (server["accept_length"] is not None
            and server.get("accept_length_source", CUMULATIVE) == CUMULATIVE)


def decode_log_interval(info: dict[str, Any]) -> int:
    """How many decode batches ``avg_spec_accept_length`` may lag, from ``/server_info``."""
    value = info.get("decode_log_interval")
    return value if isinstance(value, int) and value > 0 else DECODE_LOG_INTERVAL


def caveat(interval: int) -> str:
    """What a reader must know of an accept length taken from the cumulative snapshots."""
    return (f"Accept lengths marked * are cumulative: the window's requests did not report "
            "their verify steps (/generate's meta_info.spec_verify_ct), so they are derived "
            "from /server_info's avg_spec_accept_length before and after the window, which "
            f"SGLang updates only every {interval} decode batches (--decode-log-interval): "
            f"they may lag by up to {interval} decode batches.")
