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
from lab.topology import WORKSTATIONS

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
    monkeypatch.setattr(cable, "CABLE_FILE", tmp_path / "cable")
    monkeypatch.setattr(cable, "SUSPENDED_DIR", tmp_path / "suspended")


def test_a_wake_time_is_never_read_half_written() -> None:
    host = WORKSTATIONS[1]
    cable.mark_resumed(host)
    assert polled_while_rewritten(lambda: cable.resumed_at(host),
                                  lambda: cable.mark_resumed(host)) == []
    assert cable.resumed_at(host) > 0


def test_the_cable_is_never_read_half_written() -> None:
    host = WORKSTATIONS[0]
    assert polled_while_rewritten(cable.read, lambda: cable.plug(host, 10.0)) == []
    assert (cable.read().plugged, cable.read().rate_gbps) == (True, 10.0)
