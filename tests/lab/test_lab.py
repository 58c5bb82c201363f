"""The lab itself: real nspawn hosts over real SSH, and the tiny model generator."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import uuid
from pathlib import Path

import paramiko
import pytest

from lab import hosts, tiny_model
from tests.lab_fixtures import LAB_HOSTS, lab_hosts  # noqa: F401  (pytest fixture)

HostList = list[hosts.HostStatus]


def _tree_digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


# --- tiny model (no lab needed) -------------------------------------------------------


def test_tiny_model_is_deterministic(tmp_path: Path) -> None:
    a = tiny_model.generate(tmp_path / "a")
    b = tiny_model.generate(tmp_path / "b")
    assert sorted(p.name for p in a.iterdir()) == sorted(tiny_model.FILES)
    assert _tree_digest(a) == _tree_digest(b)


def test_tiny_model_safetensors_matches_config(tmp_path: Path) -> None:
    d = tiny_model.generate(tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    raw = (d / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    h, vocab, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    head_dim = h // config["num_attention_heads"]
    assert head_dim == 64  # the CPU backend fails at the first request with smaller heads
    kv = config["num_key_value_heads"] * head_dim
    expect = {
        "model.embed_tokens.weight": [vocab, h],
        "model.norm.weight": [h],
        "lm_head.weight": [vocab, h],
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        expect |= {
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [h, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, h],
            p + "mlp.gate_proj.weight": [inter, h],
            p + "mlp.up_proj.weight": [inter, h],
            p + "mlp.down_proj.weight": [h, inter],
        }
    assert {k: v["shape"] for k, v in header.items()} == expect
    # Offsets tile the data section exactly, float32 (4 bytes) each.
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    end = 0
    for (start, stop), meta in zip(
        spans, sorted(header.values(), key=lambda v: v["data_offsets"]), strict=True
    ):
        assert meta["dtype"] == "F32" and start == end
        count = 1
        for dim in meta["shape"]:
            count *= dim
        assert stop - start == 4 * count
        end = stop
    assert 8 + n + end == len(raw)
    # RMSNorm weights are ones, so activations keep their scale.
    norm = header["model.norm.weight"]["data_offsets"]
    ones = struct.unpack(f"<{h}f", raw[8 + n + norm[0] : 8 + n + norm[1]])
    assert set(ones) == {1.0}


def test_tiny_model_tokenizer_files(tmp_path: Path) -> None:
    d = tiny_model.generate(tmp_path / "m")
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    config = json.loads((d / "config.json").read_text())
    assert len(vocab) <= config["vocab_size"]
    assert sorted(vocab.values()) == list(range(len(vocab)))
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert added == {"<unk>": 0, "<s>": config["bos_token_id"], "</s>": config["eos_token_id"]}
    assert tok["pre_tokenizer"]["type"] == tok["decoder"]["type"] == "ByteLevel"
    # every merge joins two known symbols into a known one
    for merge in tok["model"]["merges"]:
        a, b = merge.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    tc = json.loads((d / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"


# --- lab hosts ------------------------------------------------------------------------


@pytest.mark.lab
def test_hosts_are_up_and_listed(lab_hosts: HostList) -> None:  # noqa: F811
    assert [h.name for h in lab_hosts] == [f"lab{i}" for i in range(1, LAB_HOSTS + 1)]
    by_name = {h.name: h for h in hosts.status()}
    for h in lab_hosts:
        assert by_name[h.name].running and by_name[h.name].ssh_ok
        assert by_name[h.name].port == 2200 + int(h.name[3:])


@pytest.mark.lab
def test_inventory_fragment_loads(lab_hosts: HostList) -> None:  # noqa: F811
    from vigil.desired import inventory

    text = hosts.INVENTORY_FRAGMENT.read_text()
    assert text.startswith("# written by `invoke lab.up`")
    inv = inventory.load(str(hosts.REPO / "inventory"))
    for h in lab_hosts:
        v = inv.host_vars(h.name)
        assert (v.address, v.ssh_port, v.ssh_user) == ("127.0.0.1", h.port, "root")
        assert v.ssh_key == str(hosts.key_path())
        assert v.known_hosts == str(hosts.known_hosts_path())
        assert (v.model, v.stack) == ("tiny-cpu", "lab-cpu")


@pytest.mark.lab
def test_ssh_checks_host_keys(lab_hosts: HostList) -> None:  # noqa: F811
    for h in lab_hosts:
        i = int(h.name[3:])
        client = hosts.connect(i)  # RejectPolicy + the lab's known_hosts
        try:
            _, out, _ = client.exec_command("hostname; systemctl is-active ssh")
            assert out.read().decode().split() == [h.name, "active"]
        finally:
            client.close()
    # A client that does not know the host key is refused: checking really is on.
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        client.connect(
            "127.0.0.1",
            port=lab_hosts[0].port,
            username="root",
            key_filename=str(hosts.key_path()),
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
        )
    client.close()


@pytest.mark.lab
def test_unit_runs_and_logs_to_journal(lab_hosts: HostList) -> None:  # noqa: F811
    marker = f"vigil-lab-{uuid.uuid4().hex[:8]}"
    unit = f"{marker}.service"
    body = (
        "[Unit]\nDescription=lab test\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
        f"ExecStart=/bin/echo hello from {marker}\n"
    )
    for h in lab_hosts:
        i = int(h.name[3:])
        code, _, err = hosts.run(
            i,
            f"cat > /etc/systemd/system/{unit} <<'EOF'\n{body}EOF\n"
            f"systemctl daemon-reload && systemctl start {unit} && systemctl is-active {unit}",
        )
        assert code == 0, err
        code, out, err = hosts.run(i, f"journalctl -u {unit} --no-pager -o cat")
        assert code == 0, err
        assert f"hello from {marker}" in out
        hosts.run(
            i, f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}; systemctl daemon-reload"
        )


@pytest.mark.lab
def test_host_layout(lab_hosts: HostList) -> None:  # noqa: F811
    i = int(lab_hosts[0].name[3:])
    code, out, err = hosts.run(
        i,
        "set -e; id -u vllm; test -f /srv/models/tiny-llama/config.json; "
        "for d in /etc/vigil /var/lib/vigil /opt/vigil /var/cache/vigil /root/.cache/pip /tmp; "
        "do touch $d/.w && rm $d/.w; done; "
        "! touch /srv/models/.w 2>/dev/null; echo ok",
    )
    assert code == 0 and out.split()[-1] == "ok", err
    # /opt/vigil is the host's own, and persistent on the machine
    hosts.run(i, "echo x > /opt/vigil/.lab-test")
    mark = hosts.lab_dir() / "hosts" / lab_hosts[0].name / "opt-vigil" / ".lab-test"
    assert mark.read_text() == "x\n"
    mark.unlink()


@pytest.mark.lab
def test_noroot_user_cannot_write_units(lab_hosts: HostList) -> None:  # noqa: F811
    i = int(lab_hosts[0].name[3:])
    code, out, err = hosts.run(
        i, "id -un; touch /etc/systemd/system/vigil-noroot-test.service", user=hosts.NOROOT_USER
    )
    assert out.strip() == hosts.NOROOT_USER
    assert code != 0 and "Permission denied" in err


@pytest.mark.lab
def test_sshd_listens_on_loopback_only(lab_hosts: HostList) -> None:  # noqa: F811
    code, out, _ = hosts.run(int(lab_hosts[0].name[3:]), "ss -ltnH")
    assert code == 0
    ports = {line.split()[3] for line in out.splitlines()}
    assert f"127.0.0.1:{lab_hosts[0].port}" in ports
    with socket.socket() as s:
        s.settimeout(2)
        s.connect(("127.0.0.1", lab_hosts[0].port))
        assert s.recv(64).startswith(b"SSH-2.0-")
