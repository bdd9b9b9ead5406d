"""The serving layer: which SGLang servers run where, with what, and that the ones
clients use serve real completions.

A running process is not a served request and rank 1's ``/health`` is a dummy, so
every "it works" here is a chat completion of the requested length, asked over
the network from this machine; rank 1 is only ever inspected, never asked.
"""

from __future__ import annotations

import json
import shlex

import httpx
import pytest

from operations.states import State

REPLICA = "sglang-replica"
TP_RANKS = ("sglang-tp2-rank0", "sglang-tp2-rank1")
ROUTER = "sglang-router"
TOKENS = 24
# NEXTN runs on SGLang's EAGLE worker, and /server_info says so.
REPORTED = {"NEXTN": "EAGLE"}


# Reads, in one SSH round trip per host, each named service's main process from
# /proc: what really runs, whatever the rendered files now say.
SERVICES_SCRIPT = r"""
import json, subprocess, sys
init, names = sys.argv[1], sys.argv[2:]
found = {}
for name in names:
    if init == "runit":
        status = subprocess.run(["sv", "status", f"/etc/service/{name}"],
                                capture_output=True, text=True).stdout
        pid = status.split("(pid ")[1].split(")")[0] if status.startswith("run: ") else ""
    else:
        pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value",
                              f"{name}.service"], capture_output=True, text=True).stdout.strip()
    if not pid or pid == "0":
        found[name] = None
        continue
    def read(what):
        with open(f"/proc/{pid}/{what}", "rb") as file:
            return [word.decode() for word in file.read().split(b"\0") if word]
    found[name] = {"pid": int(pid), "argv": read("cmdline"),
                   "environment": dict(entry.split("=", 1) for entry in read("environ")
                                       if "=" in entry)}
print(json.dumps(found))
"""


def processes(inventory_host, init_system: str, *names: str) -> dict[str, dict | None]:
    """Each named service's running process (pid, argv, environment), or None."""
    result = inventory_host.host.run(
        " ".join(shlex.quote(word) for word in
                 ("python3", "-c", SERVICES_SCRIPT, init_system, *names)))
    assert result.rc == 0, f"{inventory_host.name}: cannot read services: {result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def servers(workstation) -> dict[str, dict | None]:
    """This workstation's SGLang services, read once for the module's checks."""
    return processes(workstation, workstation.data["serving_init_system"], REPLICA, *TP_RANKS)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def url(inventory_host, port_key: str) -> str:
    return f"http://{inventory_host.data['ssh_hostname']}:{inventory_host.data[port_key]}"


def completion_problem(base_url: str, model: str) -> str | None:
    """Why ``base_url`` does not serve a real completion of TOKENS tokens; None if it does."""
    try:
        response = httpx.post(f"{base_url}/v1/chat/completions", timeout=30, json={
            "model": model, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "twinbolt verify: one sentence, please"}],
        })
    except httpx.HTTPError as error:
        return f"{base_url}: no answer: {type(error).__name__}: {error}"
    if response.status_code != 200:
        return f"{base_url}: HTTP {response.status_code} {response.text[:300]}"
    body = response.json()
    content = body["choices"][0]["message"]["content"]
    tokens = body["usage"]["completion_tokens"]
    if not content.strip() or tokens != TOKENS:
        return f"{base_url}: {tokens} tokens ({content!r}), {TOKENS} were asked for"
    return None


def test_the_declared_sglang_servers_run_and_no_others(workstation, servers,
                                                       state: State) -> None:
    rank = workstation.data["rank"]
    wanted = REPLICA if state.serving == "replicas" else TP_RANKS[rank]
    running = {name for name, server in servers.items() if server is not None}
    assert running == {wanted}, (
        f"{workstation.name}: {state.name} runs {wanted} here and nothing else, but running "
        f"are: {', '.join(sorted(running)) or 'none'}; converge with: "
        f"pyinfra inventory.py deploy.py --data state={state.name}")


def test_the_server_runs_with_the_declared_arguments(workstation, servers,
                                                     state: State) -> None:
    rank = workstation.data["rank"]
    name = REPLICA if state.serving == "replicas" else TP_RANKS[rank]
    server = servers[name]
    assert server is not None, f"{workstation.name}: {name} does not run"
    argv = server["argv"]
    assert flag(argv, "--model-path") == workstation.data["serving_model_path"]
    assert flag(argv, "--port") == str(workstation.data["serving_port"])
    assert "--enable-cache-report" in argv and "--enable-metrics" in argv
    if state.serving == "replicas":
        assert flag(argv, "--tp-size") in (None, "1"), f"{workstation.name}: {argv}"
        assert not any(word.startswith("--speculative") for word in argv)
        return
    rank0_link = (workstation.data["thunderbolt_address"] if rank == 0
                  else workstation.data["peer_thunderbolt_address"])
    assert (flag(argv, "--tp-size"), flag(argv, "--nnodes"), flag(argv, "--node-rank")) == (
        "2", "2", str(rank)), f"{workstation.name}: {' '.join(argv)}"
    assert flag(argv, "--dist-init-addr") == (
        f"{rank0_link}:{workstation.data['serving_dist_init_port']}")
    speculative = {word: flag(argv, word) for word in argv if word.startswith("--speculative")}
    if state.speculative is None:
        assert speculative == {}, f"{workstation.name}: {state.name} has no speculation: {argv}"
    else:
        assert speculative.get("--speculative-algorithm") == state.speculative.algorithm
        assert speculative.get("--speculative-num-steps") == str(state.speculative.num_steps)
        assert speculative.get("--speculative-eagle-topk") == str(state.speculative.eagle_topk)
        assert speculative.get("--speculative-num-draft-tokens") == str(
            state.speculative.num_draft_tokens)


def test_tp_ranks_talk_over_the_thunderbolt_link_only(workstation, servers,
                                                      state: State) -> None:
    if state.serving != "tp2":
        pytest.skip(f"{state.name} runs no TP group")
    interface = workstation.data["link_interface"]
    rank = workstation.data["rank"]
    server = servers[TP_RANKS[rank]]
    assert server is not None, f"{workstation.name}: {TP_RANKS[rank]} does not run"
    environment = server["environment"]
    pinned = {key: environment.get(key) for key in
              ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET")}
    assert pinned == {"NCCL_SOCKET_IFNAME": f"={interface}", "GLOO_SOCKET_IFNAME": interface,
                      "NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"}, (
        f"{workstation.name}: rank {rank} (pid {server['pid']}) has {pinned}")


def test_clients_servers_answer_real_completions(workstations, gateway, state: State) -> None:
    model = workstations[0].data["serving_served_model_name"]
    if state.serving == "replicas":
        # Each replica directly, then the route clients use.
        targets = [url(workstation, "serving_port") for workstation in workstations]
        targets.append(url(gateway, "gateway_roles_router_port"))
    else:
        # Rank 0 only: rank 1 serves nothing but a dummy /health.
        targets = [url(workstations[0], "serving_port")]
    problems = [problem for target in targets
                if (problem := completion_problem(target, model)) is not None]
    assert problems == [], "; ".join(problems)


def test_the_router_is_ready_only_in_front_of_replicas(gateway, state: State) -> None:
    router = processes(gateway, gateway.data["gateway_roles_init_system"], ROUTER)[ROUTER]
    if state.serving != "replicas":
        assert router is None, (
            f"{gateway.name}: sglang-router (pid {router['pid']}) runs while the replicas are "
            "down; "
            "it would count rank 1's dummy /health as a healthy worker")
        return
    assert router is not None, f"{gateway.name}: sglang-router does not run"
    # Its /health always says OK; /readiness needs a healthy worker.
    readiness = httpx.get(f"{url(gateway, 'gateway_roles_router_port')}/readiness", timeout=10)
    assert readiness.status_code == 200, f"{gateway.name}: /readiness: {readiness.text}"


def test_rank0_reports_the_declared_parallelism_and_speculation(workstations,
                                                                state: State) -> None:
    if state.serving != "tp2":
        pytest.skip(f"{state.name} runs no TP group")
    info = httpx.get(f"{url(workstations[0], 'serving_port')}/server_info", timeout=10).json()
    assert info["tp_size"] == 2
    if state.speculative is None:
        assert info.get("speculative_algorithm") is None
    else:
        expected = REPORTED.get(state.speculative.algorithm, state.speculative.algorithm)
        assert (info["speculative_algorithm"], info["speculative_num_steps"],
                info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
            expected, state.speculative.num_steps, state.speculative.eagle_topk,
            state.speculative.num_draft_tokens)
