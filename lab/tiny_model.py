"""Generate the lab's tiny Llama model with the standard library only.

The lab serves this model with the real vLLM CPU build: it must load in transformers
and vLLM like any checkpoint, yet cost nothing to make (no torch, numpy or tokenizers
here, no download). Everything is deterministic: the same bytes on every run, so a
model directory can be compared by hash.

    python -m lab.tiny_model DEST
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import re
import struct
import sys
import tempfile
from array import array
from collections import Counter
from pathlib import Path

# Head size 64: the CPU attention backend refuses small head sizes (16 fails at the
# first request, after /health already says 200).
HIDDEN = 256
HEADS = 4
KV_HEADS = 4
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
INTERMEDIATE = 512
VOCAB = 512
MAX_POSITIONS = 2048
SEED = 20240601

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIALS = (UNK, BOS, EOS)  # ids 0, 1, 2 as in Llama checkpoints

# Enough text that BPE reaches the full vocabulary; content is irrelevant.
CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "vLLM serves large language models with paged attention and continuous batching.",
    "A systemd service starts the server, and journald records everything it prints.",
    "The deploy writes a unit file, reloads the daemon, restarts the service and waits.",
    "Verify that the model answers a completion request before calling the host healthy.",
    "Hello world! This is a tiny model for tests; its weights are random numbers.",
    "Once upon a time there was a small language model that lived on a laptop.",
    "It could not write poems, but it always answered quickly and never ran out of memory.",
    "The lab boots containers with systemd-nspawn and reaches them over SSH on local ports.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1024 2048 65535.",
    "Tokens, merges and vocabularies: a byte-level BPE tokenizer in pure Python.",
    "What is the capital of France? Paris is the capital of France.",
    "Every host has a GPU, a driver, a Python environment and a model on its disk.",
    "When the watcher sees the server ready, it sends a prompt and reads the reply.",
    "Compile caches make the second start faster than the first one.",
    "Please write a short story about a robot who learns to paint with colours.",
    "def main():\n    print('hello')\n    return 0\n",
    "Errors name the host, the file and the fix; nothing else is a surprise.",
)

# GPT-2's split for ASCII text (the real one uses \p{L}/\p{N}, which `re` lacks).
# Only used for training: the merges stay valid whatever the split.
_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (ByteLevel in tokenizers)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


def train_bpe(corpus: tuple[str, ...], vocab_size: int) -> tuple[dict[str, int], list[str]]:
    """Byte-level BPE: specials, the 256 byte symbols, then merges up to vocab_size."""
    byte_map = bytes_to_unicode()
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIALS)}
    for b in range(256):
        vocab[byte_map[b]] = len(vocab)
    words: Counter[tuple[str, ...]] = Counter()
    for text in corpus:
        for piece in _SPLIT.findall(text):
            words[tuple(byte_map[b] for b in piece.encode())] += 1
    merges: list[str] = []
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for left, right in itertools.pairwise(word):
                pairs[(left, right)] += count
        if not pairs:
            break  # every word is one token: the corpus is exhausted
        # Most frequent, ties broken by the pair itself: independent of dict order.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        joined = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        vocab.setdefault(joined, len(vocab))
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return vocab, merges


def tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict[str, object]:
    """tokenizers' serialisation of a GPT-2 style byte-level BPE that prepends <s>."""
    added = [
        {
            "id": vocab[tok],
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for tok in SPECIALS
    ]
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": BOS, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {BOS: {"id": BOS, "ids": [vocab[BOS]], "tokens": [BOS]}},
        },
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def config_json() -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "bos_token_id": SPECIALS.index(BOS),
        "eos_token_id": SPECIALS.index(EOS),
    }


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """vLLM/transformers parameter names of LlamaForCausalLM and their shapes."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (HIDDEN,)
        shapes[p + "self_attn.q_proj.weight"] = (HEADS * HEAD_DIM, HIDDEN)
        shapes[p + "self_attn.k_proj.weight"] = (KV_HEADS * HEAD_DIM, HIDDEN)
        shapes[p + "self_attn.v_proj.weight"] = (KV_HEADS * HEAD_DIM, HIDDEN)
        shapes[p + "self_attn.o_proj.weight"] = (HIDDEN, HEADS * HEAD_DIM)
        shapes[p + "post_attention_layernorm.weight"] = (HIDDEN,)
        shapes[p + "mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[p + "mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[p + "mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def _tensor_bytes(name: str, shape: tuple[int, ...]) -> bytes:
    count = 1
    for dim in shape:
        count *= dim
    if name.endswith("norm.weight"):
        values = array("f", [1.0]) * count  # RMSNorm scales: identity
    else:
        # Seeded per tensor from its name, so one tensor does not depend on the others.
        rng = random.Random(SEED ^ int.from_bytes(hashlib.sha256(name.encode()).digest()[:8]))
        gauss = rng.gauss
        values = array("f", [gauss(0.0, 0.02) for _ in range(count)])
    if sys.byteorder != "little":
        values.byteswap()  # safetensors is little-endian on disk
    return values.tobytes()


def safetensors_bytes(shapes: dict[str, tuple[int, ...]]) -> bytes:
    """safetensors: u64 LE header length, JSON header, then the raw tensors in order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, shape in shapes.items():
        blob = _tensor_bytes(name, shape)
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data to 8 bytes, as safetensors does
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def model_files() -> dict[str, bytes]:
    """Every file of the model directory, name -> exact bytes."""
    vocab, merges = train_bpe(CORPUS, VOCAB)

    def dump(obj: object) -> bytes:
        return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    }
    return {
        "config.json": dump(config_json()),
        "generation_config.json": dump(
            {"bos_token_id": SPECIALS.index(BOS), "eos_token_id": SPECIALS.index(EOS)}
        ),
        "model.safetensors": safetensors_bytes(tensor_shapes()),
        "tokenizer.json": dump(tokenizer_json(vocab, merges)),
        "tokenizer_config.json": dump(tokenizer_config),
        "special_tokens_map.json": dump({"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}),
    }


def generate(dest: Path | str) -> Path:
    """Write the model into dest (created if missing); files are replaced atomically."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in model_files().items():
        # Write then rename: a host reading the directory never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dest", type=Path, help="model directory to write")
    args = parser.parse_args(argv)
    try:
        out = generate(args.dest)
    except OSError as exc:
        print(f"cannot write the model to {args.dest}: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
