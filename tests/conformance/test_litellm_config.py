"""
Every LiteLLM config twinbolt renders, loaded by the real LiteLLM proxy's own
loader (``litellm_config.py``): production's, and the one with the temporary
fallback that the experiment states add. The proxy drops a ``router_settings``
key it does not know with a warning, and ignores an unknown ``general_settings``
key: here either fails, as does a config the loader refuses or reads otherwise
than twinbolt compares the live proxy with (:func:`operations.gateway.proxy.routing`).

The loader runs with the proxy service's own environment (offline copies of
LiteLLM's remote data, the secrets as variables) and, as root, in a network
namespace of its own: loading a config needs no network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conformance_helpers import REPO, Rendered

from operations.gateway.proxy import proxy_service, render_config, routing
from operations.states import STATES

LOADER = Path(__file__).with_name("litellm_config.py")
# What the proxy's secrets (the master key, the large backend's key) hold here.
SECRET = "sk-conformance-" + "0" * 48


def load(rendered: Rendered, paths: list[Path]) -> dict:
    """What LiteLLM's proxy makes of each config (``litellm_config.py``'s answer)."""
    environment = {
        **os.environ,
        **proxy_service(rendered.proxy).environment,
        **{name: SECRET for name, _ in rendered.proxy.secret_files},
    }
    offline = ["unshare", "--net"] if os.geteuid() == 0 and shutil.which("unshare") else []
    run = subprocess.run([*offline, sys.executable, str(LOADER), *map(str, paths)],
                         env=environment, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"LiteLLM's proxy refused a config:\n{run.stderr[-4000:]}"
    return json.loads(run.stdout)


def test_every_rendered_config_loads_in_litellm_as_rendered(rendered: Rendered,
                                                            tmp_path: Path) -> None:
    configs = {}
    for fallback in sorted({state.gateway_fallback for state in STATES.values()}):
        path = tmp_path / ("with-fallback.yaml" if fallback else "production.yaml")
        path.write_text(render_config(rendered.proxy, fallback))
        configs[path] = yaml.safe_load(path.read_text())
    answer = load(rendered, list(configs))
    takes = answer["takes"]
    for path, config in configs.items():
        loaded = answer["loaded"][str(path)]
        router_settings = config["router_settings"]
        assert set(router_settings) <= set(takes["router_settings"]), path.name
        assert set(config["general_settings"]) <= {*takes["general_settings"],
                                                   takes["mock_testing_key"]}, path.name
        # What the config says, the master key read from the service's environment.
        assert loaded["general_settings"] == {
            **config["general_settings"],
            "master_key": SECRET,
        }, path.name
        assert routing(loaded) == routing(config), path.name
        policies = router_settings.get("model_group_retry_policy", {})
        assert all(set(policy) <= set(takes["retry_policy"]) for policy in policies.values())
        assert loaded["router_settings"]["model_group_retry_policy"] == policies, path.name

