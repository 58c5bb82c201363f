"""The lab's tiny model, built on this machine: deterministic, its files consistent."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from lab import tiny_model
from tests.lab_fixtures import LAB_HOSTS, lab_hosts  # noqa: F401  (pytest fixture)


def _tree_digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


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
