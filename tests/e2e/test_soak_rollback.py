"""
``experiment.py soak`` on the lab: steady traffic in tp2_e2e, sampled, charted;
and a stall under the candidate ends in a verified production.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from e2e_helpers import PYTHON, REPO, deploy, fault, verify

SOAK = [str(PYTHON), "experiment.py", "soak", "--interval", "3"]


def report_of(output: str) -> dict:
    directory = Path(re.search(r"files in (\S+)", output).group(1))
    assert (directory / "soak.png").read_bytes()[:4] == b"\x89PNG"
    return json.loads((directory / "soak.json").read_text())


def test_a_soak_samples_the_candidate_and_a_stall_restores_production(tmp_path) -> None:
    run = deploy("tp2_e2e")
    assert run.returncode == 0, run.output[-3000:]
    # The candidate sampled for 1.2 min while the cable is pulled and put back, then
    # rank 1 sleeps: each event measured, each recovered, each plug and suspend a
    # ledger record the matrix shows; healthy, the guard stayed armed and never fired.
    evented = subprocess.run([*SOAK, "--minutes", "1.2", "--out", str(tmp_path), "--events",
                              "unplug@0.2,plug@0.3,suspend@0.5", "--suspend-seconds", "5"],
                             cwd=REPO, capture_output=True, text=True, timeout=400)
    print(evented.stdout[-2000:])
    assert evented.returncode == 0, evented.stdout[-3000:] + evented.stderr[-3000:]
    report = report_of(evented.stdout)
    assert report["state"] == "tp2_e2e" and report["stopped"] is None
    assert report["guard"] == "armed, quiet", report["guard"]
    samples = report["samples"]
    # No receiver error wherever one was counted (not across a device made anew).
    counted = [sample["receiver_errors"] for sample in samples
               if sample["receiver_errors"] is not None]
    assert len(counted) >= 10 and set(counted) == {0}, samples
    # Served in most intervals: all but those around the cable out and the rank asleep.
    assert sum(sample["tok_s"] > 0 for sample in samples) >= len(samples) / 2 >= 10, samples
    unplug, plug, suspend = report["events"]
    assert (unplug["event"], unplug["host"], unplug["link"]) == ("unplug", "wsb", "gone")
    for outcome in (plug, suspend):
        assert outcome["link"] == "back" and outcome["rate_gbps"] == 20.0, outcome
        assert outcome["tx_e2e"] == {"wsa": "Y", "wsb": "Y"} and outcome["tx_e2e_kept"]
        assert outcome["recovered_seconds"] is not None, outcome
        print(f"soak event: {outcome['event']}: link back in {outcome['link_seconds']}s, "
              f"served again after {outcome['recovered_seconds']}s")
    records = [json.loads(line) for line in Path(report["ledger"]).read_text().splitlines()]
    assert [record["outcome"] for record in records[-2:]] == ["hotplug", "suspend"]
    matrix = subprocess.run([str(PYTHON), "experiment.py", "matrix"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    row = next(line for line in matrix.stdout.splitlines() if "| rx Y tx Y |" in line
               and "NVM 36.0" in line)
    assert "back at 20 Gb/s" in row.split("|")[-3] and "back at 20 Gb/s" in row.split("|")[-2]
    checks = verify("tp2_e2e")
    assert checks.returncode == 0, checks.stdout[-3000:]

    started = time.monotonic()
    stalled = subprocess.Popen([*SOAK, "--minutes", "2", "--out", str(tmp_path)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(7)
        with fault("tx_credit_stall"):
            output, _ = stalled.communicate(timeout=300)
    finally:
        if stalled.poll() is None:
            stalled.kill()
    print(f"soak: the stall to a verified production in {time.monotonic() - started:.0f}s")
    assert stalled.returncode == 1, output[-3000:]
    assert "stopped: a stall: no request completed" in output, output[-3000:]
    assert "production was restored and verified" in output
    report = report_of(output)
    assert report["stopped"].startswith("a stall")
    assert report["restored"] == "production was restored and verified"
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]
