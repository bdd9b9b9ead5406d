"""The TP group's transport: where its connections run and what the link carried."""

import json
import subprocess
from pathlib import Path

from operations.facts import raw_command
from operations.transport import (
    WEIGHTS_MARKER,
    Connections,
    ModelShape,
    connection_problems,
    connections_of,
    endpoint,
    one_way_bytes,
    volume_problems,
)

# ps, then ss -tnpH state established, as a workstation in tp2 prints them: rank 0's
# service (4242) runs a TP worker (4250), which holds NCCL's and the store's sockets.
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
""".splitlines()
RANK0 = {"address": "169.254.77.1", "peer_address": "169.254.77.2", "http_port": 30000,
         "interface": "thunderbolt0"}
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
    assert Connections().process([]) == Connections().default()


def test_a_group_on_the_link_passes_http_clients_and_loopback_aside() -> None:
    held = connections_of(Connections().process(OUTPUT), 4242)
    assert connection_problems(held, **RANK0) == []


def test_a_connection_off_the_link_names_the_transport_and_the_variables() -> None:
    wrong = [*OUTPUT[:5],
             '0 0 10.66.0.11%eth0:41000 10.66.0.12:38000 users:(("python",pid=4250,fd=9))']
    found = connection_problems(connections_of(Connections().process(wrong), 4242), **RANK0)
    assert len(found) == 2
    assert found[0].startswith("the TP group's transport is not thunderbolt0: its connections "
                               "10.66.0.11:41000 -> 10.66.0.12:38000 run outside "
                               "169.254.77.1 <-> 169.254.77.2")
    assert "NCCL_SOCKET_IFNAME" in found[0] and "SGLANG_HOST_IP" in found[0]
    assert found[1] == ("the TP group has no connection between 169.254.77.1 and "
                        "169.254.77.2 on thunderbolt0")


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
