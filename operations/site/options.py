"""
The run's own options: the ``--data`` keys that are no site key, as one typed
object, read once from the command line.

``--data key=value`` becomes host data, and host data is read by more than
twinbolt's settings: pyinfra takes any of its global arguments found there
(``_if``, ``_ignore_errors``, ``_success_exit_codes``, ``_chdir`` ...) as the
default of every operation, and the runbook reads keys that it sets itself
(``rank``, ``run_dir``) or that a failed run gives its rollback. So a ``--data``
key is a site key, checked as the site file's value would be
(``operations/site/overrides.py``; pyinfra's ``_timeout`` is ``[ssh]
command_timeout_seconds``), or one of :class:`RunOptions`; anything else is
refused, before any host is connected (``config.py``).

The rollback's own keys (:data:`ROLLBACK_KEYS`) are apart: the failed run gives
them to its rollback in the rollback's environment (:data:`CARRIED_DATA_ENV`),
and a command line that gave them would walk past the lock, or leave hosts out
of the pair.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pyinfra.api.exceptions import PyinfraError

from operations.site.model import problem_message
from operations.states import resolve_state

# The keys only a rollback is given, by the run that starts it: the hosts its
# failed run lost, which it leaves out (``--exclude``) and restores production
# on the rest; and the run whose lock it holds (:func:`operations.safety.lock.inheriting`).
LOST_HOSTS_KEY = "lost_hosts"
INHERITED_KEY = "lock_inherited"
ROLLBACK_KEYS = (LOST_HOSTS_KEY, INHERITED_KEY)

# pyinfra's own options that it merges into host data under a site key's name,
# as ``--data`` items (pyinfra_cli's override data): they are checked as site keys.
SITE_KEY_OPTIONS = ("ssh_user", "ssh_key", "ssh_port")

# pyinfra's options that take a password, by their spelling. No password reaches
# the rollback a failure starts (:data:`CARRIED_OPTIONS` says why), so it could
# not log in.
PASSWORD_OPTIONS = {
    "ssh_password": "--ssh-password", "ssh_password_prompt": "--ssh-password-prompt",
    "ssh_key_password": "--ssh-key-password", "use_sudo_password": "--use-sudo-password",
    "same_sudo_password": "--same-sudo-password",
}

# The attribute of pyinfra's state that holds the options config.py read.
OPTIONS_ATTRIBUTE = "twinbolt_options"


def _known_state(name: str) -> str:
    return resolve_state(name).name


class RunOptions(BaseModel):
    """
    What one run is asked to do beyond the site's settings, from its ``--data``:

    + state: the declared state to converge to (``operations/states.py``); only
      ``deploy.py`` needs one
    + on_failure: after a failure that changed something, ``rollback`` (converge
      production and prove it) or ``stop`` (leave the hosts as they are, to debug)
    + force_candidate: ``yes`` loads the candidate despite a recorded stall
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    state: Annotated[str, AfterValidator(_known_state)] | None = None
    on_failure: Literal["rollback", "stop"] = "rollback"
    force_candidate: Literal["yes"] | None = None

    @property
    def forced(self) -> bool:
        return self.force_candidate == "yes"

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> RunOptions:
        """The run options among ``data``, the ``--data`` items (:func:`given`), validated."""
        return cls.model_validate({key: value for key, value in data.items()
                                   if key in cls.model_fields})

    @classmethod
    def of(cls, pyinfra_state: Any) -> RunOptions:
        """
        The options ``config.py`` read for the run ``pyinfra_state`` executes; the
        defaults under pyinfra's Python API, which takes no ``--data``.
        """
        return getattr(pyinfra_state, OPTIONS_ATTRIBUTE, None) or cls()

    def remember(self, pyinfra_state: Any) -> None:
        setattr(pyinfra_state, OPTIONS_ATTRIBUTE, self)

    def data_items(self) -> list[str]:
        """The options given, as the ``key=value`` items of a command line's ``--data``."""
        return [f"{key}={getattr(self, key)}" for key in type(self).model_fields
                if key in self.model_fields_set]


RUN_OPTIONS = tuple(RunOptions.model_fields)

# The item that loads the candidate despite a recorded stall, as an operator gives it.
FORCING = RunOptions(force_candidate="yes").data_items()[0]


@dataclass(frozen=True)
class RollbackKeys:
    """
    The rollback's own keys (:data:`ROLLBACK_KEYS`) in a host's data, as its
    failed run gave them; absent, None, in any other run:

    + lost_hosts: the hosts the failed run lost, as given (``operations.safety.scope.lost_hosts``
      checks it is a list of names)
    + lock_inherited: the line of the failed run's lock, which the rollback holds
    """

    lost_hosts: Any
    lock_inherited: str | None

    @classmethod
    def of(cls, data: Any) -> RollbackKeys:
        """The keys among ``data``, a pyinfra ``Host``'s data or a plain mapping."""
        return cls(lost_hosts=data.get(LOST_HOSTS_KEY), lock_inherited=data.get(INHERITED_KEY))


class BadCommandLine(PyinfraError):
    """A ``--data`` item that is no ``key=value``; pyinfra prints it and exits non-zero."""


def given(params: Mapping[str, Any]) -> dict[str, Any]:
    """
    The host data pyinfra's parsed command line ``params`` overrides: each
    ``--data key=value``, its value read as pyinfra reads it (``9.9``, ``true``
    and JSON are numbers, booleans and lists), and the SSH options pyinfra merges
    with them (:data:`SITE_KEY_OPTIONS`). Called inside pyinfra's CLI, which is
    then imported already (importing it monkey-patches the interpreter).
    """
    from pyinfra_cli.util import parse_cli_arg

    data: dict[str, Any] = {}
    for item in params["data"]:
        key, equals, value = item.partition("=")
        if not equals:
            raise BadCommandLine(f"refused: --data {item!r} is no key=value. Nothing was changed")
        data[key] = parse_cli_arg(value)
    return {**data, **{key: params[key] for key in SITE_KEY_OPTIONS if params.get(key)}}


def problems(data: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``--data`` items that are no site key, one phrase each."""
    found = [f"--data {key}: a rollback's own key, which only the run that starts the rollback "
             "gives it, never a command line" if key in ROLLBACK_KEYS
             else f"--data {key}: no site key, and no run option"
             for key in data if key not in RUN_OPTIONS]
    try:
        RunOptions.read(data)
    except ValidationError as error:
        found += [f"--data {problem['loc'][0]}: {problem_message(problem)}"
                  for problem in error.errors()]
    return found


def deploys(params: Mapping[str, Any]) -> bool:
    """Whether the command line runs the runbook (which needs a state, and may roll back)."""
    return any(Path(operation).name == "deploy.py" for operation in params["operations"])


class PasswordRefused(PyinfraError):
    """A password option given to a run that would roll back; pyinfra prints it and exits."""


def refuse_passwords(params: Mapping[str, Any], options: RunOptions) -> None:
    """
    Refuse a runbook run that logs in with a password and would roll back after
    a failure: the rollback is a new pyinfra run that no password reaches, so it
    could not log in, and production would not be restored.
    """
    given_options = [option for key, option in PASSWORD_OPTIONS.items() if params.get(key)]
    if given_options and options.on_failure == "rollback" and deploys(params):
        raise PasswordRefused(
            f"refused: {', '.join(given_options)} with on_failure=rollback (the default): the "
            "rollback a failed run starts is a new run that no password reaches (it would show "
            "in the process list, and the rollback has no terminal to prompt on), so it could "
            "not log in. Log in with a key (ssh_key) or an ssh agent (ssh-add), with "
            "passwordless sudo; or give --data on_failure=stop, which leaves the hosts as they "
            "are after a failure. Nothing was changed")


# pyinfra's own options that decide which hosts are reached, and how: the rollback
# reaches the same hosts the same way. Passwords are not carried: they would show
# in the process list, and the rollback has no terminal to prompt on.
CARRIED_OPTIONS = {
    "limit": "--limit", "exclude": "--exclude", "group_data": "--group-data",
    "config_filename": "--config", "sudo": "--sudo", "sudo_user": "--sudo-user",
    "use_sudo_login": "--use-sudo-login", "su_user": "--su-user", "dzdo": "--dzdo",
    "dzdo_user": "--dzdo-user", "shell_executable": "--shell-executable",
    "ssh_user": "--ssh-user", "ssh_port": "--ssh-port", "ssh_key": "--ssh-key",
}


def carried_options(params: dict[str, Any]) -> list[str]:
    """The command line's :data:`CARRIED_OPTIONS`, as given (a flag once, a value each time)."""
    options = []
    for key, option in CARRIED_OPTIONS.items():
        value = params.get(key)
        if value is True:
            options.append(option)
        elif isinstance(value, tuple | list):
            options += [part for item in value for part in (option, str(item))]
        elif value not in (None, False):
            options += [option, str(value)]
    return options


# The --data items a rollback carries, as a JSON list of "key=value" strings:
# in its environment, which only its user can read, not on its command line,
# which every user's `ps` shows and the rollback's log line repeats.
CARRIED_DATA_ENV = "TWINBOLT_CARRIED_DATA"


def carried_data() -> dict[str, Any]:
    """
    The host data a rollback was given by the run that started it, each value
    read as pyinfra reads a ``--data`` value; ``inventory.py`` sets it on every
    host, where it wins over group data, as ``--data`` does.
    """
    from pyinfra_cli.util import parse_cli_arg

    items = json.loads(os.environ.get(CARRIED_DATA_ENV) or "[]")
    return {key: parse_cli_arg(value)
            for key, _, value in (item.partition("=") for item in items)}
