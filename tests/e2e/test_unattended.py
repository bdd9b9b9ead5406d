"""
Unattended: what a person or the hardware does to the hosts while no run watches,
in each kind of state, and the guard that restores stock after a stall.

One chain, so that it shares its converged states: tp2_e2e, its events, the
guard, production, its events.
"""

from __future__ import annotations

import json
import subprocess
import time

from e2e_helpers import PYTHON, REPO, deploy, lab, service_log, ssh, verify

from lab import cable
from lab.topology import host_named
from operations.safety import guard
from operations.safety.guard import EVENTS

WORKSTATIONS = ("wsa", "wsb")
# The lab site's candidate.guard_stall_seconds (the default).
STALL_SECONDS = 30


def status() -> dict:
    result = subprocess.run([str(PYTHON), "experiment.py", "status", "--json"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    return json.loads(result.stdout)


def seen(report: dict, section: str, host: str) -> list[str]:
    return [row["seen"] for row in report["hosts"]
            if row["section"] == section and row["host"] == host]


def tx_e2e(host: str) -> str:
    return ssh(host, "cat /sys/module/thunderbolt_net/parameters/tx_e2e 2>/dev/null "
                     "|| echo absent").strip()


def diagnosis() -> dict[str, dict]:
    """Each rung of ``experiment.py diagnose``, by name; its route rung asks both roles."""
    result = subprocess.run(
        [str(PYTHON), "experiment.py", "diagnose", "--json"], cwd=REPO, capture_output=True,
        text=True, timeout=300)
    return {rung["name"]: rung for rung in json.loads(result.stdout)["rungs"]}


def small_answers() -> dict[str, dict]:
    """The gateway's roles answer real completions, as a user's requests; the ladder."""
    rungs = diagnosis()
    assert rungs["route"]["verdict"] == "pass", rungs["route"]
    return rungs


def applications(host: str) -> int:
    """How many times the guard on ``host`` has applied thunderbolt0's address."""
    return service_log(host, guard.NAME).count(": applied it")


def answers_across_the_link(host: str) -> bool:
    """The peer answers ``host``'s ping across thunderbolt0, as the guard pings it."""
    peer = host_named(next(other for other in WORKSTATIONS if other != host)).link_address
    return ssh(host, f"ping -q -c 1 -W 1 -I thunderbolt0 {peer} >/dev/null && echo answered"
               ).strip() == "answered"


def back_at_full_rate() -> None:
    """The cable in at 20 Gb/s, whatever a step did."""
    if cable.read("a").plugged and cable.read("a").rate_gbps != cable.LINK_SPEED_GBPS:
        lab("unplug", "wsa")
    if not cable.read("a").plugged:
        lab("plug", "wsa")


def test_unplug_suspend_and_a_stall_after_resume_in_tp2_e2e_then_in_production() -> None:
    try:
        tp_state_events()
        production_events()
    finally:
        lab("fault", "tx_credit_stall", "off")
        back_at_full_rate()


def replugged_with_no_network_manager() -> None:
    """
    The site default: nothing but twinbolt applies thunderbolt0's address. A
    cable pulled and put back makes a thunderbolt0 with none on each side: no
    stall, the guard applies the address and watches on; the next run converges.
    """
    lab("fault", "no_network_manager", "on")
    try:
        records = len((cable.STATE / "ledger.jsonl").read_text().splitlines())
        applied = {host: applications(host) for host in WORKSTATIONS}
        lab("unplug", "wsb")
        time.sleep(2)
        lab("plug", "wsb")
        # Each guard applies its side's address, and then each side's peer answers
        # its ping: a silence ends with the first answer, and a stall needs
        # STALL_SECONDS of one; so no stall can follow from this replug.
        started = time.monotonic()
        while not (all(applications(host) > applied[host] for host in WORKSTATIONS)
                   and all(answers_across_the_link(host) for host in WORKSTATIONS)):
            assert time.monotonic() - started < STALL_SECONDS, "the guards never re-applied"
            time.sleep(0.5)
        report = status()
        assert all(seen(report, "guard", host) == ["armed"] for host in WORKSTATIONS), [
            row for row in report["hosts"] if row["section"] == "guard"]
        assert all(tx_e2e(host) == "Y" for host in WORKSTATIONS)
        # Nothing else applies it under this fault: the guard did.
        for host in WORKSTATIONS:
            address = host_named(host).link_address
            assert f" {address}/" in ssh(host, "ip -o -4 addr show dev thunderbolt0"), host
        run = deploy("tp2_e2e")
        assert run.returncode == 0, run.output[-3000:]
        added = [json.loads(line) for line in (cable.STATE / "ledger.jsonl").read_text()
                 .splitlines()[records:]]
        assert not any(record["stall"] for record in added), added
    finally:
        lab("fault", "no_network_manager", "off")
    print(f"tp2_e2e, no network manager, the cable out and back: each guard re-applied its "
          f"address and the peers answered in {time.monotonic() - started:.1f} s; no stall, "
          "and the next tp2_e2e run converged")


def tp_state_events() -> None:
    run = deploy("tp2_e2e")
    assert run.returncode == 0, run.output[-3000:]
    assert all(seen(status(), "guard", host) == ["armed"] for host in WORKSTATIONS)

    # The cable out for 5 s, then a workstation asleep for 5 s: the ranks lose each
    # other and find each other again; the guard does not fire, the state still verifies.
    started = time.monotonic()
    lab("unplug", "wsb")
    time.sleep(5)
    lab("plug", "wsb")
    print(f"unplug 5 s in tp2_e2e: the link back {time.monotonic() - started - 5:.1f} s "
          "after the plug")
    checks = verify("tp2_e2e")
    assert checks.returncode == 0, checks.stdout[-3000:]
    started = time.monotonic()
    lab("suspend", "wsb", "--seconds", "5")
    print(f"suspend 5 s in tp2_e2e: woke, the link back in {time.monotonic() - started - 5:.1f} s")
    checks = verify("tp2_e2e")
    assert checks.returncode == 0, checks.stdout[-3000:]
    assert all(tx_e2e(host) == "Y" for host in WORKSTATIONS)
    replugged_with_no_network_manager()

    # The cable back at 10 Gb/s (a dock at connect time) under the running TP group:
    # refusing would keep the group on it, so the next TP run fails before it moves
    # anything and ends in a verified production, saying why; the link only warns there.
    lab("unplug", "wsa")
    lab("plug", "wsa", "--rate", "10")
    started = time.monotonic()
    ended = deploy("tp2_e2e")
    assert ended.returncode != 0
    assert ("trained at 10 Gb/s over 1 lane(s), expected 20 Gb/s over 1 (check the cable "
            "and the ports); no replica of production serves here for a refusal to keep"
            ) in ended.output
    assert "production was restored and verified" in ended.output, ended.output[-3000:]
    # The ledger: rolled back at the link layer, which is no stall of the candidate.
    record = json.loads((cable.STATE / "ledger.jsonl").read_text().splitlines()[-1])
    assert (record["state"], record["outcome"], record["layer"], record["stall"]) == (
        "tp2_e2e", "rolled_back", "link", False), record
    print(f"TP group re-plugged at 10 Gb/s: the next tp2_e2e run ended in a verified production "
          f"in {time.monotonic() - started:.1f} s")
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]
    assert all(tx_e2e(host) == "absent" for host in WORKSTATIONS)
    assert small_answers()["xdomain"]["verdict"] == "warn"
    # Re-seated at 20 Gb/s, the TP state converges again at the expected rate.
    back_at_full_rate()
    run = deploy("tp2_e2e")
    assert run.returncode == 0, run.output[-3000:]

    # A sleep, then controllers that never return TX credits after resume, with no
    # run watching: the guard on each workstation restores the stock driver.
    lab("suspend", "wsb", "--seconds", "3")
    started = time.monotonic()
    lab("fault", "tx_credit_stall", "on")
    while any(tx_e2e(host) != "absent" for host in WORKSTATIONS):
        assert time.monotonic() - started < 90, "the guard did not restore stock in 90 s"
        time.sleep(1)
    reaction = time.monotonic() - started
    print(f"tx_credit_stall in tp2_e2e, no run: the stock driver on both workstations in "
          f"{reaction:.1f} s")
    assert reaction < STALL_SECONDS + 10, f"the guard took {reaction:.1f} s"
    report = status()
    for host in WORKSTATIONS:
        rows = seen(report, "guard", host)
        assert rows[0] == "not armed" and rows[1].startswith("restored stock: "), rows
        assert "with tx_e2e=Y" in rows[1] and "TP rank stopped, the stock driver loaded" in rows[1]
    # Only the workstations' own TP ranks stopped; the gateway's fallback keeps small answering.
    assert report["layers"]["driver"] == "stock"
    assert report["layers"]["gateway_fallback"] is True
    assert "the guard restored stock" in " ".join(small_answers()["driver"]["evidence"])

    # The next run names the events, the ledger records a stall for the firmware
    # that ran, and it ends in a verified production.
    run = deploy("production")
    assert run.returncode == 0, run.output[-3000:]
    for host in WORKSTATIONS:
        assert f"[{host}] the guard restored stock: " in run.output
        assert not ssh(host, f"cat {EVENTS} 2>/dev/null").strip()
    records = [json.loads(line) for line in (cable.STATE / "ledger.jsonl").read_text()
               .splitlines()[-3:]]
    guarded = [record for record in records if record["outcome"] == "guarded"]
    assert len(guarded) == 2 and all(record["stall"] for record in guarded), records
    refused = deploy("tp2_e2e")
    assert refused.returncode != 0
    assert "the candidate's TX E2E has stalled on the controller pairing" in refused.output
    lab("fault", "tx_credit_stall", "off")


def production_events() -> None:
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]
    # The replicas do not use the link: nothing is lost, the link's rung warns.
    lab("unplug", "wsa")
    assert small_answers()["xdomain"]["verdict"] == "warn"
    report = status()
    assert report["match"] == "production", report["verdict"]
    assert all(seen(report, "link", host)[0].startswith("no XDomain peer")
               for host in WORKSTATIONS)
    lab("plug", "wsa")
    lab("suspend", "wsb", "--seconds", "3")
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]
