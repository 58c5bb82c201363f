"""Read one YAML file into a validated model: every error names the file, key and fix."""

from __future__ import annotations

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


def validation_error(exc: ValidationError, file: str) -> ConfigError:
    """Turn pydantic's report into one message naming file, key and expectation."""
    from vigil.desired.render import is_secret  # render imports the models this checks

    lines: list[str] = []
    first_key: str | None = None
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        first_key = first_key or key
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (a typo?)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        value = err.get("input")
        # a value under env (or with a secret's name) may be a secret: never echoed
        secret = any(str(p) in ("env", "secret_env") or is_secret(str(p)) for p in err["loc"])
        quiet = err["type"] in ("missing", "extra_forbidden", "value_error") or not key \
            or secret
        shown = "" if quiet else f" (got {value!r})"
        lines.append(f"{key}: {msg}{shown}" if key else f"{msg}{shown}")
    message = lines[0] if len(lines) == 1 else "\n    " + "\n    ".join(lines)
    return ConfigError(message, file=file)


def parse_model(model: type[M], data: object, file: str, **extra: object) -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys, got {type(data).__name__}", file=file
        )
    try:
        return model.model_validate({**data, **extra})
    except ValidationError as exc:
        raise validation_error(exc, file) from None
