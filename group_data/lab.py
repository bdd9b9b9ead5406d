"""
The embedded lab's settings: what a site file would say, for the lab.

The lab's hosts boot systemd, as a site's Ubuntu hosts do, unless ``python -m
lab up --init runit`` chose runit; the lab records which in its state
directory, and services run under that. They serve with the SGLang simulator, started
exactly like ``sglang.launch_server`` by the repository's own interpreter; the
alternate large backend is another simulator on the gateway (``lab/hostfs.py``).
"""

import os
from pathlib import Path

_LAB = Path(os.environ.get("TWINBOLT_LAB_STATE", Path(__file__).resolve().parents[1] / ".lab"))
_INIT_SYSTEM = (_LAB / "init").read_text().strip() if (_LAB / "init").exists() else "systemd"

serving_model_path = "/var/lib/models/qwen"
serving_served_model_name = "qwen"
serving_python = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python")
serving_sglang_module = "lab.sglang_sim"
serving_user = "root"
serving_init_system = _INIT_SYSTEM
# `python -m lab.sglang_sim` finds the simulator from the checkout.
serving_working_directory = str(Path(__file__).resolve().parents[1])
# The simulator loads in seconds; a lab start that takes a minute has failed.
serving_start_timeout_seconds = 60
# A lab host's /etc is the machine's own: the keys' file is in its private /var/lib.
serving_keys_file = "/var/lib/twinbolt/sglang_keys.yaml"

gateway_roles_init_system = _INIT_SYSTEM
# The gateway makes its own venvs, in its private /var/lib, from the locks, as a
# real gateway does; pip finds the distributions in the wheelhouse `make setup`
# downloaded once, so a converge sends nothing to a package registry.
gateway_roles_router_venv = "/var/lib/twinbolt/venvs/sglang-router"
gateway_roles_router_user = "root"
gateway_roles_router_key_file = "/var/lib/twinbolt/router_control_key"
gateway_roles_router_worker_key_file = "/var/lib/twinbolt/router_worker_key"
gateway_roles_litellm_small_key_file = "/var/lib/twinbolt/litellm_small_key"
gateway_roles_pip_options = ["--no-index", "--find-links",
                             str(Path(__file__).resolve().parents[1] / "wheelhouse")]

gateway_roles_large_api_base = "http://10.66.0.13:31000/v1"
gateway_roles_large_served_model_name = "large"
# A lab host's /etc is the machine's own (only /etc/sv and /etc/service are
# private to it), so the gateway keeps its files in its private /var/lib.
gateway_roles_master_key_file = "/var/lib/twinbolt/litellm_master_key"
gateway_roles_litellm_config_file = "/var/lib/twinbolt/litellm.yaml"
gateway_roles_litellm_venv = "/var/lib/twinbolt/venvs/litellm"
gateway_roles_litellm_user = "root"
