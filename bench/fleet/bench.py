"""Fleet benchmarks on stand-in lab hosts (lab/fleet.py): no-op re-deploy at 1/8/32 hosts,
a rolling deploy of 32 hosts in 25 % batches with one host made to fail, and `verify`
of 32 starting hosts. Every number is `invoke` run as a user runs it (process start
included), over real SSH to real systemd hosts. Run it under the lab lock:

    flock /tmp/vigil-lab.lock .venv/bin/python bench/fleet/bench.py --hosts 32 --runs 5

Writes bench/fleet/last.json; RESULTS.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lab import fleet, hosts  # noqa: E402

INVOKE = str(REPO / ".venv" / "bin" / "invoke")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def invoke(inv: Path, state: Path, *args: str) -> tuple[int, float, float, str]:
    """(exit code, wall s, controller CPU s, output) of one `invoke` run."""
    env = {**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv), "INVOKE_VIGIL_STATE_DIR": str(state)}
    cpu0, t0 = children_cpu(), time.monotonic()
    done = subprocess.run([INVOKE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=3600)
    return done.returncode, time.monotonic() - t0, children_cpu() - cpu0, done.stdout + done.stderr


def machine_cpu() -> float:
    """CPU seconds the whole machine spent (every lab host runs on it too)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    # user nice system irq softirq: not idle, iowait, steal, or guest (counted in user)
    busy = sum(int(v) for i, v in enumerate(fields) if i in (0, 1, 2, 5, 6))
    return busy / os.sysconf("SC_CLK_TCK")


def noop(inv: Path, state: Path, names: list[str], runs: int, out: Path) -> dict[str, Any]:
    walls, cpus, trips, machine = [], [], [], []
    for _ in range(runs):
        m0 = machine_cpu()
        code, wall, cpu, text = invoke(inv, state, "deploy", "--hosts", ",".join(names),
                                       "--json", str(out))
        data = json.loads(out.read_text())["hosts"]
        if code != 0 or any(r["status"] != "ok" for r in data.values()):
            raise SystemExit(f"no-op deploy was not a no-op (exit {code}):\n{text[-3000:]}")
        machine.append(machine_cpu() - m0)
        walls.append(wall)
        cpus.append(cpu)
        trips += [r["round_trips"] for r in data.values()]
    return {"hosts": len(names), "runs": runs, "wall_median_s": round(statistics.median(walls), 2),
            "wall_min_s": round(min(walls), 2), "wall_max_s": round(max(walls), 2),
            "cpu_median_s": round(statistics.median(cpus), 2),
            "machine_cpu_median_s": round(statistics.median(machine), 2),
            "round_trips_per_host": sorted(set(trips))}


PLAYBOOK = """\
- hosts: standin
  gather_facts: false
  tasks:
    - ansible.builtin.copy:
        src: "files/{{ inventory_hostname }}.service"
        dest: /etc/systemd/system/vllm-standin.service
        mode: "0644"
      notify: restart
    - ansible.builtin.copy:
        src: "files/{{ inventory_hostname }}.env"
        dest: /etc/vigil/vllm-standin.env
        mode: "0600"
      notify: restart
    - ansible.builtin.systemd_service:
        name: vllm-standin
        state: started
        enabled: true
  handlers:
    - name: restart
      ansible.builtin.systemd_service:
        name: vllm-standin
        state: restarted
        daemon_reload: true
"""


def ansible_setup(playbook_bin: str, inv: Path, work: Path, nums: list[int]) -> Path:
    """The same unit and env file vigil renders, as an Ansible project (bench only)."""
    from vigil.desired import inventory, targets

    d = work / "ansible"
    (d / "files").mkdir(parents=True, exist_ok=True)
    for t in targets.resolve(inventory.load(inv), "standin"):
        (d / "files" / f"{t.name}.service").write_text(t.rendered.unit_text)
        (d / "files" / f"{t.name}.env").write_text(t.rendered.env_text)
    lines = ["[standin]"] + [
        f"{hosts.host_name(i)} ansible_host=127.0.0.1 ansible_port={hosts.host_port(i)}"
        for i in nums]
    lines += ["[all:vars]", "ansible_user=root",
              f"ansible_ssh_private_key_file={hosts.key_path()}",
              f"ansible_ssh_common_args='-o UserKnownHostsFile={hosts.known_hosts_path()}'",
              "ansible_python_interpreter=/usr/bin/python3",
              "ansible_remote_tmp=/tmp/.ansible-tmp"]  # /root is read-only on lab hosts
    (d / "hosts.ini").write_text("\n".join(lines) + "\n")
    (d / "ansible.cfg").write_text(
        f"[defaults]\nforks = {len(nums)}\nhost_key_checking = True\n"
        "[ssh_connection]\npipelining = True\n")
    (d / "site.yml").write_text(PLAYBOOK)
    return d


def ansible_noop(playbook_bin: str, d: Path, names: list[str], runs: int, *,
                 check: bool = True) -> dict[str, Any]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(d / "ansible.cfg")}
    walls, cpus = [], []
    for _ in range(runs):
        cpu0, t0 = children_cpu(), time.monotonic()
        done = subprocess.run([playbook_bin, "-i", "hosts.ini", "site.yml", "--limit",
                               ",".join(names)], cwd=d, env=env, capture_output=True,
                              text=True, timeout=600)
        walls.append(time.monotonic() - t0)
        cpus.append(children_cpu() - cpu0)
        recap = [ln for ln in done.stdout.splitlines() if "changed=" in ln]
        if check and (done.returncode != 0 or any("changed=0" not in ln for ln in recap)):
            raise SystemExit(f"ansible no-op was not a no-op:\n{done.stdout[-3000:]}")
    return {"hosts": len(names), "runs": runs,
            "wall_median_s": round(statistics.median(walls), 2),
            "wall_min_s": round(min(walls), 2), "wall_max_s": round(max(walls), 2),
            "cpu_median_s": round(statistics.median(cpus), 2)}


def watch_starts(inv: Path, state: Path, work: Path, result: dict[str, Any]) -> None:
    # verify of every host starting at once: controller CPU per host per poll
    code, _, _, text = invoke(inv, state, "deploy", "--hosts", "standin", "--restart",
                              "--no-wait")
    if code != 0:
        raise SystemExit(f"restart failed (exit {code}):\n{text[-3000:]}")
    code, wall, cpu, _ = invoke(inv, state, "verify", "--hosts", "standin", "--json",
                                   str(work / "verify.json"))
    ver = json.loads((work / "verify.json").read_text())["hosts"]
    polls = sum(h["polls"] for h in ver.values())
    result["verify"] = {"exit": code, "wall_s": round(wall, 1), "cpu_s": round(cpu, 2),
                        "polls": polls, "verdicts": sorted({h["verdict"] for h in ver.values()}),
                        "cpu_per_host_poll_ms": round(1000 * cpu / max(1, polls), 1),
                        "cores_while_watching": round(cpu / wall, 2)}
    print("verify", result["verify"], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ansible", help="ansible-playbook of a bench-only environment: "
                    "compare the no-op runs with it")
    ap.add_argument("--only-noop", action="store_true",
                    help="only the no-op runs, with the whole machine's CPU beside vigil's")
    ap.add_argument("--only-verify", action="store_true",
                    help="only the verify part (use a slower --speed: more polls per start)")
    ap.add_argument("--speed", type=float, default=0.05,
                    help="stand-in time scale of the recorded start (0.05: ~4.5 s)")
    args = ap.parse_args()
    nums = fleet.indexes(args.hosts)
    names = [hosts.host_name(i) for i in nums]
    work = Path(tempfile.mkdtemp(prefix="vigil-fleet-bench-"))
    inv, state = work / "inv", work / "state"
    result: dict[str, Any] = {"hosts": args.hosts, "speed": args.speed}

    before = {h.name for h in hosts.status() if h.running}
    try:
        run(args, nums, names, inv, state, work, result)
    finally:  # hosts this run booted go down again; lab1/lab2 of others stay as they were
        ours = [hosts.host_name(i) for i in range(1, max(nums) + 1)
                if hosts.host_name(i) not in before]
        if ours:
            hosts.down(ours)
        fleet.stop(i for i in nums if hosts.host_name(i) in before)


def run(args: argparse.Namespace, nums: list[int], names: list[str], inv: Path, state: Path,
        work: Path, result: dict[str, Any]) -> None:
    t0 = time.monotonic()
    hosts.up(max(nums), timeout=900)
    fleet.provision(nums)
    result["lab_up_s"] = round(time.monotonic() - t0, 1)

    fleet.write_inventory(inv, nums, speed=args.speed, env={"STANDIN_RELEASE": "a"})
    code, wall, cpu, text = invoke(inv, state, "deploy", "--hosts", "standin")
    if code != 0:
        raise SystemExit(f"first deploy failed (exit {code}):\n{text[-3000:]}")
    result["first_deploy"] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    print("first deploy", result["first_deploy"], flush=True)

    if args.only_noop:
        result["noop"] = [noop(inv, state, names[:n], args.runs, work / f"noop{n}.json")
                          for n in sorted({1, min(8, len(names)), len(names)})]
        (REPO / "bench" / "fleet" / "last-noop.json").write_text(
            json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    if args.only_verify:
        watch_starts(inv, state, work, result)
        (REPO / "bench" / "fleet" / "last-verify.json").write_text(
            json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    result["noop"] = [noop(inv, state, names[:n], args.runs, work / f"noop{n}.json")
                      for n in sorted({1, min(8, len(names)), len(names)})]
    for row in result["noop"]:
        print("no-op", row, flush=True)
    if args.ansible:
        d = ansible_setup(args.ansible, inv, work, nums)
        version = subprocess.run([args.ansible, "--version"], capture_output=True, text=True)
        result["ansible_version"] = version.stdout.splitlines()[0]
        # one run first: Ansible's ControlPersist keeps SSH masters for 60 s; both warm
        ansible_noop(args.ansible, d, names, 1, check=False)
        try:
            result["ansible_noop"] = [ansible_noop(args.ansible, d, names[:n], args.runs)
                                      for n in sorted({1, min(8, len(names)), len(names)})]
        except SystemExit as exc:  # keep vigil's numbers; say what Ansible did
            result["ansible_error"] = str(exc)[-2000:]
        for row in result.get("ansible_noop", []):
            print("ansible no-op", row, flush=True)
    save(result)

    watch_starts(inv, state, work, result)
    save(result)

    # rolling release b in quarters; one host of the third batch crashes while compiling
    bad = nums[len(nums) // 2 + 1]
    fleet.write_inventory(inv, nums, speed=args.speed, env={"STANDIN_RELEASE": "b"},
                          host_env={bad: {"STANDIN_CRASH_AT": "compiling"}})
    code, wall, cpu, text = invoke(inv, state, "deploy", "--hosts", "standin", "--serial",
                                   "25%", "--rollback-failed", "--json",
                                   str(work / "roll.json"), "--junit", str(work / "roll.xml"),
                                   "--html", str(REPO / "bench" / "fleet" / "rollout-32.html"))
    ro = json.loads((work / "roll.json").read_text())
    result["rolling"] = {
        "exit": code, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "batches": [{"hosts": len(b["hosts"]), "seconds": b["seconds"], "failed": b["failed"]}
                    for b in ro["batches"]],
        "done": len(ro["done"]), "failed": ro["failed"], "untouched": len(ro["untouched"]),
        "rolled_back": {h: r["status"] for h, r in ro["rolled_back"].items()},
        "summary_tail": text.strip().splitlines()[-1],
    }
    print("rolling", result["rolling"], flush=True)
    save(result)
    print(json.dumps(result, indent=2))


def save(result: dict[str, Any]) -> None:
    (REPO / "bench" / "fleet" / "last.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
