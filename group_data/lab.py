"""
The embedded lab's settings: what a site file would say, for the lab.

The lab runs services under runit and serves with the SGLang simulator, started
exactly like ``sglang.launch_server`` by the repository's own interpreter; the
alternate large backend is another simulator on the gateway (``lab/hostfs.py``).
"""

from pathlib import Path

serving_model_path = "/var/lib/models/qwen"
serving_served_model_name = "qwen"
serving_python = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python")
serving_sglang_module = "lab.sglang_sim"
serving_user = "root"
serving_init_system = "runit"

gateway_roles_large_api_base = "http://10.66.0.13:31000/v1"
gateway_roles_large_served_model_name = "large"
