"""
pyinfra's config file: the CLI executes it once per run, after parsing the
command line and before it loads the inventory or connects to any host.

twinbolt uses it to refuse an unknown or missing target state before anything
else happens. It has to be here, because no later hook is early enough:
``--data state=NAME`` reaches host data only when pyinfra builds the final
inventory, after ``inventory.py`` and ``group_data/`` have run (neither sees
``--data``), and the next code of ours pyinfra runs is ``deploy.py``, which it
loads only after ``connect_all()`` has connected to every host. A typo must not
cost a round of connections, let alone a half-run, so the check reads the CLI's
own parsed arguments from click's context.

It is also where twinbolt answers SIGINT, SIGTERM and SIGHUP in place of the
CLI (:mod:`operations.interrupt`): before any host is connected to.
"""

from pathlib import Path

import click
from pyinfra import config, state
from pyinfra.api.exceptions import PyinfraError

from operations import interrupt
from operations.run import remember_command_line
from operations.states import resolve_state

# A host that fails (cannot be reached, or refuses in preflight) stops the whole
# run: the two sides of the link move together or not at all. Set here, before
# pyinfra copies the config for the run; deploy.py would only change its copy.
config.FAIL_PERCENT = 0

# What a run does when it fails after changing something: converge production
# and prove it (the default), or leave the hosts as they are for debugging.
ON_FAILURE = ("rollback", "stop")

# None when pyinfra is driven through its Python API, which takes no --data.
_cli = click.get_current_context(silent=True)
if _cli is not None:
    _data = dict(item.split("=", 1) for item in _cli.params["data"] if "=" in item)
    # Other commands (debug-inventory, exec, fact) need no state, but a state
    # given to any of them must still be a real one.
    if "state" in _data or any(Path(op).name == "deploy.py" for op in _cli.params["operations"]):
        resolve_state(_data.get("state"))
    remember_command_line(state, _cli.params)
    interrupt.install(state)
    if _data.get("on_failure", "rollback") not in ON_FAILURE:
        raise PyinfraError(
            f"unknown on_failure {_data['on_failure']!r}; it is one of: {', '.join(ON_FAILURE)}"
        )
    if _data.get("force_candidate", "yes") != "yes":
        raise PyinfraError(
            f"force_candidate is {_data['force_candidate']!r}; only force_candidate=yes "
            "overrides a recorded stall (leave it out otherwise)"
        )
