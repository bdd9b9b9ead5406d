"""
The experiment harness behind ``experiment.py``: observing which state the hosts
are in, measuring bounded windows, reporting and comparing them, and the
one-layer-at-a-time campaign.

Nothing here changes a host. Transitions are ``pyinfra inventory.py deploy.py``
runs (the campaign starts them as an operator would); the harness reads hosts
with the layers' own facts over SSH and asks the serving endpoint over HTTP.
"""
