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
    quiet = subprocess.run([*SOAK, "--minutes", "0.25", "--out", str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    report = report_of(quiet.stdout)
    assert report["state"] == "tp2_e2e" and report["stopped"] is None
    # Healthy, the candidate's guard stayed armed and never fired.
    assert report["guard"] == "armed, quiet", report["guard"]
    assert len(report["samples"]) >= 4
    assert all(sample["tok_s"] > 0 and sample["receiver_errors"] == 0
               for sample in report["samples"]), report["samples"]

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
