"""
Safety: what keeps a run from leaving the hosts worse off than it found them.

``lock`` (one run at a time, on every host of the pair), ``scope`` (the pair is
one unit), ``ledger`` (what each run met and how it ended; no candidate on
controllers seen to stall), ``guard`` (the candidate restored to stock if the
host hangs), ``rollback`` (a failure after a change ends in a verified
production), ``interrupt`` (a signal after the first change is a failure
too) and ``reading`` (what a harness reads of a host for safety: the guard,
the lock, the ledger's identity; and the guard's judge).

It stands above the layers and may read them (the guard knows the driver and
serving's units); no layer may import it.
"""
