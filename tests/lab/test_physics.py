"""The stock driver really loses frames; the candidate with tx_e2e=1 loses none."""

from __future__ import annotations

import pytest
from lab_helpers import carrier, counters, load, transfer, wait_until

pytestmark = pytest.mark.usefixtures("restore_stock")
GIB = 1 << 30


def transfer_deltas() -> tuple[int, dict[str, dict[str, int]]]:
    before = {host: counters(host) for host in ("wsa", "wsb")}
    received = transfer(GIB)
    # The statistics files follow the real counters within a lab kernel tick.
    wait_until(lambda: counters("wsb")["rx_bytes"] - before["wsb"]["rx_bytes"] >= received)
    after = {host: counters(host) for host in ("wsa", "wsb")}
    deltas = {host: {k: after[host][k] - before[host][k] for k in after[host]}
              for host in after}
    print(f"1 GiB wsa->wsb: {deltas}")
    return received, deltas


def test_stock_driver_drops_frames_so_tcp_retransmits_and_errors_rise() -> None:
    received, deltas = transfer_deltas()
    assert received == GIB
    assert deltas["wsb"]["rx_errors"] > 0
    assert deltas["wsa"]["retrans"] > 0


def test_candidate_with_tx_e2e_drops_nothing() -> None:
    for host in ("wsa", "wsb"):
        load(host, "candidate", "tx_e2e=1")
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: carrier(host))
    received, deltas = transfer_deltas()
    assert received == GIB
    assert deltas["wsa"]["rx_errors"] == 0 and deltas["wsb"]["rx_errors"] == 0
