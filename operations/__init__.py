"""
twinbolt's operations, in packages by layer and by kind; every import points
down this list, from the run to the plumbing:

- ``part`` (a host's part in a run: its settings and what each of its layers
  is given, for ``deploy.py``), ``run`` (one run as an object: its attempt,
  its locks, its proofs) and ``bounds`` (how long a whole run may take, for
  whoever runs one as a process);
- ``safety/``: ``lock`` (one run at a time), ``scope`` (the pair is one unit),
  ``ledger`` (what each run met and how it ended; no candidate on controllers
  seen to stall), ``guard`` (the candidate undone if a host hangs),
  ``rollback`` (a failure after a change ends in a verified production) and
  ``interrupt`` (a signal is a failure too);
- the layers, in the runbook's order, each with its facts, its judgements and
  its operations, none importing another: ``serving/`` (``gpu``, ``sglang`` on
  the workstations, ``router`` its part on the gateway, ``transport`` where
  the TP group's bytes go), ``gateway/`` (``proxy``, and ``route``: the proofs
  of the user's route through it) and ``thunderbolt/`` (``driver`` and
  ``link``), above ``services`` (long-running services on runit or systemd,
  and their logs);
- ``site/``: the inventory's data and the command line as typed values
  (``model``, ``settings``, ``overrides``, ``options``, ``hosts``, ``syntax``,
  ``releases``: what the supported SGLang releases accept differently);
- ``step`` (the ``@operation(Layer)`` decorator: a step declares its layer,
  refuses before any change or fails after one) and ``states`` (the declared
  states);
- ``plumbing/``: ``phase``, ``facts``, ``reading``, ``probes``, ``connect``,
  ``venvs`` and ``module_file``.

Each layer exports its reading of a host (the facts a harness reads for it,
with their arguments, as :class:`~operations.plumbing.reading.Query`) and its
judge of the values read: status, diagnose, the counters and ``tests/verify``
read and judge a layer through these, never with facts of their own choosing.

Each package's own docstring says what it owns and what it must not touch.
"""
