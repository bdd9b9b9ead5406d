"""
Is the measurement client ever the bottleneck? Its cost per streamed token, and
the highest rate it can read on one core.

    python bench/client_bench.py [--tokens 200000] [--streams 6] [--repeat 3]

A local server in its own process (on another core when there is one) answers
``/v1/chat/completions`` with SGLang-shaped server-sent events, pre-built and
written as fast as the socket takes them, so the client's reading is all that
limits the rate. The client is the harness's own :func:`stream_chat`, pinned to
one core. For each case the benchmark prints the rate read and the client's CPU
time per streamed token; a baseline that reads the same bytes with httpx but
parses nothing shows what the parsing itself costs.

It prints figures; it asserts nothing (timing belongs here, not in tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.measuring.client import Sample, session, stream_chat  # noqa: E402

# SGLang's chunk, as the simulator streams it (~190 bytes on the wire).
CHUNK = {"id": "chatcmpl-0123456789abcdef0123456789abcdef", "object": "chat.completion.chunk",
         "created": 1700000000, "model": "qwen",
         "choices": [{"index": 0, "delta": {"content": ""}, "logprobs": None,
                      "finish_reason": None}]}
EVENTS_PER_WRITE = 256


def http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def sse(event: object) -> bytes:
    return http_chunk(b"data: " + json.dumps(event).encode() + b"\n\n")


def response_body(tokens: int, per_chunk: int) -> list[bytes]:
    """The whole answer, pre-encoded: the server then spends nothing per event."""
    piece = {**CHUNK, "choices": [{**CHUNK["choices"][0],
                                   "delta": {"content": " tok" * per_chunk}}]}
    events = tokens // per_chunk
    one = sse(piece)
    writes = [one * EVENTS_PER_WRITE] * (events // EVENTS_PER_WRITE)
    writes.append(one * (events % EVENTS_PER_WRITE))
    usage = {"prompt_tokens": 5, "completion_tokens": events * per_chunk,
             "total_tokens": 5 + events * per_chunk, "prompt_tokens_details": None}
    writes.append(sse({**CHUNK, "choices": [], "usage": usage})
                  + http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return writes


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 per_chunk: int) -> None:
    try:
        await answer(reader, writer, per_chunk)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client closed its connection: the keep-alive loop ends here


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 per_chunk: int) -> None:
    """Every request on one connection, until the client closes it."""
    while head := await reader.readuntil(b"\r\n\r\n"):
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        tokens = json.loads(await reader.readexactly(length))["max_tokens"]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for data in response_body(tokens, per_chunk):
            writer.write(data)
            await writer.drain()


def serve(port_pipe: Connection, cpu: int | None,
          per_chunk: int) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: handle(r, w, per_chunk), "127.0.0.1", 0)
        port_pipe.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


async def read_streams(url: str, streams: int, tokens: int) -> tuple[float, float, int]:
    """Wall seconds, client CPU seconds and tokens read for ``streams`` concurrent requests."""
    async with session(streams, 60.0) as client:
        samples = [Sample(f"bench-{index}", tokens) for index in range(streams)]
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(stream_chat(client, url, "qwen", "bench", sample)
                               for sample in samples))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    failed = [sample.error for sample in samples if sample.error]
    if failed:
        raise SystemExit(f"the client failed: {failed[0]}")
    return wall, cpu, sum(sample.completion_tokens for sample in samples)


async def read_raw(url: str, tokens: int) -> tuple[float, float, int]:
    """The same bytes through httpx, nothing parsed: the floor under the client's cost."""
    async with httpx.AsyncClient(timeout=60.0) as client:
        wall, cpu = time.perf_counter(), time.process_time()
        async with client.stream("POST", f"{url}/v1/chat/completions",
                                 json={"max_tokens": tokens}) as response:
            async for _ in response.aiter_raw():
                pass
        return time.perf_counter() - wall, time.process_time() - cpu, tokens


def measure(label: str, per_chunk: int, repeat: int,
            run: Callable[[str], Awaitable[tuple[float, float, int]]]) -> None:
    """Start a server streaming ``per_chunk`` tokens per event; run ``run(url)`` on it."""
    cpus = sorted(os.sched_getaffinity(0))
    receiver, sender = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(
        target=serve, args=(sender, cpus[1] if len(cpus) > 1 else None, per_chunk), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{receiver.recv()}"
        results = [asyncio.run(run(url)) for _ in range(repeat)]
    finally:
        server.terminate()
        server.join(5)
    walls, cpus_used, tokens = zip(*results, strict=True)
    wall, cpu = statistics.median(walls), statistics.median(cpus_used)
    print(f"{label:<44} {tokens[0] / wall:>12,.0f} tok/s   {tokens[0] / per_chunk / wall:>10,.0f} "
          f"events/s   {cpu / tokens[0] * 1e6:6.2f} µs CPU/token   "
          f"{cpu / (tokens[0] / per_chunk) * 1e6:6.2f} µs CPU/event", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--tokens", type=int, default=200_000, help="tokens per case")
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    print(f"client on cpu {cpus[0]}, server on cpu {cpus[1] if len(cpus) > 1 else cpus[0]}; "
          f"{args.tokens:,} tokens per case, median of {args.repeat}", flush=True)
    tokens = args.tokens
    per_stream = tokens // args.streams
    measure("baseline: httpx raw bytes, no parsing", 1, args.repeat,
            lambda url: read_raw(url, tokens))
    measure("client, 1 stream, 1 token per event", 1, args.repeat,
            lambda url: read_streams(url, 1, tokens))
    measure(f"client, {args.streams} streams, 1 token per event", 1, args.repeat,
            lambda url: read_streams(url, args.streams, per_stream))
    measure("client, 1 stream, 4 tokens per event (NEXTN)", 4, args.repeat,
            lambda url: read_streams(url, 1, tokens))


if __name__ == "__main__":
    main()
