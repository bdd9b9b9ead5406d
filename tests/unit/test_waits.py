"""How a step waits: asked again soon at first, seldom after minutes, never past its bound."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from operations.plumbing import probes


@pytest.mark.parametrize(("elapsed", "interval"), [
    (0.0, 0.25), (1.0, 0.25), (2.0, 0.25), (4.0, 0.5), (8.0, 1.0), (16.0, 2.0), (900.0, 2.0)])
def test_a_wait_asks_again_after_an_eighth_of_its_time_within_bounds(elapsed, interval) -> None:
    assert probes.poll_interval(elapsed) == interval


class Clock:
    """A virtual clock: ``sleep`` moves it, nothing takes real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(probes, "time", clock)
    monkeypatch.setattr(probes, "host", SimpleNamespace(name="wsa"))
    return clock


@pytest.mark.parametrize(("ready_at", "most_late", "most_asked"), [
    # The lab's waits: a link retrained in a second, replicas in two, a proxy in six.
    (1.0, 0.25, 5), (2.2, 0.3, 10), (6.4, 0.8, 20),
    # The field's: a 27B model loaded and its graphs captured in twelve minutes.
    (720.0, 2.0, 380)])
def test_what_comes_up_is_seen_soon_after_and_asked_seldom(
        clock: Clock, ready_at: float, most_late: float, most_asked: int) -> None:
    asked = []

    def check(seconds_left: float) -> tuple[list[str], bool]:
        asked.append(clock.now)
        return ([] if clock.now >= ready_at else ["not yet"]), True

    outcome: dict = {}
    probes.wait_until("the thing", check, timeout=900.0, outcome=outcome)
    assert outcome["found"] == []
    assert ready_at <= clock.now <= ready_at + most_late
    assert len(asked) <= most_asked


def test_a_wait_ends_at_its_bound_and_says_so(clock: Clock) -> None:
    outcome: dict = {}
    probes.wait_until("the thing", lambda seconds_left: (["not yet"], True), timeout=30.0,
                      outcome=outcome)
    assert outcome["found"] == ["not yet", "(timed out after 30s)"]
    assert 30.0 <= clock.now <= 30.0 + probes.POLL_SECONDS_MAX
