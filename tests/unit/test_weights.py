"""Weights checked before a restart: real safetensors files (written by the `safetensors`
library, and the lab's tiny model), truncated and damaged copies, read by the host
agent's facts and judged by vigil.deploy.weights and preflight."""

from __future__ import annotations

import ctypes
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import safetensors

from lab import tiny_model
from tests.agent_payload import agent
from tests.doubles import facts_for, target
from vigil.deploy import weights
from vigil.deploy.preflight import problems


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """A real file from the library: float32 tensors of the given shapes."""
    keep: list[Any] = []  # the buffers must outlive serialize_file
    specs: dict[str, Any] = {}
    for i, (name, shape) in enumerate(tensors.items()):
        count = 1
        for d in shape:
            count *= d
        data = struct.pack(f"<{count}f", *(float(i + j) for j in range(count)))
        buf = ctypes.create_string_buffer(data, len(data))
        keep.append(buf)
        specs[name] = safetensors.TensorSpec(dtype="float32", shape=shape,
                                             data_ptr=ctypes.addressof(buf), data_len=len(data))
    safetensors.serialize_file(specs, str(path), {"format": "pt"})


def library_loads(path: Path) -> bool:
    """The library's own verdict on a file: the loader vLLM uses."""
    try:
        safetensors.deserialize(path.read_bytes())
        return True
    except safetensors.SafetensorError:
        return False


def sharded_model(root: Path) -> Path:
    """Two shards, an index, a config and a tokenizer: a complete model directory."""
    d = root / "model"
    d.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {"embed.weight": [64, 16], "l0.w": [16, 16]},
        "model-00002-of-00002.safetensors": {"l1.w": [16, 16], "head.weight": [64, 16]},
    }
    weight_map = {}
    for name, tensors in shards.items():
        write_safetensors(d / name, tensors)
        weight_map.update({t: name for t in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2 * 4 * (64 * 16 + 16 * 16)}, "weight_map": weight_map}))
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 202752,
                                               "num_attention_heads": 64}))
    (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    (d / "tokenizer_config.json").write_text("{}")
    return d


def judged(d: Path, extra_args: tuple[str, ...] = ()) -> list[str]:
    """What the agent reads on the host, as it crosses the wire, judged by the controller."""
    reply = json.loads(json.dumps(agent.model_facts(str(d))))
    files = weights.parse(reply["layouts"])
    assert files is not None
    return weights.problems(files, extra_args)


def cut(path: Path, size: int) -> None:
    with path.open("r+b") as fh:
        fh.truncate(size)


def test_complete_models_pass_and_the_agent_reads_only_headers(tmp_path: Path) -> None:
    d = sharded_model(tmp_path)
    assert judged(d) == []
    layouts = agent.model_facts(str(d))["layouts"]["safetensors"]
    first = layouts["model-00001-of-00002.safetensors"]
    assert first["tensors"] == 2 and first["end"] == 4 * (64 * 16 + 16 * 16)
    assert first["size"] == 8 + first["header_len"] + first["end"]
    # the lab's tiny model (written by our own stdlib generator) is complete too
    tiny = tiny_model.generate(tmp_path / "tiny")
    assert judged(tiny) == []
    files = weights.parse(agent.model_facts(str(tiny))["layouts"])
    assert files is not None and files.safetensors[0].tensors > 0
    assert weights.summary(files).endswith("headers match sizes; config and tokenizer parse")


def test_a_truncated_shard_is_named_with_both_sizes(tmp_path: Path) -> None:
    d = sharded_model(tmp_path)
    shard = d / "model-00002-of-00002.safetensors"
    full = shard.stat().st_size
    cut(shard, full - 100)
    (problem,) = judged(d)
    assert problem == (f"model-00002-of-00002.safetensors is truncated: {full - 100} bytes on "
                       f"disk, its header says {full} (8 + {full - 8 - 5120} header + 5120 "
                       f"tensor bytes); 100 bytes missing")
    assert not library_loads(shard)


def test_every_cut_the_library_refuses_is_refused(tmp_path: Path) -> None:
    """Truncated at every byte: the checker and the library's loader agree on each."""
    src = tmp_path / "one.safetensors"
    write_safetensors(src, {"a": [3, 2], "b": [5]})
    full = src.stat().st_size
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")
    for size in range(full + 1):
        shutil.copyfile(src, d / "model.safetensors")
        cut(d / "model.safetensors", size)
        found = judged(d)
        assert (found == []) == library_loads(d / "model.safetensors") == (size == full), size
        if size < full:
            assert len(found) == 1 and found[0].startswith("model.safetensors"), found
            assert f"{size} bytes" in found[0], found


def test_extra_bytes_damaged_headers_and_missing_tensors(tmp_path: Path) -> None:
    d = sharded_model(tmp_path)
    one = d / "model-00001-of-00002.safetensors"
    two = d / "model-00002-of-00002.safetensors"
    with one.open("ab") as fh:
        fh.write(b"\0" * 7)
    assert not library_loads(one)
    two.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    found = judged(d)
    assert found[0].startswith("model-00001-of-00002.safetensors has 7 bytes past its last "
                               "tensor")
    assert found[1] == ("model-00002-of-00002.safetensors: header length 1099511627776 is "
                        "beyond the format's 100 MiB limit (not a safetensors file, or its "
                        "first bytes are damaged)")
    # a shard from another checkpoint: complete, but not what the index says it holds
    write_safetensors(two, {"l1.w": [16, 16], "other.weight": [4]})
    (found,) = judged(d)[1:]
    assert found == ("model-00002-of-00002.safetensors lacks 1 tensor(s) that "
                     "model.safetensors.index.json places in it (head.weight)")
    two.write_bytes(b"\x01\x00")
    assert judged(d)[1] == ("model-00002-of-00002.safetensors: shorter than the 8-byte header "
                            "length (2 bytes)")
    header = b'{"x": {"dtype"'
    two.write_bytes(struct.pack("<Q", len(header)) + header)
    assert judged(d)[1] == "model-00002-of-00002.safetensors: its header is not valid JSON " \
                           f"({8 + len(header)} bytes)"


def test_config_and_tokenizer_are_present_and_parse(tmp_path: Path) -> None:
    d = sharded_model(tmp_path)
    text = (d / "tokenizer.json").read_text()
    (d / "tokenizer.json").write_text(text[:-3])
    (d / "config.json").unlink()
    found = judged(d)
    assert found[0] == "config.json is absent (vLLM reads it before anything else)"
    assert found[1].startswith("tokenizer.json: invalid: ")
    # a separate tokenizer is not judged here; config.json always is
    assert judged(d, ("--tokenizer=/srv/tok",)) == [found[0]]
    (d / "tokenizer.json").unlink()
    (d / "config.json").write_text('{"max_position_embeddings": ')
    found = judged(d)
    assert found[0].startswith("config.json: invalid: ")
    assert found[1].startswith("no tokenizer: none of tokenizer.json, tokenizer.model")
    # a tokenizer.json too big to parse on every facts call: its ends are checked
    (d / "config.json").write_text("{}")
    big = json.dumps({"vocab": {f"t{i}": i for i in range(agent.JSON_PARSE_MAX // 8)}})
    assert len(big) > agent.JSON_PARSE_MAX
    (d / "tokenizer.json").write_text(big)
    assert judged(d) == []
    (d / "tokenizer.json").write_text(big[: len(big) // 2])
    assert judged(d) == ["tokenizer.json: invalid: does not end where its JSON started "
                         "(cut short?)"]


def test_preflight_refuses_a_truncated_shard(tmp_path: Path) -> None:
    d = sharded_model(tmp_path)
    t = target()

    def refusals() -> list[str]:
        model = json.loads(json.dumps(agent.model_facts(str(d))))
        return [str(e) for e in problems("llm-one", t.profile, t.rendered,
                                         facts_for(t, model=model))
                if "would not load" in str(e)]

    assert refusals() == []
    shard = d / "model-00001-of-00002.safetensors"
    full = shard.stat().st_size
    cut(shard, full // 2)
    (message,) = refusals()
    assert message.startswith(f"llm-one: model directory {t.profile.path} would not load:")
    assert (f"model-00001-of-00002.safetensors is truncated: {full // 2} bytes on disk, "
            f"its header says {full}") in message
    # an agent that sent no layouts (older, or a hub id) is not judged on them
    assert weights.parse(None) is None
