"""The host agent as it travels: its modules joined into one stdlib script.

The agent is a package on the controller (one module per verb family, each type-checked
and tested on its own) and one script on the wire: ``python3 -c BOOTSTRAP`` reads it on
stdin and runs it (vigil/transport/remote.py), so a host needs nothing of vigil installed.
Joining is plain: the parts in dependency order, their imports of each other dropped
(they share one namespace there), the standard-library imports merged at the top. This
module runs on the controller only; it is never part of the payload.
"""

from __future__ import annotations

import ast
import functools
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Dependency order: each part imports only from parts before it (a test keeps it so).
PARTS = ("common", "files", "caches", "progress", "roles", "install", "facts", "apply",
         "probe", "stream", "smoke", "history", "reach", "agent")
OWN = "vigil.host"


def _part(name: str) -> tuple[ast.Module, list[str]]:
    text = (HERE / f"{name}.py").read_text(encoding="utf-8")
    return ast.parse(text), text.splitlines(keepends=True)


def _drop(node: ast.stmt, first: bool) -> bool:
    """Whether a top-level statement of a part stays out of the joined body: the parts'
    own docstrings (the entry's opens the script), imports (merged or internal)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)
    return docstring and first


def _imports(nodes: list[ast.stmt]) -> tuple[set[str], dict[str, set[str]]]:
    plain: set[str] = set()
    names: dict[str, set[str]] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            plain.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module not in (None, "__future__") \
                and not (node.module or "").startswith(OWN):
            names.setdefault(node.module or "", set()).update(a.name for a in node.names)
    return plain, names


@functools.cache
def source() -> str:
    """The agent script: the entry's docstring, the merged imports, then every part."""
    plain: set[str] = set()
    froms: dict[str, set[str]] = {}
    bodies: list[str] = []
    doc = ""
    for name in PARTS:
        tree, lines = _part(name)
        nodes = tree.body
        if name == "agent":
            doc = ast.get_docstring(tree) or ""
        p, f = _imports(nodes)
        plain |= p
        for module, imported in f.items():
            froms.setdefault(module, set()).update(imported)
        keep: list[str] = []
        for i, node in enumerate(nodes):
            start = node.lineno - 1
            # comments right above a statement belong to it
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            if _drop(node, i == 0):
                continue
            keep.append("".join(lines[start:node.end_lineno]))
        bodies.append(f"# --- {name}.py\n" + "\n\n".join(keep) + "\n")
    head = [f'"""{doc}\n"""\n', "from __future__ import annotations\n"]
    head += [f"import {m}\n" for m in sorted(plain)]
    head += [f"from {m} import {', '.join(sorted(n))}\n" for m, n in sorted(froms.items())]
    return "".join(head) + "\n\n" + "\n\n".join(bodies)


@functools.cache
def load() -> types.ModuleType:
    """The joined script as one module, exactly as a host runs it (one namespace: a
    test that patches a constant patches it for every verb, as on the wire)."""
    module = types.ModuleType("vigil_agent", "the host agent, joined (vigil.host.payload)")
    exec(compile(source(), "vigil-agent", "exec"), module.__dict__)
    return module
