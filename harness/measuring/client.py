"""
The measurement client: streamed requests, timed on the client.

Throughput has exactly one definition in twinbolt (:data:`THROUGHPUT`), so no
figure in a report or a comparison mixes two. Tokens are the completion tokens
the server reports for the finished request, never counted chunks: with
speculative decoding one chunk carries every token a verify step accepted, so
chunks per second would measure steps, not tokens. A stream that never reports
them is a failed sample, not a guess.

The windows stream SGLang's native ``/generate`` (:func:`stream_generate`):
its last event's ``meta_info`` carries the request's own ``spec_verify_ct``,
so a window's accept length is its requests' completion tokens over their
verify steps, which ``/v1/chat/completions`` does not report (SGLang 0.5.9's
OpenAI-compatible usage has token counts only). :func:`stream_chat` is the
OpenAI-compatible stream, as a user's client sends it. Chunks are still
counted: tokens per chunk is a cross-check of the accept length (an upper
bound: a slow reader may receive two steps in one chunk).

The client must not be the bottleneck: one ``httpx.AsyncClient`` per window,
lines parsed as they arrive, one ``json.loads`` per event (``bench/`` measures
what that costs per streamed token).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

THROUGHPUT = (
    "output tok/s = completion tokens the server reports for the finished request / seconds from "
    "sending the request to receiving its last token; a window's aggregate tok/s = its "
    "requests' completion tokens / seconds from the first request sent to the last token "
    "received"
)
CONNECT_TIMEOUT_SECONDS = 10.0


@dataclass
class Sample:
    """
    One streamed request. It is filled in while it streams (the progress printer
    reads it live); times are ``time.perf_counter()`` values.
    """

    label: str
    max_tokens: int
    sent_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    # Events that carried generated text: one per decode (verify) step.
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # The request's verify steps (``meta_info.spec_verify_ct``); None where not reported.
    verify_steps: int | None = None
    error: str | None = None
    # Tokens seen so far in a /generate stream's meta_info (new tokens make a chunk).
    _streamed_tokens: int = field(default=0, init=False, repr=False)

    @property
    def ttft(self) -> float | None:
        """Seconds from sending the request to the first generated text."""
        if self.sent_at is None or self.first_token_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def seconds(self) -> float | None:
        """Seconds from sending the request to its last token."""
        if self.sent_at is None or self.last_token_at is None:
            return None
        return self.last_token_at - self.sent_at

    @property
    def output_rate(self) -> float | None:
        """Output tok/s, as :data:`THROUGHPUT` defines it."""
        return rate(self.completion_tokens, self.seconds)

    @property
    def tokens_per_chunk(self) -> float | None:
        if not self.completion_tokens or not self.chunks:
            return None
        return self.completion_tokens / self.chunks

    def to_json(self, origin: float) -> dict[str, Any]:
        """The raw sample for a report; ``origin`` is the window's start."""
        return {
            "label": self.label,
            "max_tokens": self.max_tokens,
            "sent_at": None if self.sent_at is None else self.sent_at - origin,
            "ttft_seconds": self.ttft,
            "seconds": self.seconds,
            "chunks": self.chunks,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "verify_steps": self.verify_steps,
            "output_tok_s": self.output_rate,
            "tokens_per_chunk": self.tokens_per_chunk,
            "error": self.error,
        }


def rate(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens per second, or ``None`` when either is unknown."""
    if tokens is None or not seconds:
        return None
    return tokens / seconds


def span(samples: list[Sample]) -> float | None:
    """Seconds from the first request sent to the last token received; None of no samples."""
    if not samples:
        return None
    return max(s.last_token_at for s in samples) - min(s.sent_at for s in samples)


def time_per_output_token(seconds: float | None, ttft: float | None,
                          tokens: int | None) -> float | None:
    """
    Seconds per output token after the first: (latency - TTFT) / (output tokens
    - 1), as SGLang's ``bench_serving`` has it; None for a request of one token.
    """
    if seconds is None or ttft is None or (tokens or 0) < 2:
        return None
    return (seconds - ttft) / (tokens - 1)


def session(concurrency: int, timeout: float,
            headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """
    An HTTP client for one window: a connection per concurrent request, and a
    read bound of ``timeout`` seconds, the longest a cold prefill may take
    before its first byte; ``headers`` (the servers' key) on every request.
    """
    return httpx.AsyncClient(
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_SECONDS),
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )


async def stream_chat(client: httpx.AsyncClient, url: str, model: str, prompt: str,
                      sample: Sample) -> Sample:
    """
    Stream one chat completion of exactly ``sample.max_tokens`` tokens into ``sample``.

    ``ignore_eos`` keeps the server from stopping early, so every request of a
    window generates what it asked for; ``include_usage`` asks for the token
    counts (and, with ``--enable-cache-report``, the cached prompt tokens).
    """
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": sample.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return await _stream(client, f"{url}/v1/chat/completions", body, sample, _chat_event,
                         "the stream carried no usage (is stream_options.include_usage "
                         "honoured?)")


async def stream_generate(client: httpx.AsyncClient, url: str, prompt: str,
                          sample: Sample) -> Sample:
    """
    Stream one ``/generate`` of exactly ``sample.max_tokens`` tokens into ``sample``.

    The same request as :func:`stream_chat`'s, in SGLang's native form: every
    event carries the ``meta_info`` so far, the last one the finished request's
    (its token counts and, with speculation, ``spec_verify_ct``).
    """
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": sample.max_tokens, "temperature": 0,
                            "ignore_eos": True},
        "stream": True,
    }
    return await _stream(client, f"{url}/generate", body, sample, _generate_event,
                         "the stream never reported the finished request's meta_info")


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], sample: Sample,
                  event: Callable[[Sample, dict[str, Any]], None], unfinished: str) -> Sample:
    """POST ``body`` and feed each server-sent event to ``event`` until ``[DONE]``."""
    sample.sent_at = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                sample.error = f"HTTP {response.status_code}: {text[:300]}"
                return sample
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line[6:] == "[DONE]":
                    break
                data = json.loads(line[6:])
                if "error" in data:
                    sample.error = f"error in the stream: {json.dumps(data['error'])[:300]}"
                    break
                event(sample, data)
    except httpx.HTTPError as error:
        sample.error = f"{type(error).__name__}: {error or 'no detail'}"
        return sample
    if sample.error is None and sample.completion_tokens is None:
        sample.error = unfinished
    return sample


def _generated(sample: Sample) -> None:
    """An event carried generated tokens: one more chunk, and the token times."""
    now = time.perf_counter()
    if sample.first_token_at is None:
        sample.first_token_at = now
    sample.last_token_at = now
    sample.chunks += 1


def _chat_event(sample: Sample, event: dict[str, Any]) -> None:
    for choice in event.get("choices") or ():
        if (choice.get("delta") or {}).get("content"):
            _generated(sample)
    usage = event.get("usage")
    if usage:
        sample.prompt_tokens = usage.get("prompt_tokens")
        sample.completion_tokens = usage.get("completion_tokens")
        # SGLang leaves the details out when nothing was cached.
        sample.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def _generate_event(sample: Sample, event: dict[str, Any]) -> None:
    """
    New tokens are told by ``completion_tokens`` growing, which holds whether
    ``text`` is the whole text so far (SGLang's default) or only the new piece
    (``--stream-output``).
    """
    meta = event.get("meta_info") or {}
    if (meta.get("completion_tokens") or 0) > sample._streamed_tokens:
        sample._streamed_tokens = meta["completion_tokens"]
        _generated(sample)
    if meta.get("finish_reason") is not None:
        sample.prompt_tokens = meta.get("prompt_tokens")
        sample.completion_tokens = meta.get("completion_tokens")
        sample.cached_tokens = meta.get("cached_tokens", 0)
        sample.verify_steps = meta.get("spec_verify_ct")
