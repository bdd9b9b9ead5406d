"""
What the SGLang servers say about a window: tokens generated and the
speculative accept length, from ``/metrics`` and ``/server_info``.

``internal_states[0].avg_spec_accept_length`` is cumulative since the server
started: tokens generated / verify steps run. A window's own accept length is
therefore derived from two snapshots. Each snapshot gives the tokens generated
so far, ``G`` (``sglang:generation_tokens_total``), and the average ``A``; the
verify steps so far are ``S = G / A``; the window's accept length is
``(G1 - G0) / (S1 - S0)``. Reading ``A`` alone after the window would mix in
everything the server did before it (acceptance probes, earlier windows).
``spec_verify_ct`` would give the same per request, but only on ``/generate``;
the client's tokens per chunk is the streamed equivalent, kept as a cross-check.

Both snapshots are taken while the window's own requests are not running, so
``G`` and ``A`` describe the same instant.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

GENERATION_TOKENS = "sglang:generation_tokens_total"
# Server args that hold credentials; their values never reach a report.
SECRET = re.compile(r"(^|_)(key|secret|password|token)$", re.IGNORECASE)
REDACTED = "(redacted)"


@dataclass(frozen=True)
class ServerSnapshot:
    """One SGLang server at one instant; ``info`` is its ``/server_info``, redacted."""

    url: str
    generation_tokens: float | None = None
    avg_spec_accept_length: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def verify_steps(self) -> float | None:
        """Verify steps since start, ``G / A``; ``None`` without speculative decoding."""
        if self.generation_tokens is None or self.avg_spec_accept_length is None:
            return None
        if not self.avg_spec_accept_length:
            return 0.0
        return self.generation_tokens / self.avg_spec_accept_length


def redact(info: dict[str, Any]) -> dict[str, Any]:
    """``/server_info`` without credentials (``api_key`` and the like)."""
    return {key: REDACTED if SECRET.search(key) and value is not None else value
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


def window_generated(before: list[ServerSnapshot],
                     after: list[ServerSnapshot]) -> float | None:
    """Tokens the servers generated over the window (the client's usage should agree)."""
    if any(snap.generation_tokens is None for snap in (*before, *after)):
        return None
    return sum(last.generation_tokens - first.generation_tokens
               for first, last in zip(before, after, strict=True))
