"""Wheels the lab tests install, downloaded at most once per machine.

pip's HTTP cache keeps nothing on these machines (responses come through a TLS proxy,
bench/runtime/RESULTS.md), so a test that installs flashinfer-cubin (150 MB) would
download it on every run. ``ensure`` keeps each pinned wheel once in the pip cache
directory every lab host shares (``{lab dir}/pip-cache`` is ``/root/.cache/pip`` inside
a host, lab/hosts.py): a stack lists ``IN_HOST`` in ``find_links`` and pip and uv take
the local file. Dependencies are not kept here: the index supplies them and each host's
installer caches them (uv's cache lives in the host's kept /var/cache/vigil).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lab import hosts
from vigil.errors import ConfigError

SUBDIR = "vigil-wheels"
IN_HOST = f"/root/.cache/pip/{SUBDIR}"
UV_VERSION = "0.13.9"


def machine_dir() -> Path:
    return hosts.lab_dir() / "pip-cache" / SUBDIR


@dataclass(frozen=True)
class Wheels:
    paths: dict[str, Path]  # requirement -> its wheel in machine_dir()
    downloaded: list[str]  # the requirements this call had to download


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    # two test sessions at once must not download the same wheel into one directory
    with open(d / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _find(d: Path, requirement: str) -> Path | None:
    name, _, version = requirement.partition("==")
    dist = name.replace("-", "_").replace(".", "_").lower()
    for path in d.glob("*.whl"):
        parts = path.name.split("-")
        if len(parts) >= 3 and parts[0].lower() == dist and parts[1] == version:
            return path
    return None


def ensure(*requirements: str) -> Wheels:
    """Each ``name==version`` as a wheel in ``machine_dir()``; downloaded only if absent
    (into a scratch directory first, so a killed download leaves no partial wheel)."""
    d = machine_dir()
    d.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    downloaded: list[str] = []
    with _locked(d):
        for req in requirements:
            path = _find(d, req)
            if path is None:
                with tempfile.TemporaryDirectory(dir=d, prefix=".download-") as tmp:
                    proc = subprocess.run(
                        [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                         "--only-binary=:all:", "--disable-pip-version-check", "-d", tmp, req],
                        capture_output=True, text=True)
                    if proc.returncode != 0:
                        raise ConfigError(
                            f"downloading {req} for the lab failed: "
                            f"{proc.stderr.strip()[-500:]}",
                            fix=f"check the network, or put the wheel into {d} by hand")
                    for whl in Path(tmp).glob("*.whl"):
                        os.replace(whl, d / whl.name)
                downloaded.append(req)
                path = _find(d, req)
                if path is None:
                    raise ConfigError(f"pip downloaded no wheel named like {req} into {d}")
            found[req] = path
    return Wheels(found, downloaded)


def install_uv(index: int) -> Path:
    """The uv binary (from its cached wheel) in lab host ``index``'s /opt/vigil/bin: the
    hosts run the machine's /usr read-only, and vigil looks for uv there next."""
    target = hosts.lab_dir() / "hosts" / hosts.host_name(index) / "opt-vigil" / "bin" / "uv"
    if target.exists():
        return target
    whl = ensure(f"uv=={UV_VERSION}").paths[f"uv=={UV_VERSION}"]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(".uv.tmp")
    with zipfile.ZipFile(whl) as zf:
        member = next(n for n in zf.namelist() if n.endswith("/scripts/uv"))
        with zf.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    tmp.chmod(0o755)
    tmp.replace(target)
    return target
