"""The host agent is a package on the controller and one script on the wire
(vigil/host/payload.py): every part travels, in an order that runs, with no name
defined twice (one namespace there: a second definition would silently win)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from vigil.host import payload
from vigil.transport import remote

HOST = Path(payload.__file__).parent


def _top_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def _parse(name: str) -> ast.Module:
    return ast.parse((HOST / f"{name}.py").read_text())


def test_every_module_of_the_host_package_travels() -> None:
    modules = {p.stem for p in HOST.glob("*.py")} - {"__init__", "payload"}
    assert modules == set(payload.PARTS)
    assert payload.PARTS[-1] == "agent"  # the entry: VERBS, main, the __main__ guard


def test_each_part_imports_only_parts_before_it() -> None:
    for i, name in enumerate(payload.PARTS):
        for node in ast.walk(_parse(name)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vigil"):
                part = (node.module or "").removeprefix("vigil.host.")
                assert part in payload.PARTS[:i], f"{name}.py imports {node.module}"


def test_no_name_is_defined_by_two_parts() -> None:
    seen: dict[str, str] = {}
    for name in payload.PARTS:
        for top in _top_names(_parse(name)):
            assert top not in seen, f"{top} in both {seen[top]}.py and {name}.py"
            seen[top] = name
    joined = _top_names(ast.parse(payload.source()))
    assert sorted(joined) == sorted(seen)


def test_the_script_is_the_wires_and_runs_on_its_own() -> None:
    assert remote.agent_source() == payload.source()
    assert "from vigil" not in payload.source() and "import vigil" not in payload.source()
    # one verb, run the way a host runs it (nothing of vigil importable there)
    out = subprocess.run([sys.executable, "-I", "-c", remote.BOOTSTRAP, "no-such-verb"],
                         input=remote.agent_stdin("{}"), capture_output=True, text=True,
                         timeout=60, cwd="/", check=False)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout == '{"agent_error": "unknown verb \'no-such-verb\'"}'
