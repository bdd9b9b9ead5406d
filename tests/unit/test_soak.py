"""The soak's intervals, its alarm under the candidate, its chart, and its traffic."""

from __future__ import annotations

import asyncio
from pathlib import Path

from simulator import simulator

from harness.hosts.topology import Endpoint
from harness.runs import soak
from operations.states import STATES

LINK = {"seconds": 5.0, "counters": {"rx_errors": 0, "retrans_segs": 3, "tx_bytes": 10},
        "sockets": {"count": 1, "retrans": 2, "max_retrans": 2, "bytes_retrans": 9,
                    "closed": []}}


def sample(tokens: int, rx_errors: int = 0) -> dict:
    erring = {**LINK, "counters": {**LINK["counters"], "rx_errors": rx_errors}}
    return soak.interval_sample(12.0, 5.0, tokens, [], {"wsa": LINK, "wsb": erring})


def test_an_interval_sums_both_workstations() -> None:
    found = sample(64, rx_errors=3)
    assert (found["tok_s"], found["receiver_errors"], found["socket_retransmissions"],
            found["retransmissions"]) == (12.8, 3, 4, 6)


def test_under_the_candidate_a_receiver_error_or_a_stall_stops_the_soak() -> None:
    candidate, stock = STATES["tp2_e2e"], STATES["tp2_stock"]
    assert soak.alarm(candidate, sample(64)) is None
    assert soak.alarm(candidate, sample(64, rx_errors=1)) == (
        "1 receiver error(s) on thunderbolt0 under the candidate, 12s into the soak")
    assert soak.alarm(candidate, sample(0)).startswith("a stall: no request completed in 5s")
    # The stock driver's receiver errors are what it is known for: recorded, not acted on.
    assert soak.alarm(stock, sample(0, rx_errors=9)) is None


def test_the_chart_is_written(tmp_path: Path) -> None:
    path = soak.chart([sample(64), sample(0)], "tp2_e2e", "a stall", tmp_path / "soak.png",
                      ({"event": "unplug", "host": "wsb", "at_seconds": 6.0},))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_traffic_counts_the_tokens_a_real_server_completes(tmp_path: Path) -> None:
    with simulator(tmp_path) as url:
        traffic = soak.Traffic(Endpoint(url, "qwen", (url,), "the simulator"), timeout=10)

        async def run_briefly() -> None:
            stop = asyncio.Event()
            runner = asyncio.create_task(traffic.run(stop))
            await asyncio.sleep(1.0)
            stop.set()
            await runner

        asyncio.run(run_briefly())
    tokens, failures = traffic.take()
    assert failures == [] and tokens >= soak.REQUEST_TOKENS and tokens % soak.REQUEST_TOKENS == 0
    assert traffic.take() == (0, [])
