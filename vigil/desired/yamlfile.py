"""Read one YAML file into a validated model: every error names the file, key and fix."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from vigil.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; a syntax error names the file, line and column."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{where}invalid YAML ({problem})", file=str(path), fix="correct the YAML syntax"
        ) from None


def close(word: object, known: Collection[str], cutoff: float = 0.6) -> str | None:
    """The known word a typo was meant to be (``tensor-parallel-size`` is
    ``tensor_parallel_size``), or None."""
    if not isinstance(word, str):
        return None
    folded = word.replace("-", "_").lower()
    if folded in known and folded != word:
        return folded
    found = difflib.get_close_matches(folded, list(known), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(word: object, known: Collection[str], cutoff: float = 0.6) -> str:
    hint = close(word, known, cutoff)
    return f" - did you mean {hint!r}?" if hint else ""


def _submodel(annotation: object) -> type[BaseModel] | None:
    """The model inside an annotation (Gpu | None, list[Stack.Requires]), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _submodel(arg)
            if found is not None:
                return found
    return None


def fields_at(model: type[BaseModel], path: tuple[int | str, ...]) -> set[str]:
    """The keys a model takes at a nested location of its input (gpu -> Gpu's)."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return set()
        if isinstance(part, int):
            continue
        if part not in current.model_fields:
            return set()
        try:  # a nested model's annotation may still be a forward reference
            annotation = typing.get_type_hints(current)[part]
        except (NameError, KeyError, TypeError):
            annotation = current.model_fields[part].annotation
        current = _submodel(annotation)
    return set(current.model_fields) if current is not None else set()


def validation_error(exc: ValidationError, file: str, model: type[BaseModel] | None = None,
                     origin: Mapping[str, str] | None = None) -> ConfigError:
    """Turn pydantic's report into one message naming file, key and expectation; with
    the model, an unknown key gets the closest known one, and with origin (dotted key ->
    file) each line names the file that set the value."""
    from vigil.desired.render import is_secret  # render imports the models this checks

    lines: list[str] = []
    first_key: str | None = None
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        first_key = first_key or key
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = fields_at(model, err["loc"][:-1]) if model is not None else set()
            msg = "unknown key" + (did_you_mean(err["loc"][-1], known) or " (a typo?)")
        elif err["type"] == "missing":
            msg = "required key is missing"
        value = err.get("input")
        # a value under env (or with a secret's name) may be a secret: never echoed
        secret = any(str(p) in ("env", "secret_env") or is_secret(str(p)) for p in err["loc"])
        quiet = err["type"] in ("missing", "extra_forbidden", "value_error") or not key \
            or secret
        shown = "" if quiet else f" (got {value!r})"
        if origin:
            parts = key.split(".")
            src = next((origin[k] for k in (".".join(parts[:n]) for n in
                                            range(len(parts), 0, -1)) if k in origin), None)
            shown += f" (set in {src})" if src else ""
        lines.append(f"{key}: {msg}{shown}" if key else f"{msg}{shown}")
    message = lines[0] if len(lines) == 1 else "\n    " + "\n    ".join(lines)
    return ConfigError(message, file=file)


def parse_model(model: type[M], data: object, file: str, **extra: object) -> M:
    return parse_traced(model, {**data, **extra} if isinstance(data, dict) and extra
                        else data, file)


def parse_traced(model: type[M], data: object, file: str,
                 origin: Mapping[str, str] | None = None) -> M:
    """parse_model whose errors name the file each bad key came from (origin)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys, got {type(data).__name__}", file=file
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file, model, origin) from None
