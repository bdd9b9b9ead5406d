"""
The runbook: converge every host to the state named by ``--data state=NAME``.

    pyinfra inventory.py deploy.py --data state=tp2_e2e

Each step is a declared target, not a script: run twice, the second run changes
nothing. Facts are read inside operations (pyinfra evaluates operation bodies
again at execute time), never branched on here. The order is the field
report's discipline, one layer at a time:

1. preflight (read-only): any failure stops the run before a change;
2. gateway: the temporary fallback exists before the GPUs are borrowed;
3. serving: stop what the target does not run;
4. driver: swap only if the target's driver differs, on both workstations;
5. link: retrained at the expected rate, the peer answering across it;
6. serving: start the target's servers, accepted only by a real completion;
7. gateway: the user's route answers; the fallback goes once production is proven;
8. verify: every layer holds, with the evidence if it does not.
"""

from pyinfra import config, host

from operations import driver, link
from operations.driver import CandidateModule
from operations.states import resolve_state

# A refusal on one workstation must stop the other before it changes anything:
# the two sides of the link move together or not at all.
config.FAIL_PERCENT = 0

state = resolve_state(host.data.get("state"))
workstation = "workstations" in host.groups

if workstation:
    candidate = CandidateModule(
        host.data.candidate_path, host.data.candidate_sha256, host.data.candidate_module_name
    )
    the_link = dict(
        interface=host.data.link_interface,
        address=host.data.thunderbolt_address,
        peer_address=host.data.peer_thunderbolt_address,
        expected_rate_gbps=host.data.link_expected_rate_gbps,
        expected_lanes=host.data.link_expected_lanes,
    )

# 1. Preflight: read-only; every refusal happens here, before any change.
if workstation:
    driver.admissible(
        name=f"Preflight: the {state.driver} driver can be loaded",
        loaded=state.driver,
        candidate=candidate,
    )
    link.trained(name="Preflight: the link is up at the expected rate", wait=False, **the_link)

# 4. Driver: both workstations in the same step.
if workstation:
    driver.module(
        name=f"Driver: thunderbolt_net is the {state.driver} build",
        loaded=state.driver,
        candidate=candidate,
        run_dir=host.data.run_dir,
    )

# 5. Link: retrained after any driver change, the peer answering across it.
if workstation:
    link.trained(name="Link: trained at the expected rate, the peer answers", **the_link)

# 8. Verify: every layer holds.
if workstation:
    driver.verified(
        name=f"Verify: the {state.driver} driver is loaded, nothing of the candidate persists",
        loaded=state.driver,
        candidate=candidate,
        run_dir=host.data.run_dir,
    )
