"""The TP group's transport: where its connections run and what the link carried."""

import json
import subprocess
from pathlib import Path

from operations.plumbing.facts import raw_command
from operations.serving.transport import (
    WEIGHTS_MARKER,
    Connections,
    ModelShape,
    connection_problems,
    connections_of,
    endpoint,
    one_way_bytes,
    volume_problems,
)

# ps, ss -tnpH state established and ip -o addr show, as a workstation in tp2
# prints them: rank 0's service (4242) runs its scheduler (4250), which holds NCCL's
# and the store's sockets.
OUTPUT = """\
    1     0
 4242     1
 4250  4242
  900     1
@@
0 0 169.254.77.1%thunderbolt0:5757 169.254.77.2:40112 users:(("python",pid=4250,fd=7))
0 0 [::ffff:169.254.77.1]:41000 [::ffff:169.254.77.2]:38000 users:(("python",pid=4250,fd=9))
0 0 10.66.0.11:30000 10.66.0.1:51234 users:(("python",pid=4242,fd=12))
0 0 127.0.0.1:35000 127.0.0.1:35001 users:(("python",pid=4250,fd=3))
0 0 10.66.0.11:22 10.66.0.1:50000 users:(("sshd",pid=900,fd=4))
@@
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host noprefixroute \\       valid_lft forever preferred_lft forever
2: eth0    inet 10.66.0.11/24 brd 10.66.0.255 scope global eth0\\       valid_lft forever
3: thunderbolt0    inet 169.254.77.1/16 scope link thunderbolt0\\       valid_lft forever
3: thunderbolt0    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever
""".splitlines()
ADDRESSES = ["127.0.0.1", "::1", "10.66.0.11", "169.254.77.1", "fe80::1"]
RANK0 = {"addresses": ADDRESSES, "address": "169.254.77.1", "peer_address": "169.254.77.2",
         "http_port": 30000, "interface": "thunderbolt0"}
SHAPE = {"layers": 64, "hidden_size": 5120, "activation_bytes": 2}


def test_ss_addresses_lose_their_device_brackets_and_v4_mapping() -> None:
    assert endpoint("169.254.77.1%thunderbolt0:5757") == ("169.254.77.1", 5757)
    assert endpoint("[::ffff:169.254.77.2]:38000") == ("169.254.77.2", 38000)
    assert endpoint("[fe80::1]:22") == ("fe80::1", 22)


def test_a_services_connections_are_those_of_its_whole_process_tree() -> None:
    reading = Connections().process(OUTPUT)
    held = connections_of(reading, 4242)
    assert [connection["local"] for connection in held] == [
        "169.254.77.1%thunderbolt0:5757", "[::ffff:169.254.77.1]:41000", "10.66.0.11:30000",
        "127.0.0.1:35000"]
    assert reading["addresses"] == ADDRESSES
    assert Connections().process([]) == Connections().default()


def test_a_group_on_the_link_passes_http_clients_and_loopback_aside() -> None:
    held = connections_of(Connections().process(OUTPUT), 4242)
    assert connection_problems(held, **RANK0) == []


def test_a_connection_from_the_link_address_to_another_peer_address_is_off_the_link() -> None:
    # From this host's link address, but to the peer's management address: it left
    # by another route, so it counts against the group, not for it.
    stray = [*OUTPUT[:7],
             '0 0 169.254.77.1:41002 10.66.0.12:38000 users:(("python",pid=4250,fd=11))',
             *OUTPUT[7:]]
    [problem] = connection_problems(connections_of(Connections().process(stray), 4242), **RANK0)
    assert problem.startswith(
        "the TP group's transport is not thunderbolt0: its connections "
        "169.254.77.1:41002 -> 10.66.0.12:38000 run outside 169.254.77.1 <-> 169.254.77.2")


def test_a_connection_off_the_link_names_the_transport_and_the_variables() -> None:
    wrong = [*OUTPUT[:5],
             '0 0 10.66.0.11%eth0:41000 10.66.0.12:38000 users:(("python",pid=4250,fd=9))',
             *OUTPUT[10:]]
    found = connection_problems(connections_of(Connections().process(wrong), 4242), **RANK0)
    assert len(found) == 2
    assert found[0].startswith("the TP group's transport is not thunderbolt0: its connections "
                               "10.66.0.11:41000 -> 10.66.0.12:38000 run outside "
                               "169.254.77.1 <-> 169.254.77.2")
    assert "NCCL_SOCKET_IFNAME" in found[0] and "SGLANG_HOST_IP" in found[0]
    assert found[1] == ("the TP group has no connection between 169.254.77.1 and "
                        "169.254.77.2 on thunderbolt0")


# A real group's sockets (torch 2.14.1's c10d store and gloo, NCCL's Socket
# transport), store at --dist-init-addr 169.254.77.1:5000. Rank 0's scheduler
# (4250, a child of the server's process 4242) hosts the store and is its client
# too, so both ends of that connection are its own; NCCL's bootstrap ring and
# its data sockets run to the peer; each rank reaches its own proxy thread from
# its own address. An HTTP client asks rank 0 on the LAN.
STORE_SELF = [
    '0 0 169.254.77.1:5000 169.254.77.1:42848 users:(("python",pid=4250,fd=21))',
    '0 0 169.254.77.1:42848 169.254.77.1:5000 users:(("python",pid=4250,fd=20))',
]
PROXY_RANK0 = [
    '0 0 169.254.77.1:43311 169.254.77.1:39157 users:(("python",pid=4250,fd=40))',
    '0 0 169.254.77.1:39157 169.254.77.1:43311 users:(("python",pid=4250,fd=41))',
]
CROSS_RANK0 = [
    '0 0 169.254.77.1:5000 169.254.77.2:51022 users:(("python",pid=4250,fd=22))',
    '0 0 169.254.77.1:45120 169.254.77.2:36801 users:(("python",pid=4250,fd=30))',
    '0 0 169.254.77.1:36022 169.254.77.2:45233 users:(("python",pid=4250,fd=31))',
    '0 0 169.254.77.1:47000 169.254.77.2:55310 users:(("python",pid=4250,fd=50))',
    '0 0 169.254.77.1:47000 169.254.77.2:55312 users:(("python",pid=4250,fd=51))',
]
HTTP_CLIENT = ['0 0 10.66.0.11:30000 10.66.0.1:51234 users:(("python",pid=4242,fd=12))']
STRAY = '0 0 10.66.0.11%eth0:41000 10.66.0.12:38000 users:(("python",pid=4250,fd=60))'
RANK1_ADDRESSES = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 10.66.0.12/24 brd 10.66.0.255 scope global eth0\\       valid_lft forever
3: thunderbolt0    inet 169.254.77.2/16 scope link thunderbolt0\\       valid_lft forever
""".splitlines()
# Rank 1 (5250, under 5242) joins the store across the link and has its own proxy.
RANK1 = [
    '0 0 169.254.77.2:51022 169.254.77.1:5000 users:(("python",pid=5250,fd=20))',
    '0 0 169.254.77.2:36801 169.254.77.1:45120 users:(("python",pid=5250,fd=30))',
    '0 0 169.254.77.2:45233 169.254.77.1:36022 users:(("python",pid=5250,fd=31))',
    '0 0 169.254.77.2:55310 169.254.77.1:47000 users:(("python",pid=5250,fd=50))',
    '0 0 169.254.77.2:55312 169.254.77.1:47000 users:(("python",pid=5250,fd=51))',
    '0 0 169.254.77.2:40811 169.254.77.2:35533 users:(("python",pid=5250,fd=40))',
    '0 0 169.254.77.2:35533 169.254.77.2:40811 users:(("python",pid=5250,fd=41))',
]
RANK1_ARGS = {"address": "169.254.77.2", "peer_address": "169.254.77.1", "http_port": 30000,
              "interface": "thunderbolt0"}


def rank0_reading(*sockets: str) -> dict:
    return Connections().process([*OUTPUT[:5], *sockets, *OUTPUT[10:]])


def rank0_problems(*sockets: str) -> list[str]:
    reading = rank0_reading(*sockets)
    return connection_problems(connections_of(reading, 4242),
                               **{**RANK0, "addresses": reading["addresses"]})


def test_a_real_groups_own_connections_are_neither_on_nor_off_the_link() -> None:
    """The store's self-connection and the proxies' sockets pass; so does the group."""
    assert rank0_problems(*STORE_SELF, *PROXY_RANK0, *CROSS_RANK0, *HTTP_CLIENT) == []
    reading = Connections().process([" 5242 1", " 5250 5242", "@@", *RANK1, "@@",
                                     *RANK1_ADDRESSES])
    assert connection_problems(connections_of(reading, 5242), reading["addresses"],
                               **RANK1_ARGS) == []


def test_only_the_hosts_own_connections_prove_no_link() -> None:
    """Self-connections on the link address are not the group's traffic across it."""
    assert rank0_problems(*STORE_SELF, *PROXY_RANK0, *HTTP_CLIENT) == [
        "the TP group has no connection between 169.254.77.1 and 169.254.77.2 on thunderbolt0"]


def test_both_ends_the_hosts_own_is_the_host_whatever_the_interface() -> None:
    """A proxy reached from the LAN address to the link address stays on the host."""
    lan_to_link = '0 0 10.66.0.11:39157 169.254.77.1:43311 users:(("python",pid=4250,fd=41))'
    assert rank0_problems(lan_to_link, *CROSS_RANK0) == []


def test_a_stray_connection_over_eth0_is_named_alone() -> None:
    found = rank0_problems(*STORE_SELF, *PROXY_RANK0, *CROSS_RANK0, *HTTP_CLIENT, STRAY)
    assert len(found) == 1
    assert ("its connections 10.66.0.11:41000 -> 10.66.0.12:38000 run outside "
            "169.254.77.1 <-> 169.254.77.2 (") in found[0]


def test_a_connection_from_the_link_address_must_reach_the_peers() -> None:
    """The rule is link address to peer's link address, not anything from the link address."""
    elsewhere = '0 0 169.254.77.1:41000 169.254.77.9:38000 users:(("python",pid=4250,fd=60))'
    found = rank0_problems(*STORE_SELF, *CROSS_RANK0, elsewhere)
    assert len(found) == 1
    assert "169.254.77.1:41000 -> 169.254.77.9:38000 run outside" in found[0]
    # The whole group from the link address to a stranger: nothing reaches the peer.
    assert len(rank0_problems(elsewhere)) == 2


def test_the_link_must_carry_what_the_tokens_all_reduces_need() -> None:
    # 2 all-reduces x 64 layers x 5120 x 2 bytes = 1.25 MiB per token, one way.
    assert one_way_bytes(SHAPE, 32) == 32 * 1_310_720
    assert volume_problems(32 * 1_310_720, SHAPE, 32, "thunderbolt0") == []
    found = volume_problems(3 << 20, SHAPE, 32, "thunderbolt0")
    assert found == ["the TP group's transport is not thunderbolt0: thunderbolt0 carried 3.0 MiB "
                     "during a 32-token completion; its all-reduces need at least 40.0 MiB "
                     "(2 per layer x 64 layers x 5120 x 2 bytes per token)"]


def test_the_model_shape_is_read_as_the_loader_reads_it() -> None:
    nested = {"text_config": {"num_hidden_layers": 64, "hidden_size": 5120,
                              "num_attention_heads": 64, "num_key_value_heads": 8,
                              "head_dim": 128, "torch_dtype": "bfloat16"},
              "vision_config": {"depth": 27}}
    index = {"metadata": {"total_size": 15187500000}, "weight_map": {"lm_head.weight": "a"}}
    read = ModelShape().process([*json.dumps(nested, indent=1).splitlines(), WEIGHTS_MARKER,
                                 *json.dumps(index, indent=1).splitlines()])
    # K and V for 64 layers of 8 heads of 128 bf16 values; NEXTN's one draft layer by default.
    assert read == {**SHAPE, "draft_layers": 1, "kv_bytes_per_position": 2 * 64 * 8 * 128 * 2,
                    "weight_bytes": 15187500000}
    # Without an index, the safetensors files' sizes; without either, no size.
    files = ModelShape().process([json.dumps(nested), WEIGHTS_MARKER, "4000", "1000"])
    assert files["weight_bytes"] == 5000
    assert ModelShape().process([json.dumps(nested), WEIGHTS_MARKER])["weight_bytes"] is None
    assert ModelShape().process(['{"architectures": ["Qwen3ForCausalLM"]}']) is None
    assert ModelShape().process(["not json"]) is None


def test_the_model_shape_command_reads_a_model_directory(tmp_path: Path) -> None:
    def read() -> dict | None:
        command = raw_command(ModelShape(), {"model_path": str(tmp_path)})
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return ModelShape().process(done.stdout.splitlines()) if done.returncode == 0 else None

    assert read() is None
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 64,
                                                      "hidden_size": 5120}))
    assert read()["weight_bytes"] is None
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(bytes(300))
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(bytes(200))
    assert read()["weight_bytes"] == 500
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 480}}))
    assert read()["weight_bytes"] == 480


# The transport judge, branch by branch (issue 29 part 5)


def test_a_connection_to_another_hosts_http_port_is_no_http_client() -> None:
    # Only connections to this rank's own HTTP port are its clients'.
    outbound = '0 0 10.66.0.11%eth0:41000 10.66.0.12:30000 users:(("python",pid=4250,fd=60))'
    found = rank0_problems(*CROSS_RANK0, outbound)
    assert len(found) == 1
    assert "its connections 10.66.0.11:41000 -> 10.66.0.12:30000 run outside" in found[0]


def test_a_connection_to_the_peers_link_address_from_elsewhere_is_neither_group_nor_off_link(
        ) -> None:
    from_lan = '0 0 10.66.0.11%eth0:41000 169.254.77.2:38000 users:(("python",pid=4250,fd=60))'
    assert rank0_problems(*CROSS_RANK0, from_lan) == []
    assert rank0_problems(from_lan) == [
        "the TP group has no connection between 169.254.77.1 and 169.254.77.2 on thunderbolt0"]


def test_all_of_loopback_is_the_hosts_own_though_ip_lists_only_127_0_0_1() -> None:
    loopback = '0 0 127.0.0.1:35000 127.0.0.2:35001 users:(("python",pid=4250,fd=3))'
    assert rank0_problems(*CROSS_RANK0, loopback) == []


def test_every_connection_off_the_link_is_named() -> None:
    other = '0 0 10.66.0.11%eth0:41001 10.66.0.13:38000 users:(("python",pid=4250,fd=61))'
    [problem] = rank0_problems(*CROSS_RANK0, STRAY, other)
    assert ("its connections 10.66.0.11:41000 -> 10.66.0.12:38000, "
            "10.66.0.11:41001 -> 10.66.0.13:38000 run outside") in problem
