"""
The compatibility ledger on the lab: the upstream report refuses the candidate
on an ASMedia ASM4242 before anything changes; forcing it past the refusal
stalls the link, as the ASM4242 does, ends in a verified production, and is
recorded; ``experiment.py matrix`` prints what was recorded.
"""

from __future__ import annotations

import subprocess
import time

from e2e_helpers import (
    PYTHON,
    REPO,
    SHORT_LINK_WAIT,
    deploy,
    fault,
    refused_for_a_recorded_stall,
    verify,
)

from operations.safety import ledger

# wsb's ASM4242 and wsa's JHL8540, each on the lab's firmware for it.
PAIRING = "1b21:2425 (NVM 2.1) + 8086:1137 (NVM 36.0)"


def test_the_asm4242_is_refused_and_a_forced_run_is_rolled_back_and_recorded(tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    own_ledger = ("--data", f"ledger_path={path}")
    with fault("asm4242"):
        refused = refused_for_a_recorded_stall(PAIRING, *own_ledger)
        assert "upstream revert 1881f2efbf7f" in refused.output

        started = time.monotonic()
        forced = deploy("tp2_e2e", *own_ledger, *SHORT_LINK_WAIT,
                        "--data", "force_candidate=yes")
        print(f"forced run to verified production: {time.monotonic() - started:.1f}s")
    assert forced.returncode != 0
    assert forced.output.count(f"FORCED: THE CANDIDATE RUNS ON THE CONTROLLER PAIRING "
                               f"{PAIRING}") >= 2, "said at preflight and at the end"
    assert "link layer" in forced.output and "no traffic moves" in forced.output
    assert "production was restored and verified" in forced.output

    refusal, rollback, stall = ledger.read(path)
    assert (refusal["outcome"], refusal["layer"], refusal["forced"]) == ("refused", "driver",
                                                                         False)
    assert {part["host"]: (part["nhi"], part["nvm_version"]) for part in refusal["hosts"]} == {
        "wsa": ("8086:1137", "36.0"), "wsb": ("1b21:2425", "2.1")}
    assert (rollback["state"], rollback["outcome"]) == ("production", "accepted")
    assert (stall["outcome"], stall["layer"], stall["stall"], stall["forced"]) == (
        "rolled_back", "link", True, True)
    assert {part["kernel"] for part in stall["hosts"]} == {
        subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()}

    shown = subprocess.run([str(PYTHON), "experiment.py", "matrix", "--ledger", str(path)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    print(shown.stdout)
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if f"| {PAIRING} |" in line]
    # Refused, the stock driver stayed; the rollback's production; forced, the candidate ran.
    assert len(rows) == 3, shown.stdout
    assert "| candidate | rx Y tx - | 1 refused |" in rows[0]
    assert "| stock " in rows[1] and "| 1 accepted |" in rows[1]
    assert "| rx Y tx Y | 1 rolled_back (forced) |" in rows[2]
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]
