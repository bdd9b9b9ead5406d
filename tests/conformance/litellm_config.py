"""
Real LiteLLM's proxy, loading twinbolt's rendered configs.

Run by ``test_litellm_config.py`` in a subprocess of the lab's venv (the LiteLLM
that ``requirements-litellm.lock`` installs on the gateway), with the proxy
service's own environment, never imported by the tests: the proxy's loader keeps
its state in module globals. For each config file named on the command line it
writes, as one JSON object on stdout, what the loader made of it and what
LiteLLM takes in each section:

- ``loaded``: the router the proxy's own ``ProxyConfig.load_config`` built, in
  the config's shape (``model_list``, ``router_settings``), and the
  ``general_settings`` it kept;
- ``takes``: the ``router_settings`` keys the loader passes to the router (it
  drops any other with a warning), the ``general_settings`` fields LiteLLM
  documents, the key that allows forced-fallback requests, and the retry
  policy's fields.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def load(path: str) -> dict:
    from litellm.proxy.proxy_server import ProxyConfig

    router, _, general_settings = await ProxyConfig().load_config(router=None,
                                                                 config_file_path=path)
    return {
        "model_list": [
            {"model_name": deployment["model_name"],
             "litellm_params": {key: deployment["litellm_params"].get(key)
                                for key in ("model", "api_base")},
             "model_info": {"id": (deployment.get("model_info") or {}).get("id")}}
            for deployment in router.model_list
        ],
        "router_settings": {
            "fallbacks": router.fallbacks,
            "context_window_fallbacks": router.context_window_fallbacks,
            "model_group_retry_policy": {
                group: policy if isinstance(policy, dict) else policy.model_dump(exclude_none=True)
                for group, policy in (router.model_group_retry_policy or {}).items()
            },
        },
        "general_settings": dict(general_settings),
    }


def takes() -> dict:
    import litellm
    from litellm.constants import ROUTER_SETTINGS_MANAGED_OUTSIDE_CONFIG
    from litellm.proxy._types import ConfigGeneralSettings
    from litellm.proxy.route_llm_request import MOCK_TESTING_CONFIG_KEY
    from litellm.types.router import RetryPolicy

    return {
        "router_settings": [key for key in litellm.Router.get_valid_args()
                            if key not in ROUTER_SETTINGS_MANAGED_OUTSIDE_CONFIG],
        "general_settings": list(ConfigGeneralSettings.model_fields),
        "mock_testing_key": MOCK_TESTING_CONFIG_KEY,
        "retry_policy": list(RetryPolicy.model_fields),
    }


async def main(paths: list[str]) -> dict:
    return {"loaded": {path: await load(path) for path in paths}, "takes": takes()}


if __name__ == "__main__":
    out, sys.stdout = sys.stdout, sys.stderr  # the proxy's own banner is not the answer
    json.dump(asyncio.run(main(sys.argv[1:])), out, default=str)
