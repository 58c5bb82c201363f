"""Weights checked before a restart: the model directory's files as the agent read them
(safetensors headers, config, tokenizer), judged here (pure).

The agent reads only headers (8-byte little-endian length + JSON) and a file's size, so
the check costs a few KB per file. A safetensors file is complete when its size is
exactly 8 + the header length + the end offset of its last tensor: the loader refuses
anything else, but only after the restart, as a crash. Here it is refused before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The format's cap on the JSON header (mirrors the agent's SAFETENSORS_HEADER_MAX).
HEADER_MAX = 100 * 1024 * 1024
# Any one of these is a tokenizer vLLM (transformers) can load from the directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")


@dataclass(frozen=True)
class SafetensorsFile:
    """One safetensors file as its header describes it."""

    name: str
    size: int | None
    header_len: int | None
    end: int | None  # the largest data_offsets end: where the tensors' bytes stop
    tensors: int = 0
    error: str | None = None  # what the agent could not read
    absent: tuple[str, ...] = ()  # tensors the index places here that the header lacks
    absent_count: int = 0

    @property
    def expected_size(self) -> int | None:
        if self.header_len is None or self.end is None:
            return None
        return 8 + self.header_len + self.end

    def problem(self) -> str | None:
        """Why this file would not load, with both sizes; None when it is complete."""
        n, size, expected = self.header_len, self.size, self.expected_size
        if self.error:
            return f"{self.name}: {self.error}" + (f" ({size} bytes)" if size is not None else "")
        if size is None or n is None:
            return f"{self.name}: unreadable"
        if n > HEADER_MAX:
            return (f"{self.name}: header length {n} is beyond the format's 100 MiB limit "
                    f"(not a safetensors file, or its first bytes are damaged)")
        if 8 + n > size:
            return (f"{self.name} is truncated: {size} bytes on disk, but its header alone "
                    f"needs {8 + n} bytes")
        if expected is not None and size < expected:
            return (f"{self.name} is truncated: {size} bytes on disk, its header says "
                    f"{expected} (8 + {n} header + {self.end} tensor bytes); "
                    f"{expected - size} bytes missing")
        if expected is not None and size > expected:
            return (f"{self.name} has {size - expected} bytes past its last tensor: {size} "
                    f"bytes on disk, its header says {expected} (not this file's copy?)")
        if self.absent_count:
            shown = ", ".join(self.absent) + (
                f" and {self.absent_count - len(self.absent)} more"
                if self.absent_count > len(self.absent) else "")
            return (f"{self.name} lacks {self.absent_count} tensor(s) that "
                    f"model.safetensors.index.json places in it ({shown})")
        return None


@dataclass(frozen=True)
class ModelFiles:
    """The files of a model directory that decide whether vLLM can load it."""

    safetensors: tuple[SafetensorsFile, ...] = ()
    meta: dict[str, str] = field(default_factory=dict)  # file name -> ok / absent / ...

    @property
    def weight_bytes(self) -> int:
        return sum(f.size or 0 for f in self.safetensors)


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(reply: Mapping[str, Any] | None) -> ModelFiles | None:
    """The agent's ``model.layouts`` reply; None when it sent none (a hub id, an older
    agent): then nothing is judged."""
    if not isinstance(reply, Mapping):
        return None
    raw_files = reply.get("safetensors")
    raw_meta = reply.get("meta")
    files: list[SafetensorsFile] = []
    for name, f in sorted((raw_files or {}).items()):
        f = f if isinstance(f, Mapping) else {}
        absent = f.get("absent")
        files.append(SafetensorsFile(
            name=str(name),
            size=_opt_int(f.get("size")),
            header_len=_opt_int(f.get("header_len")),
            end=_opt_int(f.get("end")),
            tensors=_opt_int(f.get("tensors")) or 0,
            error=str(f["error"]) if f.get("error") else None,
            absent=tuple(str(a) for a in absent) if isinstance(absent, list) else (),
            absent_count=_opt_int(f.get("absent_count")) or 0,
        ))
    meta = {str(k): str(v) for k, v in (raw_meta or {}).items()}
    return ModelFiles(tuple(files), meta)


def _flag(args: Sequence[str], name: str) -> str | None:
    for a in args:
        if a == name:
            return ""
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def problems(files: ModelFiles, extra_args: Sequence[str] = ()) -> list[str]:
    """Every reason the directory would not load, one line each (file, sizes or state).

    ``extra_args`` are the profile's extra vLLM arguments: a separate ``--tokenizer``, or
    the Mistral formats (params.json, tekken), take those files from elsewhere."""
    out = [p for p in (f.problem() for f in files.safetensors) if p]
    mistral_config = _flag(extra_args, "--config-format") == "mistral"
    mistral_tokenizer = _flag(extra_args, "--tokenizer-mode") == "mistral"
    own_tokenizer = _flag(extra_args, "--tokenizer") is None and not mistral_tokenizer
    meta = files.meta
    if not meta:
        return out
    config = meta.get("config.json", "absent")
    if config == "absent" and not mistral_config:
        out.append("config.json is absent (vLLM reads it before anything else)")
    for name, state in sorted(meta.items()):
        # the index is named only when the agent refused to read it (a FIFO, too deep)
        if state not in ("ok", "absent") and (own_tokenizer or name in (
                "config.json", "model.safetensors.index.json")):
            out.append(f"{name}: {state}")
    if own_tokenizer and all(meta.get(n, "absent") == "absent" for n in TOKENIZER_FILES):
        out.append(f"no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there "
                   "(or set --tokenizer=... in the profile's extra_args)")
    return out


def summary(files: ModelFiles) -> str:
    """One line for preflight's report: what was checked and what it found."""
    bad = problems(files)
    gib = files.weight_bytes / 1024**3
    checked = (f"{len(files.safetensors)} safetensors file(s), {gib:.2f} GiB, "
               f"{sum(f.tensors for f in files.safetensors)} tensors")
    return f"{checked}: " + ("headers match sizes; config and tokenizer parse" if not bad
                             else f"{len(bad)} problem(s)")
