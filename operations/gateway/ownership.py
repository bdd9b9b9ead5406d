"""
Whose proxy runs on the gateway: twinbolt never overwrites the site's own LiteLLM.

A gateway may already run LiteLLM for the site (other models, virtual keys, its
own unit) under the name twinbolt's proxy would take, or on its port. Rendering
twinbolt's unit there would overwrite the site's and restart it, and every run
would restart it again. So the gateway layer's preflight reads, before any
change, the unit file the service's name resolves to (systemd's own answer,
wherever the site put it; runit's run script) and the process listening on the
proxy's port, and refuses a file twinbolt did not render or a listener that is
not twinbolt's proxy, naming what runs; the same for the proxy's front
(haproxy) and LiteLLM's own port behind it. The site keeps its LiteLLM and runs
twinbolt's beside it: another ``gateway_roles.litellm_service``,
``litellm_port`` and ``litellm_backend_port`` (docs/gateway.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.command import PyinfraCommand

from operations import services
from operations.gateway.proxy import LAYER, Proxy
from operations.plumbing.facts import EmptyMeansSomething, shell_script
from operations.plumbing.phase import elsewhere
from operations.step import operation, refuse

# What every file twinbolt renders says of itself (templates/*.j2).
RENDERED_MARK = "Rendered by twinbolt from templates/"
# A foreign listener's command line may hold the site's own keys: their values
# are replaced on the host, as every command line twinbolt reads.
REDACT_FLAGS = (rf"s#({services.KEY_FLAG_PATTERN.removeprefix('^')}[= ])[^ ]+"
                rf"#\1{services.REDACTED}#g")
# How much of a foreign listener's command line a refusal shows.
COMMAND_LINE_CHARACTERS = 160


class ProxyNeighbours(EmptyMeansSomething):
    """
    The unit file the service ``service`` resolves to (systemd's FragmentPath,
    else ``rendered``) and whether twinbolt rendered it; and each process
    listening on TCP ``port``, with its command line.

    .. code:: python

        {"file": "/etc/systemd/system/litellm.service", "ours": False,
         "listeners": [{"pid": 812, "command": "/opt/litellm/bin/python ... --port 4000"}]}
    """

    def requires_command(self, service: str, rendered: str, port: int) -> str:
        return "ss"

    def command(self, service: str, rendered: str, port: int) -> StringCommand:
        script = (
            'f=$(systemctl show -p FragmentPath --value "$1.service" 2>/dev/null); '
            '[ -n "$f" ] || f=$2; '
            'if [ -e "$f" ]; then '
            f'if grep -qsF "{RENDERED_MARK}" "$f"; then echo "ours $f"; '
            'else echo "foreign $f"; fi; fi; '
            'ss -Hltnp "sport = :$3" 2>/dev/null | grep -o "pid=[0-9]*" | cut -d= -f2 | sort -un | '
            'while read -r pid; do '
            'printf "listener %s %s\\n" "$pid" "$(tr "\\0" " " < /proc/$pid/cmdline 2>/dev/null | '
            f'sed -E {shlex.quote(REDACT_FLAGS)} | cut -c1-{COMMAND_LINE_CHARACTERS})"; done'
        )
        return shell_script(script, service, rendered, str(port))

    def process(self, output: list[str]) -> dict:
        found: dict = {"file": None, "ours": None, "listeners": []}
        for line in output:
            word, _, rest = line.partition(" ")
            if word in ("ours", "foreign"):
                found.update(file=rest.strip(), ours=word == "ours")
            elif word == "listener":
                pid, _, command = rest.partition(" ")
                found["listeners"].append({"pid": int(pid), "command": command.strip()})
        return found


def foreign_problems(service: str, port: int, neighbours: dict, ours: set[int]) -> list[str]:
    """
    What of the site's own runs where twinbolt's ``service`` would: a unit file
    it did not render under that name, a listener on its ``port`` that is not
    one of the proxy's processes (``ours``: LiteLLM's and its front's).
    """
    found = []
    if neighbours["file"] and not neighbours["ours"]:
        found.append(f"{neighbours['file']} is not twinbolt's (it says nothing of "
                     f"{RENDERED_MARK}): a service of the site's own is named "
                     f"{service}, which twinbolt would overwrite and restart")
    found += [f"port {port} is held by pid {listener['pid']} ({listener['command']}), "
              f"which is not twinbolt's {service}"
              for listener in neighbours["listeners"] if listener["pid"] not in ours]
    return found


def pids(process: dict) -> set[int]:
    """A service's main pid and its children's (:class:`~operations.services.ServiceProcess`)."""
    return {process.get("pid"), *process.get("children", ())} - {None}


BESIDE = ("fix: keep the site's LiteLLM and run twinbolt's proxy beside it, under another name "
          "and ports: set gateway_roles.litellm_service (say \"twinbolt-litellm\"), "
          "litellm_port (say 4001), litellm_backend_port (say 4101) and litellm_config_file "
          "in the site file, and send the "
          "users of small and large there (docs/gateway.md, \"A gateway that runs its own "
          "LiteLLM\")")


@operation(LAYER, is_idempotent=True)
def own(proxy: Proxy | None) -> Iterator[PyinfraCommand]:
    """
    Refuse, before anything changes, a gateway whose proxy name or port is the
    site's own LiteLLM's: twinbolt would overwrite it and restart it.

    + proxy: the gateway's :class:`~operations.gateway.proxy.Proxy`; ``None`` elsewhere (a no-op)

    **Example:**

    .. code:: python

        ownership.own(name="Preflight: the proxy's name and port are twinbolt's", proxy=proxy)
    """
    if elsewhere(proxy, "gateway"):
        return
    front = proxy.front
    ours = set()
    for service in (proxy.service, front.service):
        ours |= pids(host.get_fact(services.ServiceProcess, service=service,
                                   init_system=proxy.init_system))
    # The users' port is the front's (LiteLLM's own, on a gateway of an older
    # twinbolt); LiteLLM's is behind it.
    found = []
    for service, port in ((front.service, proxy.port), (proxy.service, proxy.backend_port)):
        neighbours = host.get_fact(
            ProxyNeighbours, service=service,
            rendered=services.rendered_path(service, proxy.init_system), port=port)
        found += foreign_problems(service, port, neighbours, ours)
    if found:
        refuse(LAYER, [*found, BESIDE])
    host.noop(f"{proxy.service}, {front.service} and ports {proxy.port} and "
              f"{proxy.backend_port} are twinbolt's proxy's, or free")
    yield from ()
