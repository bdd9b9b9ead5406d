"""
The experiment harness behind ``experiment.py``: observing which state the hosts
are in, measuring bounded windows, reporting and comparing them, and the
one-layer-at-a-time campaign.

Nothing here changes a host. Transitions are ``pyinfra inventory.py deploy.py``
runs (the campaign starts them as an operator would); the harness reads hosts
with the layers' own facts over SSH and asks the serving endpoint over HTTP.

Its packages, top to bottom; each imports only those below it (import-linter's
``harness-layers`` contract in ``pyproject.toml``):

- ``runs``: what ``experiment.py`` starts: measure, campaign, soak, linktest;
- ``reporting``: reports, comparisons, charts, formats;
- ``measuring``: the client, the windows, the samplers, the profiler;
- ``judging``: intervals and verdicts, the roofline, a window's disturbance;
- ``hosts``: reading the hosts through the layers' own readings;
- ``progress``: the lines a long wait prints, for every one of them.
"""
