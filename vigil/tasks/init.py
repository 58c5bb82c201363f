"""``vigil init [DIR]``: scaffold an ops repository (vigil/scaffold/) that renders at once."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context

from vigil import __version__
from vigil.errors import ConfigError
from vigil.tasks.common import user_errors, vigil_task

SCAFFOLD = Path(__file__).resolve().parents[1] / "scaffold"
CI = {"github": ".github/workflows/vigil-rollout.yml", "gitlab": ".gitlab-ci.yml"}
CI_SOURCE = {"github": "ci/github-actions.yml", "gitlab": "ci/gitlab-ci.yml"}


def plan(ci: str) -> dict[str, Path]:
    """Destination (relative to the new repo) -> the scaffold file it comes from."""
    files = {str(p.relative_to(SCAFFOLD)): p for p in sorted(SCAFFOLD.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts
             and p.relative_to(SCAFFOLD).parts[0] != "ci"}
    files[".gitignore"] = files.pop("gitignore")
    files[CI[ci]] = SCAFFOLD / CI_SOURCE[ci]
    return {dest: files[dest] for dest in sorted(files)}


def scaffold(target: Path, ci: str = "github") -> list[str]:
    """Write the scaffold into target; refuse (writing nothing) if any file exists."""
    if ci not in CI:
        raise ConfigError(f"unknown CI {ci!r}", key="--ci", fix="github or gitlab")
    if target.exists() and not target.is_dir():
        raise ConfigError("exists and is not a folder", file=str(target),
                          fix="give a new or existing folder")
    files = plan(ci)
    taken = [d for d in files if (target / d).exists() or (target / d).is_symlink()]
    if taken:
        raise ConfigError(f"would overwrite {', '.join(taken)}", file=str(target),
                          fix="run vigil init in an empty folder (nothing was written)")
    for dest, source in files.items():
        text = source.read_text().replace("{vigil_version}", __version__)
        out = target / dest
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return list(files)


@vigil_task(help={"dir": "folder to create the ops repository in (default: here)",
                  "ci": "pipeline to add: github (default) or gitlab"},
            positional=["dir"], inventory=False)
def init(c: Context, dir: str | None = None, ci: str = "github") -> None:
    """Scaffold an ops repository: inventory, a profile, a stack, vigil.yaml, CI."""
    # dir defaults to None, not ".": Invoke fills only a positional still unset
    with user_errors():
        target = Path(dir or ".").expanduser().resolve()
        written = scaffold(target, ci)
    print(f"created {target}:")
    print("\n".join(f"  {d}" for d in written))
    print(f"next: cd {target} && vigil render --hosts all")
