"""Read one YAML file into a validated model: every error names the file, key and fix."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from vigil.desired.inputs import read_input
from vigil.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


# YAML 1.1 (PyYAML) reads forms that YAML 1.2 and people read otherwise: `port: 1:30` is
# 90 (sexagesimal), 0x1F90 is 8080, 010 is 8, 1_000 is 1000. Such a number is refused:
# a plain decimal is a number, anything else meant as text is quoted.
_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
# Aliases may share a value (<<: *defaults), never expand into a bomb: the document as
# the aliases spell it out is at most this many values, and has at most this many aliases.
MAX_EXPANDED_NODES = 200_000
MAX_ALIASES = 1_000


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, strict: a duplicate key, a YAML 1.1-only number (sexagesimal,
    hex, octal, binary, underscores) and an alias bomb are errors with their line."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases", event.start_mark)
        return super().compose_node(parent, index)

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None and self._aliases:
            _expanded(node, {}, set())
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor says so
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {first.line + 1})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        text = str(self.construct_scalar(node))
        if not _DECIMAL_INT.fullmatch(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is a YAML 1.1 number ({_yaml11(text)}): write it "
                "in decimal, or quote it for text", node.start_mark)
        return int(text)

    def construct_yaml_float(self, node: Any) -> float:
        text = str(self.construct_scalar(node))
        if not _PLAIN_FLOAT.fullmatch(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is a YAML 1.1 number ({_yaml11(text)}): write it "
                "in decimal, or quote it for text", node.start_mark)
        return float(super().construct_yaml_float(node))


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)


def _yaml11(text: str) -> str:
    if ":" in text:
        return "sexagesimal, base 60"
    if "_" in text:
        return "underscores dropped"
    low = text.lstrip("+-").lower()
    return {"0x": "hexadecimal", "0b": "binary", "0o": "octal"}.get(low[:2], "octal")


def _expanded(node: Any, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values the node stands for with every alias spelled out (bounded)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise yaml.composer.ComposerError(None, None, "an alias refers to a value that "
                                          "holds it (recursive)", node.start_mark)
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children: list[Any] = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        total += _expanded(child, sizes, open_)
        if total > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"its aliases expand to more than {MAX_EXPANDED_NODES} values "
                "(an alias bomb?)", node.start_mark)
    open_.discard(key)
    sizes[key] = total
    return total


def load_yaml(text: str) -> Any:
    """yaml.safe_load, strict (StrictLoader); errors are yaml.YAMLError with a mark."""
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@contextmanager
def yaml_errors(path: Path) -> Iterator[None]:
    """A YAML parse of ``path`` whose failure is one ConfigError naming the file, line
    and column (read_yaml's, and the vault reader's)."""
    try:
        yield
    except RecursionError:
        raise ConfigError("nested too deep", file=str(path),
                          fix="correct the YAML structure") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{where}invalid YAML ({problem})", file=str(path), fix="correct the YAML syntax"
        ) from None


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; a syntax error names the file, line and column."""
    text = read_input(path)
    with yaml_errors(path):
        return load_yaml(text)


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
