"""
twinbolt's operations, one module per layer or shared concern.

The layers, in the runbook's order: ``gpu``, ``driver``, ``link``, ``serving``
(with ``serving_router``, its part on the gateway) and ``gateway`` (with
``gateway_route``, the proofs of the user's route through it), each with
its facts, its judgements and its operations. What they share: ``states`` (the
declared states), ``site`` and ``hosts`` (the inventory's data), ``sglang_releases``
(what the supported SGLang releases accept differently), ``services``
(long-running services on runit or systemd, and their logs), ``venvs`` (pinned
Python packages), ``probes`` (real requests and bounded waits), ``transport``
(where the TP group's bytes go), ``phase`` (executing or only planning, and
which hosts an operation concerns), ``lock`` (one run at a time), ``attempt``
(a failure after a change ends in a verified production), ``ledger`` (what each
run met and how it ended; no candidate on controllers seen to stall), ``facts``
(what facts share, several read as one command), ``connect`` (pyinfra's SSH
connection with Nagle's algorithm off, bounded when it drops) and ``bounds``
(how long a whole run may take, for whoever runs one as a process).
"""
