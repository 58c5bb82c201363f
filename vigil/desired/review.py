"""What `invoke render` shows: every file a deploy would write, and where each variable
came from (role defaults < group_vars/all < group < host < --set). Secrets masked."""

from __future__ import annotations

import json
from pathlib import Path

from vigil.desired.render import MASK, is_secret
from vigil.desired.targets import Target


def write_files(t: Target, out: Path) -> list[str]:
    """The unit, the env file (masked, 0600) and each user role's files under out/<role>/."""
    out.mkdir(parents=True, exist_ok=True)
    unit = out / Path(t.rendered.paths.unit).name
    env = out / Path(t.rendered.paths.env).name
    unit.write_text(t.rendered.unit_text)
    env.write_text(t.rendered.env_masked)
    env.chmod(0o600)
    written = [str(unit), f"{env}  (secrets masked)"]
    for role in t.roles:
        for f in role.files:
            path = out / role.name / f.dest.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f.content)
            written.append(f"{path}  (-> {f.dest}, mode {f.mode}, owner {f.owner})")
    return written


def _shown(key: str, value: object, secrets: frozenset[str]) -> str:
    if key == "env" and isinstance(value, dict):
        value = {k: MASK if is_secret(k, secrets) else v for k, v in value.items()}
    return json.dumps(value, sort_keys=True, default=str)


def variables(t: Target) -> list[str]:
    """One line per variable: name, value, and the file (or flag) that set it."""
    values = {**t.vars.model_dump(), **t.role_vars}
    secrets = frozenset(t.vars.secret_env)
    width = max(len(k) for k in values)
    return [f"{k:<{width}} = {_shown(k, values[k], secrets)}  ({t.origin.get(k, 'vigil default')})"
            for k in sorted(values)]
