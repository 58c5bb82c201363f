"""Templates run as untrusted code: Jinja's sandbox, a deadline and a size cap.

A role may come from someone else's repository and an ops repo may override the service
templates, so a template is code that runs on the controller. It renders in
``ImmutableSandboxedEnvironment`` (no ``cycler.__init__.__globals__``, no ``__class__``
walks, no mutation of lists and dicts), and on top of that:

* time: every loop step, call, filter and intercepted operator checks a deadline
  (``MAX_SECONDS``), so nested loops with no output stop too;
* size: the output, and every value a filter, call, operator, ``~`` or ``{% set %}``
  block makes, is at most ``MAX_SIZE`` characters or items; the few steps that could
  make a far larger value in one go (``*``, ``**``, ``%``, ``center``, ``indent``,
  ``replace``, ``join``, ``format``, str's ``ljust``/``zfill``/…) are refused before
  they run, not after the memory is gone;
* errors: a syntax error, an undefined name, a ZeroDivisionError, a missing include, a
  security error or a limit is one ``TemplateError`` naming the file and line.

Loops and output are reached through Jinja's documented ``code_generator_class``: the
template's tree is rewritten before code is made for it (each ``for``'s iterable, each
piece of output, each ``~`` and set block passes through a checking filter), so no
compiled-code internals are patched.
"""

from __future__ import annotations

import contextlib
import functools
import re
import string
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from vigil.errors import TemplateError

MAX_SECONDS = 5.0  # a template renders in milliseconds; this is a runaway
MAX_SIZE = 1 << 20  # characters of output, and characters or items of any one value
MAX_WORK = 64 << 20  # characters of all the values one render makes, output included
MAX_INT_BITS = 1 << 14  # ~4900 digits: more than any file needs, far from a slow pow
_EACH = "vigil_each"  # the filters the rewritten tree calls (names a template may use too)
_SIZED = "vigil_sized"
_EMIT = "vigil_emit"
_FIX = "templates render in a sandbox: use the variables vigil passes and Jinja's filters"


class TemplateLimit(jinja2.TemplateRuntimeError):
    """A template went past a render limit (time or size)."""


_active = threading.local()  # deadline and work so far of the render in this thread


def _tick() -> None:
    deadline: float | None = getattr(_active, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimit(f"rendering took longer than {MAX_SECONDS:g} s (a loop or "
                            "recursion that does not end soon); stopped")


def _too_big(what: str, size: int) -> TemplateLimit:
    return TemplateLimit(f"{what} would hold {size:,} characters or items, over the "
                         f"limit of {MAX_SIZE:,}")


def _too_many_bits(what: str, bits: int) -> TemplateLimit:
    return TemplateLimit(f"{what} would have {bits:,} bits, over the limit of "
                         f"{MAX_INT_BITS:,}")


def _sized(value: Any) -> Any:
    """The value, when it is within the size cap (ints: within MAX_INT_BITS); its size
    counts towards the render's work, so many values under the cap cannot add up to
    memory the controller does not have (a join of a million large pieces)."""
    if isinstance(value, str | bytes | list | tuple | dict | set | frozenset):
        if len(value) > MAX_SIZE:
            raise _too_big("a value", len(value))
        if getattr(_active, "deadline", None) is None:
            return value  # no render running: nothing to add up
        _active.work += len(value)
        if _active.work > MAX_WORK:
            raise TemplateLimit(f"the values rendering made add up to over the limit of "
                                f"{MAX_WORK:,} characters (a loop or recursion making text "
                                "without end); stopped")
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _too_many_bits("an integer", value.bit_length())
    return value


# The rewritten tree's filters take the context only so that Jinja never runs them once
# at compile time on a constant (a constant text in a loop must count at each step).


@jinja2.pass_context
def _each(_: Any, iterable: Iterable[Any]) -> Iterator[Any]:
    """A for loop's items, checking the deadline at each step."""
    for item in iterable:
        _tick()
        yield item


@jinja2.pass_context
def _emit(_: Any, value: Any) -> Any:
    """One piece of output (also of a macro's, a loop's or a set block's buffer)."""
    _tick()
    _sized(value if isinstance(value, str) else str(value))
    return value


@jinja2.pass_context
def _sized_value(_: Any, value: Any) -> Any:
    return _sized(value)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple) else len(str(value))


def _check_widths(fmt: str) -> None:
    """Refuse a format string whose width or precision would make a huge string."""
    specs = re.findall(r"%[-#0 +]*(\d*)(?:\.(\d*))?", fmt)
    with contextlib.suppress(ValueError):  # not a str.format string: format() says so
        specs += [(m, "") for _, _, spec, _ in string.Formatter().parse(fmt) if spec
                  for m in re.findall(r"\d+", spec)]
    for width, precision in specs:
        for digits in (width, precision):
            if digits and (len(digits) > 7 or int(digits) > MAX_SIZE):
                raise _too_big("a formatted field", int(digits[:18]))


def _before_filter(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse the filters that could make a value far over the cap in one step."""
    if not args:
        return
    value, rest = args[0], args[1:]
    opt = [*rest, *kwargs.values()]
    if name == "center" and opt and isinstance(opt[0], int):
        size = opt[0]
    elif name == "indent":
        width = opt[0] if opt else 4
        per = width if isinstance(width, int) else _size(width)
        size = _size(value) + per * (str(value).count("\n") + 1)
    elif name == "replace" and len(opt) >= 2:
        old, new = str(opt[0]), str(opt[1])
        size = _size(value) + max(0, len(new) - len(old)) * (
            str(value).count(old) if old else _size(value) + 1)
    elif name == "format":
        _check_widths(str(value))
        return
    elif name == "join" and isinstance(value, list):  # run() made a generator a list
        sep = str(kwargs.get("d", rest[0] if rest else ""))
        size = sum(_size(x) for x in value) + len(sep) * len(value)
    else:
        return
    if size > MAX_SIZE:
        raise _too_big(f"the result of |{name}", size)


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that checks the deadline and the size of what it is given and makes."""
    passes = getattr(func, "jinja_pass_arg", None) is not None

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        _tick()
        lead, args = (args[:1], args[1:]) if passes else ((), args)
        if name == "join" and args and not isinstance(args[0], str):
            args = (list(args[0]), *args[1:])  # to size it before joining
        _before_filter(name, args, kwargs)
        return _sized(func(*lead, *args, **kwargs))

    return run


class _Filters(dict[str, Any]):
    """env.filters, every filter bounded, also those a caller adds after construction."""

    def __setitem__(self, name: str, func: Any) -> None:
        super().__setitem__(name, _bounded_filter(name, func))


_GROWING = frozenset({"ljust", "rjust", "center", "zfill"})  # the width is argument 0


def _before_call(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse a str/bytes method call that would make a value far over the cap."""
    owner = getattr(obj, "__self__", None)
    if not isinstance(owner, str | bytes):
        return
    name = getattr(obj, "__name__", "")
    size = 0
    if name in _GROWING and args and isinstance(args[0], int):
        size = args[0]
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        tabs = owner.count(b"\t") if isinstance(owner, bytes) else owner.count("\t")
        size = len(owner) + tabs * (tab if isinstance(tab, int) else 0)
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if type(old) is type(owner) and isinstance(new, str | bytes):
            hits = owner.count(old) if old else len(owner) + 1  # type: ignore[arg-type]
            size = len(owner) + max(0, len(new) - len(old)) * hits
    elif name == "join" and args and isinstance(args[0], list | tuple):
        size = sum(_size(x) for x in args[0]) + len(owner) * len(args[0])
    if size > MAX_SIZE:
        raise _too_big(f"the result of .{name}()", size)


def _before_binop(op: str, left: Any, right: Any) -> None:
    """Refuse an operator whose result would be far over the caps."""
    seqs = (str, bytes, list, tuple)
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, seqs) and isinstance(n, int) and len(seq) * n > MAX_SIZE:
                raise _too_big("a repeated value", len(seq) * n)
        if isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _too_many_bits("a product", left.bit_length() + right.bit_length())
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if abs(left) > 1 and (left.bit_length() - 1) * right > MAX_INT_BITS:
            raise _too_many_bits("a power", (left.bit_length() - 1) * right)
    elif op == "%" and isinstance(left, str):
        _check_widths(left)
    elif op == "+" and isinstance(left, seqs) and isinstance(right, seqs) \
            and len(left) + len(right) > MAX_SIZE:
        raise _too_big("a sum", len(left) + len(right))


class _Bound(NodeTransformer):
    """Route a template's loops, ``~`` and set blocks through the checking filters."""

    @staticmethod
    def _wrap(node: nodes.Node, name: str) -> nodes.Filter:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._wrap(node.iter, _EACH)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._wrap(node, _SIZED)

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node:
        self.generic_visit(node)
        if node.filter is None:  # the body's text (a filter's result is bounded anyway)
            node.filter = nodes.Filter(None, _SIZED, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [self._wrap(n, _EMIT) for n in node.nodes]
        return node


class _Generator(CodeGenerator):
    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        super().visit_Template(_Bound().visit(node), frame)


class Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with vigil's render limits (see the module's words)."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        bounded = _Filters()
        for name, func in {**self.filters, _EACH: _each, _SIZED: _sized_value,
                           _EMIT: _emit}.items():
            bounded[name] = func
        self.filters = bounded
        self.globals.pop("lipsum", None)  # lipsum(n=10**9): text no config file needs

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _tick()
        _before_call(__obj, args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _before_binop(operator, left, right)
        return _sized(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_widths(fmt)
            return str(_sized(wrapped(*args, **kwargs)))

        return checked


def _generate(template: jinja2.Template, context: Mapping[str, Any]) -> str:
    parts: list[str] = []
    size = 0
    previous = getattr(_active, "deadline", None), getattr(_active, "work", 0)
    _active.deadline, _active.work = time.monotonic() + MAX_SECONDS, 0
    try:
        for chunk in template.generate(**context):
            _tick()
            size += len(chunk)
            if size > MAX_SIZE:
                raise _too_big("the rendered file", size)
            parts.append(chunk)
    finally:
        _active.deadline, _active.work = previous
    return "".join(parts)


def _template_line(exc: BaseException, dirs: list[str]) -> tuple[str, int] | None:
    """The innermost template file and line in an error's traceback (Jinja rewrites
    the frames of compiled templates to the template's own file and line)."""
    roots = [Path(d).resolve() for d in dirs]
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_absolute() and frame.lineno and any(
                path.resolve().is_relative_to(r) for r in roots):
            found = (frame.filename, frame.lineno)
    return found


def render_template(jenv: jinja2.Environment, name: str, context: Mapping[str, Any],
                    where: str, *, undefined_fix: str) -> str:
    """Render one template within the limits; any failure is one TemplateError naming
    the file and line (``where`` is the file ``name`` resolves to)."""
    dirs = list(getattr(jenv.loader, "searchpath", []))
    try:
        return _generate(jenv.get_template(name), context)
    except jinja2.TemplateSyntaxError as exc:
        file = exc.filename or where
        raise TemplateError(f"line {exc.lineno}: {exc.message}", file=file) from None
    except jinja2.TemplateNotFound as exc:
        at = _template_line(exc, dirs)
        if at is None:
            raise TemplateError("template not found", file=where,
                                fix="restore it from the repository") from None
        raise TemplateError(f"line {at[1]}: includes {exc.name!r}, which is not there",
                            file=at[0], fix="include only files of this templates "
                            f"folder ({', '.join(dirs)})") from None
    except Exception as exc:  # RecursionError and MemoryError included
        at = _template_line(exc, dirs)
        file, line = at if at is not None else (where, None)
        head = f"line {line}: " if line is not None else ""
        if isinstance(exc, jinja2.UndefinedError):
            what, fix = str(exc), undefined_fix
        elif isinstance(exc, TemplateLimit | jinja2.TemplateError):
            what, fix = str(exc), _FIX
        else:  # a Python error raised by the template's own expression (1/0, int("x"))
            what, fix = f"{type(exc).__name__}: {exc}", _FIX
        raise TemplateError(head + what, file=file, fix=fix) from None
