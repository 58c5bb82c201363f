"""``vigil init [DIR]``: scaffold an ops repository (vigil/scaffold/) that renders at once.

DIR defaults to here. In a folder that already holds files (an Ansible repository) init
adds only what is missing and keeps everything that is there: its .gitignore and
README.md, and its own inventory (ansible.cfg's ``inventory =``, else ``inventory/``):
no hosts.yml beside its hosts.ini, no group_vars/all.yml beside its group_vars/all/.
Everything is checked before the first byte is written (a link anywhere on the way, a
file where a folder goes): a refusal writes nothing, and a write that fails midway takes
back what it wrote. Files are created with O_EXCL|O_NOFOLLOW and folders one by one, so
a link planted at ``inventory`` (or anywhere below the folder) is never followed.
"""

from __future__ import annotations

import configparser
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from invoke.context import Context

from vigil import __version__
from vigil.errors import ConfigError
from vigil.tasks.common import user_errors, vigil_task

SCAFFOLD = Path(__file__).resolve().parents[1] / "scaffold"
CI = {"github": ".github/workflows/vigil-rollout.yml", "gitlab": ".gitlab-ci.yml"}
CI_SOURCE = {"github": "ci/github-actions.yml", "gitlab": "ci/gitlab-ci.yml"}
IGNORED = ("/state/", "/rendered/", "/reports/")  # the scaffold's .gitignore lines


def plan(ci: str) -> dict[str, Path]:
    """Destination (relative to the new repo) -> the scaffold file it comes from."""
    files = {str(p.relative_to(SCAFFOLD)): p for p in sorted(SCAFFOLD.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts
             and p.relative_to(SCAFFOLD).parts[0] != "ci"}
    files[".gitignore"] = files.pop("gitignore")
    files[CI[ci]] = SCAFFOLD / CI_SOURCE[ci]
    return {dest: files[dest] for dest in sorted(files)}


@dataclass
class Layout:
    """Where the repo's inventory is: ``setting`` for vigil.yaml, ``folder`` (relative)
    holding group_vars/, models/ and stacks/, and whether it has its own hosts."""

    setting: str = "inventory"
    folder: str = "inventory"
    own_hosts: bool = False
    said_by: str = ""  # "ansible.cfg" when it came from there
    kept: list[str] = field(default_factory=list)


def _lexists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def layout(target: Path) -> Layout:
    """The repo's own inventory: ansible.cfg's [defaults] inventory, else inventory/."""
    cfg = target / "ansible.cfg"
    if cfg.is_file() and not cfg.is_symlink():
        parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",
                                                                                        "#"))
        try:
            parser.read_string(cfg.read_text(errors="replace"), str(cfg))
        except configparser.Error as exc:
            raise ConfigError(f"cannot read it: {str(exc).splitlines()[0]}", file=str(cfg),
                              fix="fix ansible.cfg, or run vigil init in a folder of its "
                              "own (nothing was written)") from None
        said = parser.get("defaults", "inventory", fallback="").split(",")[0].strip()
        if said:
            path = Path(os.path.normpath(target / Path(said).expanduser()))
            if not path.is_relative_to(target):
                raise ConfigError(f"its inventory {said} is outside {target}", file=str(cfg),
                                  key="inventory", fix="run vigil init in the folder that "
                                  "holds the inventory, or write vigil.yaml's inventory: "
                                  "yourself (nothing was written)")
            rel = path.relative_to(target)
            if path.is_file():
                folder = str(rel.parent) if str(rel.parent) != "." else "."
                return Layout(str(rel), folder, True, "ansible.cfg")
            return Layout(str(rel), str(rel), _has_hosts(path), "ansible.cfg")
    return Layout(own_hosts=_has_hosts(target / "inventory"))


def _has_hosts(folder: Path) -> bool:
    from vigil.desired.inventory import HOSTS_FILES  # its library: when init runs

    return any(_lexists(folder / n) for n in (*HOSTS_FILES, "hosts.d"))


def _taken_by_a_twin(path: Path) -> bool:
    """group_vars/all.yml when group_vars/all/, all.yaml or all.json is there (vigil
    refuses two files of one name)."""
    stem, dot, ext = path.name.rpartition(".")
    if not dot or f".{ext}" not in (".yml", ".yaml", ".json"):
        return False
    return any(_lexists(path.parent / f"{stem}{ext}")
               for ext in ("", ".yml", ".yaml", ".json") if f"{stem}{ext}" != path.name)


def _refuse(why: str, path: Path) -> ConfigError:
    return ConfigError(why, file=str(path), fix="move it out of the way, or run vigil init "
                       "in another folder (nothing was written)")


def _check_way(target: Path, dest: str) -> None:
    """Every folder on the way to dest is a real folder (or absent); dest no link."""
    here = target
    parts = Path(dest).parts
    for i, part in enumerate(parts):
        here = here / part
        if here.is_symlink():
            raise _refuse(f"is a symbolic link (to {os.readlink(here)}): vigil init writes "
                          "only into real folders", here)
        if i < len(parts) - 1 and here.exists() and not here.is_dir():
            raise _refuse(f"is not a folder, and {dest} goes in it", here)
    if here.exists() and not stat.S_ISREG(here.lstat().st_mode):
        raise _refuse(f"is not a regular file, and vigil init would write {dest} there", here)


def scaffold(target: Path, ci: str = "github") -> tuple[list[str], list[str]]:
    """Write what the scaffold has and target lacks: (written, kept). Everything is
    checked first; a failed write takes back what it wrote."""
    if ci not in CI:
        raise ConfigError(f"unknown CI {ci!r}", key="--ci", fix="github or gitlab")
    if _lexists(target) and not target.is_dir():
        raise ConfigError("exists and is not a folder", file=str(target),
                          fix="give a new or existing folder")
    where = layout(target) if target.is_dir() else Layout()
    wanted: dict[str, str] = {}
    kept: list[str] = []
    for dest, source in plan(ci).items():
        if dest.startswith("inventory/"):
            rest = dest.removeprefix("inventory/")
            dest = str(Path(where.folder) / rest) if where.folder != "." else rest
            if rest == "hosts.yml" and where.own_hosts and not _lexists(target / dest):
                kept.append(f"{where.setting} (your hosts; no {rest} beside it)")
                continue
        _check_way(target, dest)
        out = target / dest
        if out.exists():
            kept.append(dest)
            continue
        if _taken_by_a_twin(out):
            kept.append(f"{dest} (yours: {out.name.rpartition('.')[0]} is there)")
            continue
        text = source.read_text().replace("{vigil_version}", __version__)
        if dest == "vigil.yaml" and where.setting != "inventory":
            text = text.replace("\ninventory: inventory\n",
                                f"\ninventory: {where.setting}  # as ansible.cfg says\n")
        wanted[dest] = text
    _write(target, wanted)
    return list(wanted), kept


def _write(target: Path, files: dict[str, str]) -> None:
    made: list[Path] = []  # files and folders this run created, to take back on failure
    try:
        if not target.exists():
            target.mkdir(parents=True)
            made.append(target)
        for dest, text in files.items():
            here = target
            for part in Path(dest).parts[:-1]:
                here = here / part
                try:
                    os.mkdir(here)
                    made.append(here)
                except FileExistsError:
                    if here.is_symlink() or not here.is_dir():  # changed since the check
                        raise _refuse("is no longer a real folder", here) from None
            out = target / dest
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            made.append(out)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    except OSError as exc:
        _take_back(made)
        raise ConfigError(f"cannot write: {exc.strerror or exc}",
                          file=str(exc.filename or target),
                          fix="check the folder's permissions and free space (what this "
                          "run wrote was removed)") from None
    except ConfigError:
        _take_back(made)
        raise


def _take_back(made: list[Path]) -> None:
    for path in reversed(made):
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        except OSError:
            pass


@vigil_task(help={"dir": "folder to create the ops repository in (default: here); in an "
                         "existing repository only the missing files are added",
                  "ci": "pipeline to add: github (default) or gitlab"},
            positional=["dir"], inventory=False)
def init(c: Context, dir: str | None = None, ci: str = "github") -> None:
    """Scaffold an ops repository: inventory, a profile, a stack, vigil.yaml, CI."""
    # `vigil init` with no DIR is `vigil init .` (vigil/cli.py: Invoke requires a
    # positional, so the command line gets "." before Invoke parses it)
    with user_errors():
        target = Path(os.path.abspath(Path(dir or ".").expanduser()))
        written, kept = scaffold(target, ci)
    if written:
        print(f"added to {target}:" if kept else f"created {target}:")
        print("\n".join(f"  {d}" for d in written))
    else:
        print(f"nothing to add: {target} has every file vigil init writes")
    if kept:
        print("kept as they are:")
        print("\n".join(f"  {d}" for d in kept))
    gitignore = target / ".gitignore"
    if ".gitignore" in kept and gitignore.is_file():
        lines = set(gitignore.read_text(errors="replace").split())
        missing = [ln for ln in IGNORED if ln not in lines]
        if missing:
            print(f"your .gitignore lacks {', '.join(missing)}: vigil's state, rendered "
                  "files and reports")
    print(f"next: cd {target} && vigil render --hosts all")
