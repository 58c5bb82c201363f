"""What the weights check costs on the host: the agent's `weight_layouts` over a model
directory shaped like a large MoE checkpoint (many shards, thousands of tensors per
header), with tensors written sparse so the directory is cheap to make.

    .venv/bin/python -m bench.weights.bench [SHARDS] [TENSORS_PER_SHARD]

Prints the wall time of the read (median of 5, cold page cache not forced) and the
bytes it read (header lengths + 8 per file), against the bytes on disk.
"""

from __future__ import annotations

import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from vigil.host import payload

agent = payload.load()  # the joined script a host runs


def make(root: Path, shards: int, tensors: int, tensor_bytes: int) -> int:
    """A sharded checkpoint with real safetensors headers; data regions are sparse."""
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        for t in range(tensors):
            key = f"model.layers.{s}.mlp.experts.{t}.down_proj.weight"
            header[key] = {"dtype": "BF16", "shape": [tensor_bytes // 2],
                           "data_offsets": [t * tensor_bytes, (t + 1) * tensor_bytes]}
            weight_map[key] = name
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with (root / name).open("wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(8 + len(raw) + tensors * tensor_bytes)
        total += 8 + len(raw) + tensors * tensor_bytes
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text("{}")
    (root / "tokenizer.json").write_text(json.dumps({"v": list(range(400_000))}))
    return total


def main() -> None:
    shards = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    tensors = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        on_disk = make(root, shards, tensors, 4 * 1024 * 1024)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            out = agent.weight_layouts(str(root), agent.read_json(str(root / agent.INDEX_FILE)))
            times.append(time.perf_counter() - t0)
        files = out["safetensors"].values()
        read = sum(8 + f["header_len"] for f in files)
        assert all(f["size"] == 8 + f["header_len"] + f["end"] for f in files)
        print(f"{shards} shards x {tensors} tensors: {on_disk / 1024**3:.0f} GiB on disk, "
              f"read {read / 1024**2:.1f} MiB of headers ({read / shards / 1024:.0f} KiB per "
              f"file), median {statistics.median(times) * 1000:.0f} ms "
              f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})")


if __name__ == "__main__":
    main()
