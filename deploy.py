"""
The runbook: converge every host to the state named by ``--data state=NAME``.

    pyinfra inventory.py deploy.py --data state=tp2_e2e

Each step is a declared target, not a script: run twice, the second run changes
nothing. Facts are read inside operations (pyinfra evaluates operation bodies
again at execute time), never branched on here, but for one: when a run
leaves pairs out (``--limit pair_b``), which of their replicas the gateway's
router fronts now, since they keep serving ``small`` through it whatever this
run does (``operations/part.py``). The order is the field report's
discipline, one layer at a time:

1. preflight (read-only): any failure stops the run before a change, but for a
   link the target cannot use on hosts where no replica serves (a TP group on
   that very link): refusing would keep it, so the attempt fails at its first
   step and ends in production;
2. gateway: the temporary fallback exists before the GPUs are borrowed, unless
   a pair outside the run still serves ``small``;
3. serving: stop what the target does not run; the router first drops the
   run's replicas, and is proven to serve from the pairs that stay;
4. driver: swap only if the target's driver differs, on both workstations;
5. link: retrained at the expected rate, the peer answering across it (a
   warning, not a failure, in production, whose replicas do not use it and
   whose driver is the plain stock build);
6. serving: start the target's servers, accepted only by a real completion;
7. gateway: the user's route answers; the fallback goes once production is proven;
8. verify: every layer holds, with the evidence if it does not.

Around them: a host lock (one run at a time), the rule that a failure after
the first change ends in a verified production (``--data on_failure=stop``
leaves the hosts as they are instead), then a non-zero exit naming the host,
the layer and the evidence (a signal is such a failure: operations/safety/interrupt.py);
and the compatibility ledger, which records what each run met and how it ended,
and refuses the candidate on controllers it has seen stall (``--data
force_candidate=yes`` overrides).

Every remote command is bounded, so that a host whose connection drops silently
fails its step instead of hanging the run: by the site's ``[ssh]
command_timeout_seconds``, pyinfra's own ``_timeout`` in host data, which every
operation and fact takes by default; a step that waits longer (a serving start,
the link's retraining, the proxy's restart) by its own wait and one command more;
the rollback by every wait of a production converge.
"""


import pyinfra
from pyinfra import host, inventory

from operations import run as runs
from operations.gateway import ownership, proxy, route
from operations.part import Part
from operations.safety import guard, interrupt, ledger, lock, rollback, scope
from operations.serving import gpu, router, sglang
from operations.site.options import RollbackKeys, RunOptions
from operations.states import resolve_state
from operations.thunderbolt import driver, link

# The run's options, read and checked with every --data item by config.py; a
# rollback's own keys, given by the failed run that started it.
options = RunOptions.of(pyinfra.state)
rollback_keys = RollbackKeys.of(host.data)
state = resolve_state(options.state)
# The pair is one unit: a run that leaves a host out is refused before anything,
# but for a rollback, which leaves out the hosts its failed run lost.
scope.whole_pairs(inventory, pyinfra.state.is_host_in_limit, state.name,
                 lost=scope.lost_hosts(rollback_keys.lost_hosts, rollback_keys.lock_inherited,
                                       state.name))
# A rollback holds the lock of the failed run that started it.
run = runs.begin(pyinfra.state, state.name, rollback_keys.lock_inherited)
in_run = scope.reached(inventory, pyinfra.state.is_host_in_limit)
# This host's part in the run (operations/part.py); a workstation's own steps are
# called only where it has one.
part = Part.of(host, inventory, in_run, state, run)
workstation = part.workstation

if workstation:
    # However the run ends, the compatibility ledger on this machine gets one record.
    ledger.keep(run, workstation.settings.ledger.path, state.name, state.driver,
                workstation.pair)
    ledger.observed(name="Ledger: the controller, kernel and driver this run meets",
                    run=run, module=workstation.settings.candidate.module_name)

# One run at a time: the pair's locks, all or nothing, before anything else is read.
# One step per host, in the inventory's order, so that of two runs started together
# the one that takes the first host proceeds; a refusal from here on (the lock's,
# or preflight's) releases what this run took, and so leaves nothing behind.
for member in in_run:
    lock.held(name=f"Lock: held on {member.name}", run_dir=part.settings.run_dir, run=run,
              holder=member.name)
# The locks are the run's first write: from here a signal fails the attempt into the
# rollback, which releases them and ends in a verified production (nothing to undo
# yet in preflight); before, it ends the run at once.
interrupt.changes_begin(name="Interrupt: from here a signal ends the run in production",
                        interrupts=run.interrupts)

if workstation:
    # A stall the guard met with no run watching is named, and counts in this run's
    # refusal; read under the lock, so that a run the lock refuses leaves it in place.
    guard.reported(name="Guard: what the guard did since the last run", run=run,
                   init_system=workstation.settings.serving.init_system,
                   ledger_path=workstation.settings.ledger.path)

# 1. Preflight: read-only; every refusal happens here, before any change.
if workstation:
    link.management_path(name="Preflight: management traffic does not cross the link",
                         interface=workstation.link.interface,
                         addresses={"operator": "ssh-client",
                                    "gateway": workstation.gateway_address})
    driver.admissible(name=f"Preflight: the {state.driver} driver can be loaded",
                      loaded=state.driver, candidate=workstation.candidate)
    if state.driver.is_candidate:
        ledger.no_recorded_stall(
            name="Preflight: no stall of the candidate is recorded for these controllers",
            run=run, path=workstation.settings.ledger.path, workstations=workstation.pair,
            force=options.forced)
    if state.uses_link:
        # Production needs no link, and must stay reachable from a broken one: while
        # its replica serves here, a link the target cannot use refuses the run.
        link.admissible(name="Preflight: the link is up at the expected rate",
                        link=workstation.link, _if=[workstation.replica_serves])
    gpu.free(name="Preflight: the GPU is present and holds nothing twinbolt did not start",
             services=sglang.GPU_SERVICES, init_system=workstation.settings.serving.init_system,
             foreign_memory_mib=workstation.settings.serving.foreign_gpu_memory_mib)
    sglang.admissible(name=f"Preflight: SGLang can serve {state.name} here", sglang=part.sglang,
                      serving=state.serving, speculative=state.speculative)
ownership.own(name="Preflight: the proxy's name and port are twinbolt's, not the site's LiteLLM's",
              proxy=part.proxy)
route.admissible(name="Preflight: the large role answers, so small can fall back to it",
                 proxy=part.proxy, fallback=part.fallback, _timeout=part.request_bound)

# Steps 2-8 are the attempt: after a failure the remaining steps are skipped on
# every host, and the failure is recorded rather than ending the run at once.
with host.arguments(_ignore_errors=True, _if=[run.attempt.healthy]):
    # Where no replica serves (a TP group on this very link, or what the guard left),
    # refusing would keep small on the fallback: the same link fails the attempt
    # instead, before anything moves, and the run ends in a verified production.
    if workstation and state.uses_link:
        link.cable_holds(name="Link: the link is up at the expected rate, or the run ends in "
                              "production", link=workstation.link,
                         _if=[run.attempt.healthy, workstation.no_replica_serves])

    # 2. Gateway: the temporary fallback exists, and is proven, before the GPUs are borrowed,
    # unless a pair outside this run still serves small.
    if part.fallback:
        proxy.proxy(name="Gateway: the temporary fallback small -> large is present",
                    proxy=part.proxy, fallback=True, proofs=run.proofs,
                    _timeout=part.proxy_bound)
        route.fallback_proven(name="Gateway: a forced fallback through small is served by large",
                              proxy=part.proxy, _timeout=part.request_bound)

    # 3. Serving: stop what the target does not run; a GPU holds a replica or a rank, never both.
    if state.tensor_parallel:
        # The router drops this run's replicas before they stop: it fronts only the pairs
        # outside the run that serve, and is proven to, or stops with the last replicas.
        router.router(name="Serving: the router stops with the replicas, or fronts the pairs "
                           "that stay", router=part.router, present=part.router_runs)
        if part.router_runs:
            router.router_accepted(
                name="Serving: the router serves a real completion from the pairs that stay",
                router=part.router, proofs=run.proofs, _timeout=part.start_bound)
        sglang.replica(name="Serving: the replicas are stopped", sglang=part.sglang,
                       proofs=run.proofs, present=False)
        # A running TP group that is to change, or whose link a driver swap will take
        # away, stops here as a whole; it starts again together in step 6.
        sglang.tp_rank_stopped_for_change(name="Serving: the TP ranks stop if they are to change",
                                          sglang=part.sglang, speculative=state.speculative)
        if workstation:
            # The driver layer's own answer, asked when the step runs: the swap of step 4.
            sglang.tp_rank(
                name="Serving: the TP ranks stop if the driver under them is to change",
                sglang=part.sglang, present=False,
                _if=[run.attempt.healthy, workstation.driver_swaps])
        # The outage has begun: the user's route must survive it before the GPUs are borrowed.
        route.roles_proven(
            name="Gateway: small answers through the fallback while the replicas are down, "
                 "or through the pairs that stay",
            proxy=part.proxy, fallback=part.fallback, proofs=run.proofs,
            _timeout=part.request_bound)
    else:
        sglang.tp_rank(name="Serving: the TP ranks are stopped", sglang=part.sglang, present=False)

    # 4. Driver: both workstations in the same step; the guard never swaps it at once with a
    # run: any reload disarms it first, as the driver layer answers when the step runs.
    if workstation:
        guard.armed(name="Guard: disarmed before any driver reload, and under a stock driver",
                    guard=workstation.guard, present=False,
                    _if=[run.attempt.healthy, workstation.guard_disarms_first])
        driver.module(name=f"Driver: thunderbolt_net is the {state.driver} build",
                      loaded=state.driver, candidate=workstation.candidate,
                      run_dir=part.settings.run_dir)

    # 5. Link: retrained after any driver change, the peer answering across it.
    if workstation:
        # Production's replicas do not use the link: a rollback is not failed by a cable.
        link.trained(name="Link: trained at the expected rate, the peer answers",
                     link=workstation.link, needed=state.uses_link,
                     _timeout=workstation.link_bound)
        if state.driver.is_candidate:
            # Armed once the link has trained: a retraining is no stall.
            guard.armed(name="Guard: armed while the candidate is loaded", guard=workstation.guard)

    # 6. Serving: start the target's servers; only a real completion accepts them.
    sglang.linktest_tool(name="Serving: iperf3, the linktest's tool, is installed",
                         sglang=part.sglang)
    if state.tensor_parallel:
        sglang.tp_rank(name="Serving: the TP ranks run", sglang=part.sglang,
                       speculative=state.speculative)
        sglang.tp_accepted(name="Serving: rank 0 serves a real completion as declared",
                           sglang=part.sglang, proofs=run.proofs, speculative=state.speculative,
                           _timeout=part.start_bound)
    else:
        sglang.replica(name="Serving: the replicas run", sglang=part.sglang, proofs=run.proofs)
        sglang.replica_accepted(name="Serving: each replica serves a real completion",
                                sglang=part.sglang, proofs=run.proofs, _timeout=part.start_bound)
        router.router(name="Serving: the router fronts the replicas", router=part.router)
        router.router_accepted(name="Serving: the router serves a real completion",
                               router=part.router, proofs=run.proofs, _timeout=part.start_bound)

    # 7. Gateway: the fallback goes only once some pair's replicas serve small, then both
    # roles are proven.
    if not part.fallback:
        proxy.proxy(name="Gateway: the temporary fallback is removed", proxy=part.proxy,
                    fallback=False, proofs=run.proofs, _timeout=part.proxy_bound)
        route.roles_proven(
            name="Gateway: small is served by the Qwen deployment, large by large",
            proxy=part.proxy, fallback=False, proofs=run.proofs, _timeout=part.request_bound)

    # 8. Verify: every layer holds.
    if workstation:
        driver.verified(
            name=f"Verify: the {state.driver} driver is loaded, nothing of the candidate persists",
            loaded=state.driver, candidate=workstation.candidate, run_dir=part.settings.run_dir)
    sglang.verified(name=f"Verify: the workstations serve as {state.name} declares",
                    sglang=part.sglang, serving=state.serving, speculative=state.speculative,
                    proofs=run.proofs)
    router.router_verified(name="Verify: the router serves, or is stopped with no replica",
                           router=part.router, proofs=run.proofs, present=part.router_runs)
    route.verified(name=f"Verify: the gateway routes as {state.name} declares",
                   proxy=part.proxy, fallback=part.fallback, proofs=run.proofs,
                   _timeout=part.request_bound)

# From here on every step runs on every host whatever the attempt met, and a host
# lost in it (its connection dead) only adds to the conclusion, never ends the
# run first: the rollback, the ledger's record and the locks must still happen.
with host.arguments(_ignore_errors=True):
    if workstation:
        # Before any rollback: a failed attempt is recorded with what it ran.
        ledger.observed(name="Ledger: the controller, kernel and driver the attempt ran",
                        run=run, module=workstation.settings.candidate.module_name)
    # One host speaks for the run: the rollback is one run, the conclusion one message.
    # A failed attempt ends in a verified production: a new run converges it, holding
    # this run's lock, so that no other run moves the hosts in between.
    # A failed rollback is reported by the conclusion, not by pyinfra's abort.
    speakers = tuple(member.name for member in in_run)
    rollback.rolled_back(name="Rollback: production is converged and proven if the attempt failed",
                         attempt=run.attempt, on_failure=options.on_failure, speakers=speakers,
                         carried=(lock.inheriting(run.owner),), timeout=part.rollback_timeout,
                         _timeout=part.rollback_bound)
    lock.released(name="Lock: released", run_dir=part.settings.run_dir, owner=run.owner,
                  inherited=bool(rollback_keys.lock_inherited))
rollback.concluded(name="Conclusion: did the attempt succeed, and what was restored",
                   attempt=run.attempt, on_failure=options.on_failure, speakers=speakers)
