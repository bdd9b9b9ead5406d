"""
The cable's and the sleep's state files, which the lab kernel polls every tick
while ``lab plug`` and ``lab suspend`` rewrite them: a poll must read the old
value or the new one, never a file caught between its truncation and its write.
A kernel that read ``""`` as a wake time died, and the lab with it, mid-suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from lab import cable
from lab.topology import PAIRS

REWRITES = 3000


def polled_while_rewritten(read: Callable[[], object], rewrite: Callable[[], object]) -> list[str]:
    """Every error a reader polling as the kernel does met while the file was rewritten."""
    errors: list[str] = []
    finished = threading.Event()

    def poll() -> None:
        while not finished.is_set():
            try:
                read()
            except Exception as error:  # what would have ended the kernel's loop
                errors.append(repr(error))

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(REWRITES):
            rewrite()
    finally:
        finished.set()
        reader.join()
    return errors


@pytest.fixture(autouse=True)
def own_state(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cable, "CABLES_DIR", tmp_path / "cables")
    monkeypatch.setattr(cable, "SUSPENDED_DIR", tmp_path / "suspended")


def test_a_wake_time_is_never_read_half_written() -> None:
    host = PAIRS[0].workstations[1]
    cable.mark_resumed(host)
    assert polled_while_rewritten(lambda: cable.resumed_at(host),
                                  lambda: cable.mark_resumed(host)) == []
    assert cable.resumed_at(host) > 0


def test_the_cable_is_never_read_half_written() -> None:
    host = PAIRS[0].workstations[0]
    assert polled_while_rewritten(lambda: cable.read("a"), lambda: cable.plug(host, 10.0)) == []
    assert (cable.read("a").plugged, cable.read("a").rate_gbps) == (True, 10.0)


def test_each_pair_has_a_cable_of_its_own() -> None:
    """Pulled out of wsc, pair b's cable is out; pair a's stays in at its rate."""
    wsa, wsc = PAIRS[0].workstations[0], PAIRS[1].workstations[0]
    cable.plug(wsa, 10.0)
    cable.unplug(wsc)
    assert (cable.read("a").plugged, cable.read("a").rate_gbps) == (True, 10.0)
    assert (cable.read("b").plugged, cable.read("b").unplugged_from) == (False, "wsc")
    cable.forget()
    assert cable.read("a") == cable.read("b") == cable.Cable()
