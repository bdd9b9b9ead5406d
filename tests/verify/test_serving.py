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
from verify_helpers import fact

from operations.plumbing import keys
from operations.services import Service
from operations.serving.sglang import (
    GPU_SERVICES,
    ROUTER,
    Sglang,
    replica_service,
    service_for,
    tp_environment,
    tp_rank_service,
)
from operations.serving.transport import Connections, connection_problems, connections_of
from operations.site.settings import WorkstationSettings
from operations.states import STATES, State

TOKENS = 24
# NEXTN runs on SGLang's EAGLE worker, and /server_info says so.
REPORTED = {"NEXTN": "EAGLE"}


# Reads, in one SSH round trip per host, each named service's main process from
# /proc: what really runs (argv, the named environment variables, effective user,
# working directory), whatever the rendered files now say. Only the variables the
# checks compare: a service's environment may hold a key, and pytest prints.
SERVICES_SCRIPT = r"""
import json, os, pwd, subprocess, sys
init, wanted, names = sys.argv[1], set(sys.argv[2].split(",")), sys.argv[3:]
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
    with open(f"/proc/{pid}/status") as status_file:
        uid = next(line.split()[2] for line in status_file if line.startswith("Uid:"))
    try:
        user = pwd.getpwuid(int(uid)).pw_name
    except KeyError:
        user = f"uid {uid}"
    found[name] = {"pid": int(pid), "argv": read("cmdline"),
                   "environment": {key: value for key, _, value in
                                   (entry.partition("=") for entry in read("environ"))
                                   if key in wanted},
                   "user": user, "cwd": os.readlink(f"/proc/{pid}/cwd")}
print(json.dumps(found))
"""

# Reads every process holding GPU memory (as nvidia-smi lists them) with its
# ancestry from /proc, so a holder can be traced to the service that started it.
GPU_SCRIPT = r"""
import json, subprocess
def parent(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    return 0
def number(text):
    try:
        return int(text.strip())
    except ValueError:
        return 0
gpus = subprocess.run(["nvidia-smi", "--query-gpu=index,name",
                       "--format=csv,noheader,nounits"], capture_output=True, text=True)
apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                       "--format=csv,noheader,nounits"], capture_output=True, text=True)
holders = []
for line in apps.stdout.splitlines():
    pid, used = line.split(",")[:2]
    lineage = [int(pid)]
    try:
        while (up := parent(lineage[-1])) > 0:
            lineage.append(up)
    except OSError:
        pass
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        command = ""
    holders.append({"pid": int(pid), "used_mib": number(used), "lineage": lineage,
                    "command": command.strip()})
print(json.dumps({"gpus": gpus.stdout.splitlines(), "error": (gpus.stderr + apps.stderr).strip(),
                  "holders": holders}))
"""
# Options every server declares only when the site sets them: (flag, data key).
OPTIONAL_FLAGS = (("--quantization", "quantization"),
                  ("--context-length", "context_length"),
                  ("--mem-fraction-static", "mem_fraction_static"))


def processes(inventory_host, init_system: str, variables: set[str],
              *names: str) -> dict[str, dict | None]:
    """Each named service's running process (pid, argv, the ``variables`` of its
    environment), or None."""
    result = inventory_host.host.run(
        " ".join(shlex.quote(word) for word in
                 ("python3", "-c", SERVICES_SCRIPT, init_system, ",".join(sorted(variables)),
                  *names)))
    assert result.rc == 0, f"{inventory_host.name}: cannot read services: {result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def servers(workstation) -> dict[str, dict | None]:
    """This workstation's SGLang services, read once for the module's checks."""
    sglang = Sglang.from_host(workstation)
    variables = {*replica_service(sglang).environment,
                 *tp_environment(sglang.interface, sglang.link_address),
                 *(name for state in STATES.values()
                   for name in tp_rank_service(sglang, state.speculative).environment)}
    return processes(workstation, sglang.init_system, variables,
                     *GPU_SERVICES)


@pytest.fixture(scope="module")
def declared(workstation, state: State) -> Service:
    """The server this workstation runs in ``state``, built as the deploy builds it."""
    sglang = Sglang.from_host(workstation)
    if state.tensor_parallel:
        return tp_rank_service(sglang, state.speculative)
    return replica_service(sglang)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def completion_problem(base_url: str, model: str, headers: dict[str, str]) -> str | None:
    """
    Why ``base_url`` does not serve a real completion of TOKENS tokens, asked
    with the servers' key (``headers``); None if it does.
    """
    try:
        response = httpx.post(f"{base_url}/v1/chat/completions", timeout=30, headers=headers,
                              json=completion_body(model))
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
    rank = workstation.settings.rank
    wanted = service_for(state.serving, rank)
    running = {name for name, server in servers.items() if server is not None}
    assert running == {wanted}, (
        f"{workstation.name}: {state.name} runs {wanted} here and nothing else, but running "
        f"are: {', '.join(sorted(running)) or 'none'}; converge with: "
        f"pyinfra inventory.py deploy.py --data state={state.name}")


def test_the_server_runs_with_the_declared_arguments(workstation, workstations, servers,
                                                     state: State) -> None:
    settings = workstation.settings
    rank = settings.rank
    name = service_for(state.serving, rank)
    server = servers[name]
    assert server is not None, f"{workstation.name}: {name} does not run"
    argv = server["argv"]
    serving = settings.serving
    assert argv[:3] == [serving.python, "-m", serving.sglang_module], (
        f"{workstation.name}: {name} runs {' '.join(argv[:3])}, not "
        f"{serving.python} -m {serving.sglang_module}")
    assert flag(argv, "--model-path") == serving.model_path
    assert flag(argv, "--served-model-name") == serving.served_model_name
    assert flag(argv, "--port") == str(serving.port)
    assert "--enable-cache-report" in argv and "--enable-metrics" in argv
    for option, key in OPTIONAL_FLAGS:
        value = getattr(serving, key)
        wanted = str(value) if value else None
        assert flag(argv, option) == wanted, (
            f"{workstation.name}: {name} has {option} {flag(argv, option)}; serving_{key} is "
            f"{value!r}")
    if not state.tensor_parallel:
        assert flag(argv, "--tp-size") in (None, "1"), f"{workstation.name}: {argv}"
        assert not any(word.startswith("--speculative") for word in argv)
        return
    # One rank a workstation of the inventory, each its own node; rank 0 listed first.
    rank0_link = workstations[0].settings.link_address
    group = str(len(workstations))
    assert (flag(argv, "--tp-size"), flag(argv, "--nnodes"), flag(argv, "--node-rank")) == (
        group, group, str(rank)), f"{workstation.name}: {' '.join(argv)}"
    assert flag(argv, "--dist-init-addr") == (
        f"{rank0_link}:{serving.dist_init_port}")
    speculative = {word: flag(argv, word) for word in argv if word.startswith("--speculative")}
    if state.speculative is None:
        assert speculative == {}, f"{workstation.name}: {state.name} has no speculation: {argv}"
    else:
        assert speculative.get("--speculative-algorithm") == state.speculative.algorithm
        assert speculative.get("--speculative-num-steps") == str(state.speculative.num_steps)
        assert speculative.get("--speculative-eagle-topk") == str(state.speculative.eagle_topk)
        assert speculative.get("--speculative-num-draft-tokens") == str(
            state.speculative.num_draft_tokens)
        assert speculative.get("--speculative-draft-model-path") == (
            serving.draft_model_path or None), f"{workstation.name}: {' '.join(argv)}"


def test_the_server_runs_exactly_the_service_the_deploy_renders(workstation, servers,
                                                                declared: Service) -> None:
    """
    The whole argv, the environment, the user and the working directory, compared
    with the service the deploy builds (operations/serving/sglang.py) for this host and
    state: a flag this module does not name is caught too.
    """
    server = servers[declared.name]
    assert server is not None, f"{workstation.name}: {declared.name} does not run"
    where = f"{workstation.name}: {declared.name} (pid {server['pid']})"
    assert server["argv"] == declared.command, (
        f"{where} runs\n  {shlex.join(server['argv'])}\nbut the deploy declares\n  "
        f"{shlex.join(declared.command)}")
    environment = {key: server["environment"].get(key) for key in declared.environment}
    assert environment == declared.environment, f"{where} has {environment}"
    assert server["user"] == declared.user == workstation.settings.serving.user, (
        f"{where} runs as {server['user']}, not {declared.user}")
    directory = workstation.host.check_output(
        f"realpath -m -- {shlex.quote(declared.working_directory)}")
    assert server["cwd"] == directory, (
        f"{where} runs in {server['cwd']}, not {declared.working_directory}")


def test_only_the_declared_server_holds_the_gpu(workstation, servers, declared: Service) -> None:
    """
    Every process holding GPU memory descends from the main process of the server
    the state declares here (SGLang's scheduler and workers are its children), and
    that server holds some: no other twinbolt server, no leftover child, and no
    stranger beyond what ``serving.foreign_gpu_memory_mib`` allows (as the preflight).
    """
    result = workstation.host.run(
        " ".join(shlex.quote(word) for word in ("python3", "-c", GPU_SCRIPT)))
    assert result.rc == 0, f"{workstation.name}: cannot read the GPU: {result.stderr}"
    gpu = json.loads(result.stdout)
    assert gpu["gpus"], f"{workstation.name}: nvidia-smi lists no GPU: {gpu['error']}"
    own = {name: server["pid"] for name, server in servers.items() if server is not None}

    def owner(holder: dict) -> str | None:
        return next((name for name, pid in own.items() if pid in holder["lineage"]), None)

    def described(holders: list[dict]) -> str:
        return "; ".join(f"pid {h['pid']} ({h['command'] or 'command unknown'}) holds "
                         f"{h['used_mib']} MiB, ancestry {h['lineage']}" for h in holders)

    holders = gpu["holders"]
    others = [h for h in holders if owner(h) not in (declared.name, None)]
    assert others == [], f"{workstation.name}: other twinbolt servers hold the GPU: " + (
        described(others))
    strangers = [h for h in holders if owner(h) is None]
    allowed = workstation.settings.serving.foreign_gpu_memory_mib or 0
    assert sum(h["used_mib"] for h in strangers) <= allowed, (
        f"{workstation.name}: processes twinbolt did not start hold GPU memory beyond the "
        f"{allowed} MiB serving.foreign_gpu_memory_mib allows: {described(strangers)}")
    assert any(owner(h) == declared.name for h in holders), (
        f"{workstation.name}: {declared.name} (pid {own.get(declared.name)}) holds no GPU "
        f"memory; the GPU's holders: {described(holders) or 'none'}")


def test_tp_ranks_talk_over_the_thunderbolt_link_only(workstation, servers,
                                                      state: State) -> None:
    """Every socket of the group pinned to the link, and its connections really on it."""
    if not state.tensor_parallel:
        pytest.skip(f"{state.name} runs no TP group")
    sglang = Sglang.from_host(workstation)
    server = servers[sglang.tp_rank_name]
    assert server is not None, f"{workstation.name}: {sglang.tp_rank_name} does not run"
    pins = tp_environment(sglang.interface, sglang.link_address)
    pinned = {key: server["environment"].get(key) for key in pins}
    rank = f"{workstation.name}: rank {sglang.rank} (pid {server['pid']})"
    assert pinned == pins, f"{rank} has {pinned}"
    reading = fact(workstation, Connections)
    connections = connections_of(reading, server["pid"])
    assert connection_problems(connections, reading["addresses"], sglang.link_address,
                               sglang.peer_link_address, sglang.port, sglang.interface) == [], rank


def completion_body(model: str) -> dict[str, object]:
    return {"model": model, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "twinbolt verify: one sentence, please"}]}


def key_headers(settings: WorkstationSettings, admin: bool = False) -> dict[str, str]:
    """The servers' key (or their admin key) as the harness shows it."""
    return keys.bearer(settings.serving.admin_api_key_file if admin
                       else settings.serving.api_key_file)


# What a caller without a key tries on an SGLang server: a completion, its
# settings, and two admin endpoints (an empty cache slows every user; a profile
# fills the disk). Each refused 401 by SGLang (utils/auth.py).
SERVER_CALLS = (("POST", "/v1/chat/completions"), ("GET", "/server_info"),
                ("POST", "/flush_cache"), ("POST", "/start_profile"))


def test_each_sglang_server_refuses_a_caller_without_its_key(workstations, gateway,
                                                             state: State,
                                                             fronted: list[str]) -> None:
    """
    From outside: every server clients reach, and the router in front of them,
    refuses a request without the key (and a wrong one); the admin endpoints
    refuse the ordinary key too. The servers answer with it (the completions
    test, and ``/server_info`` here).
    """
    settings = [workstation.settings for workstation in workstations]
    model = settings[0].serving.served_model_name
    servers = [settings[0].server_url] if state.tensor_parallel else [
        each.server_url for each in settings]
    wrong = {"Authorization": "Bearer sk-not-the-key-0000000000"}
    found = []
    for url in servers:
        for method, path in SERVER_CALLS:
            asked = [("no key", {}), ("a wrong key", wrong)]
            if path in ("/flush_cache", "/start_profile"):
                asked.append(("the ordinary key", key_headers(settings[0])))
            for what, headers in asked:
                answer = httpx.request(method, f"{url}{path}", headers=headers, timeout=10,
                                       json=completion_body(model) if "chat" in path else None)
                if answer.status_code != 401:
                    found.append(f"{url}{path} answered {method} with {what}: "
                                 f"HTTP {answer.status_code} {answer.text[:120]}")
        info = httpx.get(f"{url}/server_info", headers=key_headers(settings[0]), timeout=10)
        if info.status_code != 200:
            found.append(f"{url}/server_info refused its key: HTTP {info.status_code}")
    if fronted or not state.tensor_parallel:
        router = gateway.settings.router_url
        answer = httpx.post(f"{router}/v1/chat/completions", json=completion_body(model),
                            timeout=10)
        if answer.status_code != 401:
            found.append(f"{router} answered a completion without the key: "
                         f"HTTP {answer.status_code}")
    assert found == [], "; ".join(found)


def test_clients_servers_answer_real_completions(workstations, gateway, state: State,
                                                 fronted: list[str]) -> None:
    settings = [workstation.settings for workstation in workstations]
    model = settings[0].serving.served_model_name
    if not state.tensor_parallel:
        # Each replica directly, then the route clients use.
        targets = [each.server_url for each in settings]
        targets.append(gateway.settings.router_url)
    else:
        # Rank 0 only: rank 1 serves nothing but a dummy /health; and the router,
        # while it fronts other pairs' replicas.
        targets = [settings[0].server_url, *([gateway.settings.router_url]
                                             if fronted else [])]
    headers = key_headers(settings[0])
    problems = [problem for target in targets
                if (problem := completion_problem(target, model, headers)) is not None]
    assert problems == [], "; ".join(problems)


def test_the_router_is_ready_only_in_front_of_replicas(gateway, workstations, state: State,
                                                      fronted: list[str],
                                                      outside: list[str]) -> None:
    router = processes(gateway, gateway.settings.roles.init_system, set(),
                       ROUTER)[ROUTER]
    replicas = [workstation.settings.server_url for workstation in workstations]
    if state.tensor_parallel:
        # It would count rank 1's dummy /health as a healthy worker.
        assert not set(fronted) & set(replicas), (
            f"{gateway.name}: sglang-router fronts {', '.join(fronted)} while "
            f"{', '.join(replicas)} run a TP group")
        if router is None:
            return
        assert set(fronted) <= set(outside), (
            f"{gateway.name}: sglang-router (pid {router['pid']}) runs while the replicas are "
            f"down, fronting {', '.join(fronted) or 'nothing'}")
    else:
        assert router is not None, f"{gateway.name}: sglang-router does not run"
        assert set(replicas) <= set(fronted), (
            f"{gateway.name}: sglang-router fronts {', '.join(fronted)}, not every replica "
            f"of {', '.join(replicas)}")
    # Its /health always says OK; /readiness needs a healthy worker.
    readiness = httpx.get(f"{gateway.settings.router_url}/readiness", timeout=10)
    assert readiness.status_code == 200, f"{gateway.name}: /readiness: {readiness.text}"


# What a caller without the key tries: list the workers, add one of its own (which
# would receive users' prompts), remove one (192.0.2.1 is TEST-NET-1: nowhere).
WORKER_API_CALLS = (("GET", "/workers", None),
                    ("POST", "/workers", {"url": "http://192.0.2.1:30000"}),
                    ("DELETE", "/workers/00000000-0000-0000-0000-000000000000", None))


def test_the_routers_worker_api_refuses_a_caller_without_its_key(gateway) -> None:
    """
    From outside, in every state: a running router answers its worker API 401
    without the key (the ``fronted`` fixture reads it with the key, on the
    gateway); a stopped one takes no connection at all.
    """
    settings = gateway.settings
    running = processes(gateway, settings.roles.init_system, set(), ROUTER)[ROUTER] is not None
    for method, path, body in WORKER_API_CALLS:
        try:
            answer = httpx.request(method, f"{settings.router_url}{path}", json=body, timeout=10)
        except httpx.ConnectError as error:
            assert not running, f"{gateway.name}: the running router refused {method} {path}: " \
                                f"{error}"
            continue
        assert answer.status_code == 401, (
            f"{gateway.name}: sglang-router answered {method} {path} without its key "
            f"{answer.status_code}: {answer.text[:200]}")


def test_rank0_reports_the_declared_parallelism_and_speculation(workstations,
                                                                state: State) -> None:
    if not state.tensor_parallel:
        pytest.skip(f"{state.name} runs no TP group")
    settings = workstations[0].settings
    info = httpx.get(f"{settings.server_url}/server_info", headers=key_headers(settings),
                     timeout=10).json()
    assert info["tp_size"] == len(workstations)
    if state.speculative is None:
        assert info.get("speculative_algorithm") is None
    else:
        expected = REPORTED.get(state.speculative.algorithm, state.speculative.algorithm)
        assert (info["speculative_algorithm"], info["speculative_num_steps"],
                info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
            expected, state.speculative.num_steps, state.speculative.eagle_topk,
            state.speculative.num_draft_tokens)
