"""
pyinfra's config file: the CLI executes it once per run, after parsing the
command line and before it loads the inventory or connects to any host.

twinbolt uses it to read the run's options and check every ``--data`` item (a
site key's value, a run option, no other key: ``operations/site/options.py``), and to
refuse an unknown or missing target state, before anything else happens. It
has to be here, because no later hook is early enough:
``--data state=NAME`` reaches host data only when pyinfra builds the final
inventory, after ``inventory.py`` and ``group_data/`` have run (neither sees
``--data``), and the next code of ours pyinfra runs is ``deploy.py``, which it
loads only after ``connect_all()`` has connected to every host. A typo must not
cost a round of connections, let alone a half-run, so the check reads the CLI's
own parsed arguments from click's context.

It is also where twinbolt answers SIGINT, SIGTERM and SIGHUP in place of the
CLI (:mod:`operations.safety.interrupt`): before any host is connected to.
"""

import click
from pyinfra import config, state

from operations.run import remember_command_line
from operations.safety import interrupt
from operations.site import options, overrides
from operations.states import resolve_state

# A host that fails (cannot be reached, or refuses in preflight) stops the whole
# run: the two sides of the link move together or not at all. Set here, before
# pyinfra copies the config for the run; deploy.py would only change its copy.
config.FAIL_PERCENT = 0

# None when pyinfra is driven through its Python API, which takes no --data.
_cli = click.get_current_context(silent=True)
if _cli is not None:
    _given = options.given(_cli.params)
    # Other commands (debug-inventory, exec, fact) need no state, but every
    # --data item given to any of them must still be a known one.
    overrides.check(_given)
    _options = options.RunOptions.read(_given)
    if options.deploys(_cli.params):
        resolve_state(_options.state)
        options.refuse_passwords(_cli.params, _options)
    _options.remember(state)
    remember_command_line(state, _cli.params)
    interrupt.install(state)
