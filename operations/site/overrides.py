"""
``--data key=value``: a site key, checked as the site file's value would be, or
a run option (``operations/site/options.py``); any other key is refused.

The site file is validated when it loads (``operations/site/model.py``), and pyinfra
merges ``--data`` over the inventory's data afterwards; the settings are built
from the merged data and not validated again (``operations/settings.py``). So an
override would reach a unit, a command line or an ssh_config unchecked:
``--data serving_user=root``, or ``--data 'serving_working_directory=/srv
ExecStartPre=+/usr/bin/id'`` with its newline. An override of a site key is a
site value, and gets that key's own check, before anything is read or changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pyinfra.api.exceptions import PyinfraError

from operations.site import options
from operations.site.model import (
    COMMAND_TIMEOUT,
    SECTIONS,
    SiteHost,
    Workstation,
    flat_key,
    nested_section,
    problem_message,
)


class BadOverride(PyinfraError):
    """A ``--data`` value a site file could not hold; pyinfra prints it and exits non-zero."""


def flat_fields(model: type[BaseModel], prefix: str) -> dict[str, FieldInfo]:
    """Every field of a section under its host data name, nested sections' too."""
    found: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        key = flat_key(prefix, name)
        nested = nested_section(field)
        found.update(flat_fields(nested, key) if nested else {key: field})
    return found


def site_fields() -> dict[str, FieldInfo]:
    """Each site key's host data name and its field, as ``Site`` publishes them."""
    fields = {key: field for prefix, model in SECTIONS.items()
              for key, field in flat_fields(model, prefix).items()}
    # pyinfra's own _timeout carries [ssh] command_timeout_seconds (command_timeout_data).
    fields[COMMAND_TIMEOUT] = fields.pop(flat_key("ssh", "command_timeout_seconds"))
    fields.update({name: field for name, field in SiteHost.model_fields.items()
                   if name.startswith("ssh_")})
    fields[flat_key("serving", "listen_address")] = Workstation.model_fields["listen_address"]
    return fields


def checker(field: FieldInfo) -> TypeAdapter[Any]:
    """A field's own check (its type and validators), outside its model."""
    return TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata
                       else field.annotation)


def problem(key: str, value: Any, field: FieldInfo) -> str | None:
    """
    What is wrong with ``--data key=value``, or None. pyinfra reads a value that
    looks like a number or JSON as one (``9.9``, ``true``): the text as typed is
    tried too, so a version or a name that looks like a number is not refused.
    """
    check = checker(field)
    tried = [value] if isinstance(value, str) else [value, str(value)]
    errors: list[str] = []
    for candidate in tried:
        try:
            check.validate_python(candidate)
            return None
        except ValidationError as error:
            errors.append(problem_message(error.errors()[0]))
    return f"--data {key}: {errors[0]}"


def check(overrides: Mapping[str, Any]) -> None:
    """
    Refuse the run, naming every bad ``--data`` item at once, before any change:
    a site key's bad value, a run option's, and every key that is neither.
    """
    fields = site_fields()
    problems = [found for key, value in overrides.items() if key in fields
                if (found := problem(key, value, fields[key]))]
    problems += options.problems({key: value for key, value in overrides.items()
                                  if key not in fields})
    if problems:
        raise BadOverride("refused: " + "; ".join(problems) + ". A --data key is a site key, "
                          "checked as the site file's value would be, or a run option: "
                          f"{', '.join(options.RUN_OPTIONS)}. Nothing was changed")
