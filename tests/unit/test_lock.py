"""Locked stacks (issue 22.18) against real tools: `invoke stack.lock` resolves a stack
with the real uv from tiny local wheels, the real agent installs exactly the lock (pip,
hashes required), and the same check judges transitive drift. The incident's shape: vllm
pulls flashinfer-cubin without a pin, so without a lock it floats."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_payload import agent
from tests.doubles import VLLM_344, listing, wheel
from vigil.deploy.runtime import install_payload, verify_install
from vigil.desired import inventory
from vigil.desired import lock as lockfile
from vigil.desired.render import stack_hash
from vigil.desired.stacks import check
from vigil.errors import ConfigError

PINS = {"vllm": VLLM_344, "flashinfer-python": "0.6.4", "torch": "2.10.0"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    wheel(d, "vllm", VLLM_344, ("torch", "flashinfer-python", "flashinfer-cubin"), "vllm")
    wheel(d, "flashinfer-python", "0.6.4", module="flashinfer")
    wheel(d, "flashinfer-cubin", "0.6.4", module="flashinfer_cubin")
    wheel(d, "torch", "2.10.0", module="torch")
    return d


def _inventory(root: Path, wheels: Path) -> Path:
    inv = root / "inventory"
    (inv / "stacks").mkdir(parents=True)
    (inv / "hosts.yml").write_text("hosts: {}\n")
    pins = "".join(f"  {n}: \"{v}\"\n" for n, v in PINS.items())
    (inv / "stacks" / "t.yml").write_text(
        f"name: t\npackages:\n{pins}find_links: [{wheels}]\n"
        f"index_url: {(wheels / 'simple').as_uri()}\n")
    (wheels / "simple").mkdir(exist_ok=True)  # an empty index: nothing from the network
    return inv


def _lock(inv: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", "stack.lock", "--stack", "t",
                           "-i", str(inv), "--python-version",
                           f"{sys.version_info.major}.{sys.version_info.minor}", *extra],
                          capture_output=True, text=True, timeout=300, cwd=inv.parent)


def test_stack_lock_resolves_every_package_exact_and_hashed(tmp_path: Path,
                                                           wheels: Path) -> None:
    inv = _inventory(tmp_path, wheels)
    done = _lock(inv)
    assert done.returncode == 0, done.stderr
    assert "4 packages" in done.stdout and "new" in done.stdout
    text = (inv / "stacks" / "t.lock").read_text()
    lock = lockfile.parse(text, "t.lock")
    # the transitive one the stack does not pin is now exact too
    assert lock.pins == {"vllm": VLLM_344, "flashinfer-python": "0.6.4",
                         "flashinfer-cubin": "0.6.4", "torch": "2.10.0"}
    assert all(h.startswith("sha256:") for hs in lock.hashes.values() for h in hs)
    assert str(wheels) not in text and "index-url" not in text  # where from stays out
    again = _lock(inv)
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout
    # the lock is part of the stack and of its environment's name
    st = inventory.load(inv).stack("t")
    assert st.lock == text
    assert stack_hash(st) != stack_hash(inventory.load(inv).stack("t", with_lock=False))


def test_a_lock_that_no_longer_matches_the_pins_fails_before_any_host(
        tmp_path: Path, wheels: Path) -> None:
    inv = _inventory(tmp_path, wheels)
    assert _lock(inv).returncode == 0
    yml = inv / "stacks" / "t.yml"
    yml.write_text(yml.read_text().replace('torch: "2.10.0"', 'torch: "2.9.1"'))
    with pytest.raises(ConfigError) as err:
        inventory.load(inv).stack("t")
    assert "torch: stack ==2.9.1, lock ==2.10.0" in str(err.value)
    assert "invoke stack.lock --stack t" in str(err.value)
    (inv / "stacks" / "t.lock").write_text("vllm>=0.1\n")
    yml.write_text(yml.read_text().replace('torch: "2.9.1"', 'torch: "2.10.0"'))
    with pytest.raises(ConfigError, match=re.escape("line 1: 'vllm>=0.1' is not an exact")):
        inventory.load(inv).stack("t")


def test_the_agent_installs_exactly_the_lock_and_refuses_a_wrong_hash(
        tmp_path: Path, wheels: Path) -> None:
    inv = _inventory(tmp_path, wheels)
    assert _lock(inv).returncode == 0
    st = inventory.load(inv).stack("t")
    env_dir = tmp_path / "envs" / "t-abc"
    payload = {**install_payload(st, str(env_dir), installer="pip"),
               "python": sys.executable}
    reply = agent.install_env(payload)
    assert reply["ok"], reply
    assert verify_install(st, reply) == []
    assert (tmp_path / "envs" / "t-abc.lock.txt").read_text() == st.lock
    # drift from the lock: the floating package moved, another came in
    drifted = {**listing(env_dir), "flashinfer-cubin": "0.6.3", "extra-thing": "1.0"}
    found = {(f.package, f.expected) for f in check(st, drifted) if f.rule == "lock"}
    assert found == {("flashinfer-cubin", "locked ==0.6.4"), ("extra-thing", "not in the lock")}
    # a lock whose hash is not the wheel's: nothing installs
    assert st.lock is not None
    bad_lock = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, st.lock)
    assert bad_lock != st.lock
    broken = agent.install_env({**payload, "env_dir": str(tmp_path / "envs" / "t-bad"),
                                "lock": bad_lock})
    assert not broken["ok"] and not (tmp_path / "envs" / "t-bad").exists()
    assert "hash" in (broken.get("tail") or "").lower(), broken
