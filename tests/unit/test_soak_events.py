"""A soak's events: their schedule, how each is measured, and when one stops the soak."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from harness.hosts import counters
from harness.hosts.counters import LinkSnapshot
from harness.runs import events, soak
from harness.runs.events import Event, EventFailed
from operations.site.hosts import InventoryEntry
from operations.states import STATES


def test_events_are_parsed_in_time_order_with_the_cable_in_between_and_at_the_end() -> None:
    assert events.parse("suspend@10,unplug@5,plug@6.5", 12) == [
        Event("unplug", 5), Event("plug", 6.5), Event("suspend", 10)]
    for text, why in (("unplug@5", "the cable is left out at the end: add a plug after "
                                   "unplug@5"),
                      ("plug@2", "plug@2 has no unplug before it"),
                      ("unplug@1,suspend@2,plug@3", "suspend@2 while the cable is out"),
                      ("unplug@1,unplug@2,plug@3", "unplug@2 while the cable is out"),
                      ("reboot@1", "'reboot@1' is not KIND@MINUTE"),
                      ("unplug@5,plug@", "'plug@' is not KIND@MINUTE"),
                      ("unplug@1,plug@12", "plug@12 is not inside the soak's 12 minute(s)")):
        with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
            events.parse(text, 12)


@dataclass
class Cable:
    """The link as two snapshots show it, moved by :class:`FakeHands`."""

    plugged: bool = True
    rate: float = 20.0
    tx_e2e: str = "Y"
    errors: int = 0

    def snapshot(self) -> dict[str, LinkSnapshot]:
        return {name: LinkSnapshot(
            name, time.monotonic(),
            counters={"rx_errors": self.errors, "retrans_segs": 100} if self.plugged else {},
            rx_rate_gbps=self.rate if self.plugged else None,
            driver_parameters={"e2e": "Y", "tx_e2e": self.tx_e2e}) for name in ("wsa", "wsb")}


@dataclass
class FakeHands:
    cable: Cable
    bound: float = 2.0
    plug_rate: float = 20.0
    plug_works: bool = True

    async def unplug(self, host: str) -> None:
        self.cable.plugged = False

    async def plug(self, host: str) -> None:
        # A new thunderbolt0: its counters start again.
        self.cable.plugged, self.cable.rate = self.plug_works, self.plug_rate
        self.cable.errors = 0

    async def suspend(self, host: str, seconds: int) -> None:
        self.cable.plugged = False
        await asyncio.sleep(seconds)
        self.cable.plugged = True


@pytest.fixture
def cable(monkeypatch) -> Cable:
    link = Cable(errors=3)

    async def snapshot(topology: object) -> dict[str, LinkSnapshot]:
        return link.snapshot()

    monkeypatch.setattr(counters, "snapshot", snapshot)
    monkeypatch.setattr(events, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(events, "RECOVERY_SECONDS", 1.0)
    return link


async def serving_while_linked(link: Cable, served: events.Recovery) -> None:
    """The soak's traffic: a request completes now and then while the link is there."""
    while True:
        if link.plugged:
            served.last_served = time.monotonic()
        await asyncio.sleep(0.05)


def played(link: Cable, hands: FakeHands, *kinds: str) -> list[dict]:
    async def play_all() -> list[dict]:
        served = events.Recovery()
        traffic = asyncio.create_task(serving_while_linked(link, served))
        outcomes = []
        for kind in kinds:
            if kind != "plug":
                before = link.snapshot()
            outcomes.append(await events.play(Event(kind, 1), "wsb", hands, None, served,
                                              time.monotonic(), 1, before))
        traffic.cancel()
        return outcomes
    return asyncio.run(play_all())


def test_an_unplug_and_a_plug_are_measured_as_the_link_and_the_traffic_show_them(cable) -> None:
    unplug, plug = played(cable, FakeHands(cable, plug_rate=10.0), "unplug", "plug")
    assert unplug["link"] == "gone" and unplug["link_seconds"] < 1
    assert events.problem(unplug) is None
    assert plug["link"] == "back" and plug["rate_gbps"] == 10.0
    assert plug["tx_e2e"] == {"wsa": "Y", "wsb": "Y"} and plug["tx_e2e_kept"]
    # Judged against the link before the unplug: a new thunderbolt0 counts from zero.
    assert plug["receiver_errors"] == [6, 0] and plug["retransmissions"] == 0
    assert plug["recovered_seconds"] is not None and events.problem(plug) is None
    assert events.describe(plug).startswith("plug wsb: the link back at 10.0 Gb/s in ")


def test_a_suspend_is_measured_from_the_sleep_to_the_traffic_served_again(cable) -> None:
    [outcome] = played(cable, FakeHands(cable), "suspend")
    assert outcome["link"] == "back" and outcome["rate_gbps"] == 20.0
    assert outcome["receiver_errors"] == [6, 6] and outcome["retransmissions"] == 0
    assert outcome["recovered_seconds"] >= 1


def test_a_link_that_does_not_come_back_stops_the_soak_naming_the_event(cable) -> None:
    unplug, plug = played(cable, FakeHands(cable, bound=0.3, plug_works=False),
                          "unplug", "plug")
    assert plug["link"] == "not back" and plug["recovered_seconds"] is None
    assert events.problem(plug) == "the link was not back after the plug"


def test_an_event_that_cannot_be_done_is_recorded_as_not_done(cable) -> None:
    hands = events.SiteHands(None, allow_suspend=False)
    [outcome] = played(cable, hands, "suspend")
    assert outcome["done"] is False
    assert events.problem(outcome) == ("suspend could not be done: a suspend needs "
                                       "--allow-suspend: it sleeps the workstation")
    with pytest.raises(EventFailed):
        asyncio.run(hands.suspend("wsb", 1))
    # The ledger records, and the soak counts, only the events that were done.
    assert soak.recorded([outcome]) == []


def test_the_ledger_records_each_plug_and_suspend_done_not_the_unplugs(cable) -> None:
    outcomes = played(cable, FakeHands(cable), "unplug", "plug", "suspend")
    assert [outcome["event"] for outcome in soak.recorded(outcomes)] == ["plug", "suspend"]


def test_the_lab_does_its_events_with_its_own_commands_and_a_site_with_a_person() -> None:
    def topology(groups: tuple[str, ...]):
        entries = tuple(InventoryEntry(name, groups, {}) for name in ("wsa", "wsb"))
        return soak.Topology(entries, None, None)

    assert isinstance(events.hands_for(topology(("workstations", "lab")), False),
                      events.LabHands)
    site = events.hands_for(topology(("workstations",)), True)
    assert isinstance(site, events.SiteHands) and site.bound == events.PERSON_SECONDS


def test_while_an_event_has_the_cable_out_an_empty_interval_is_no_stall() -> None:
    candidate = STATES["tp2_e2e"]
    empty = soak.interval_sample(12.0, 5.0, 0, [], {"wsa": {"counters": {"rx_errors": 0}},
                                                    "wsb": {"counters": {"rx_errors": 0}}})
    assert soak.alarm(candidate, empty).startswith("a stall")
    assert soak.alarm(candidate, empty, disrupted=True) is None
    erring = {**empty, "receiver_errors": 2}
    assert soak.alarm(candidate, erring, disrupted=True).startswith("2 receiver error(s)")


def test_a_site_suspend_sets_the_wake_alarm_then_sleeps_detached_under_sudo(monkeypatch) -> None:
    import subprocess

    from harness.hosts import remote

    sent: list[str] = []

    async def run(host: str, command: str, ssh_config: object) -> remote.Ran:
        sent.append(command)
        return remote.Ran(host, 0, "", "", 0.0)

    monkeypatch.setattr(remote, "run", run)
    entry = InventoryEntry("wsb", ("workstations",), {"_sudo": True})
    hands = events.SiteHands(soak.Topology((entry,), None, None), allow_suspend=True)
    asyncio.run(hands.suspend("wsb", 0))
    [command] = sent
    assert command.startswith("sudo -H -n sh -c ") == entry.sudo
    inner = command.removeprefix("sudo -H -n sh -c ") if entry.sudo else command
    assert "rtcwake -m no -s 0" in inner and "systemctl suspend" in inner
    assert subprocess.run(["sh", "-n", "-c", command]).returncode == 0
