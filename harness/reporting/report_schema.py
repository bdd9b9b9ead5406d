"""
What ``experiment.py compare`` reads of a report file, checked before it reads it.

A comparison takes any file it is given: a JSON list, a string, a report of
another tool or an older one missing a figure. Each is read here against the
parts of a measurement (``harness/reporting/report.py``) or a linktest
(``harness/reporting/linktest_report.py``) that the comparison uses, chosen by its
``format``, so that a file that is neither is one line naming the file and what
it lacks, never a traceback halfway through the table. Anything else a report
holds is left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.reporting import linktest_report, report

Count = int | None
Figure = float | None


class _Part(BaseModel):
    # Only the keys a comparison reads are named; a report holds more.
    model_config = ConfigDict(extra="allow")


class Totals(_Part):
    bytes_moved: Count
    receiver_errors: Count
    retransmissions: Count
    socket_retransmissions: Count = None
    max_socket_retransmissions: Count = None


class Link(_Part):
    totals: Totals


class Sample(_Part):
    completion_tokens: Count


class Server(_Part):
    accept_length: Figure


class Window(_Part):
    name: str
    summary: dict[str, Any]
    samples: list[Sample]
    link: Link
    server: Server


class Measurement(_Part):
    format: Literal[report.FORMAT]
    state: str
    windows: list[Window]
    config: dict[str, Any] = Field(default_factory=dict)
    roofline: dict[str, Any] | None = None


class LinkErrors(_Part):
    retransmissions: Count
    receiver_errors: Count


class RunLink(_Part):
    totals: LinkErrors


class Flows(_Part):
    kind: Literal["flows"]
    direction: str
    flows: int
    gbit_s: Figure
    capped: bool
    link: RunLink


class Probes(_Part):
    kind: Literal["probes"]
    sent: int
    received: int
    mean_ms: Figure
    p99_ms: Figure


class LoadAndPing(_Part):
    kind: Literal["load_and_ping"]
    loss: Figure


class Observed(_Part):
    layers: dict[str, Any]


class Linktest(_Part):
    format: Literal[linktest_report.FORMAT]
    state: str
    observed: Observed
    runs: list[Annotated[Flows | Probes | LoadAndPing, Field(discriminator="kind")]]


# The kinds of report a comparison reads, by their format.
KINDS: dict[str, type[BaseModel]] = {report.FORMAT: Measurement, linktest_report.FORMAT: Linktest}


def load(path: Path) -> dict[str, Any]:
    """
    The report at ``path``, as written; a ``ValueError`` naming the file and the
    first thing it lacks when it is no measurement or linktest a comparison can read.
    """
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON: {error}") from None
    kind = KINDS.get(document.get("format")) if isinstance(document, dict) else None
    if kind is None:
        raise ValueError(f"{path}: not a twinbolt report: a JSON object whose format is "
                         f"{' or '.join(KINDS)} was expected")
    try:
        kind.model_validate(document)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise ValueError(f"{path}: a {document['format']} report that compare cannot read: "
                         f"{where}: {problem['msg']}") from None
    return document
