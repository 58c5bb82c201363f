"""Preflight: refuse, with the evidence, what cannot work; before anything is changed.

``desired.targets.check_fits`` runs before any connection; ``check_host`` needs the
host's facts (runs after the one facts round trip, before any write).
"""

from __future__ import annotations

import shlex

from vigil.deploy import gpucheck, runtime, weights
from vigil.deploy.facts import HostFacts
from vigil.deploy.gpucheck import GpuPolicy
from vigil.deploy.gpus import StaleProcess, stale_processes
from vigil.desired.config import ModelProfile
from vigil.desired.render import Rendered
from vigil.desired.stacks import Stack
from vigil.errors import PermissionDeniedError, RefusedError, VigilError
from vigil.verify import systemd


def stale_gpu_processes(facts: HostFacts) -> list[StaleProcess]:
    return stale_processes(facts.gpus, facts.service_pids, facts.gpu_cmdlines)


def check_host(
    host_name: str, profile: ModelProfile, r: Rendered, facts: HostFacts,
    *, kill_stale: bool = False, stack: Stack | None = None,
    policy: GpuPolicy | None = None, gpus_needed: int | None = None,
) -> None:
    """Refuse, with the evidence, what the host's facts make impossible."""
    found = problems(host_name, profile, r, facts, kill_stale=kill_stale, stack=stack,
                     policy=policy, gpus_needed=gpus_needed)
    if found:
        # every refusal at once, as preflight shows them: one round of fixes, not one each
        first = found[0]
        for more in found[1:]:
            first.message += "\n  also: " + str(more).replace("\n", "\n    ")
        raise first


def problems(
    host_name: str, profile: ModelProfile, r: Rendered, facts: HostFacts,
    *, kill_stale: bool = False, stack: Stack | None = None,
    policy: GpuPolicy | None = None, gpus_needed: int | None = None,
) -> list[VigilError]:
    """Every refusal the facts justify, in the order a deploy meets them. With ``stack``
    the GPUs are also judged against its CUDA release and architectures.
    ``gpus_needed``: a node group's node needs its share of the layout, not all of it."""
    out: list[VigilError] = []
    no_init = systemd.pid1_problem(facts.init.booted, facts.init.pid1, facts.service.error)
    if no_init:
        out.append(RefusedError(f"{host_name}: {no_init}", fix=systemd.FIX))
    for what, ok in facts.writable.items():
        if not ok:
            path = {"unit": r.paths.unit, "env": r.paths.env, "envs": r.paths.env_dir,
                    "state": r.paths.backup_dir}[what]
            out.append(PermissionDeniedError(
                host_name, f"user uid {facts.uid} may not write {path}",
                fix="deploy as root, or set sudo: true for a user with passwordless sudo",
            ))
            break
    if facts.env_unreadable:
        out.append(PermissionDeniedError(host_name, f"cannot read {r.paths.env}",
                                         fix="deploy as root or with sudo: true"))
    if not facts.service_user_exists:
        user = shlex.quote(r.unit_text.split("User=", 1)[1].split("\n", 1)[0])
        out.append(RefusedError(
            f"{host_name}: service user {user} does not exist",
            fix=f"create it on the host: useradd --system --shell /usr/sbin/nologin {user}",
        ))
    if facts.model.present is False:
        out.append(RefusedError(
            f"{host_name}: model directory {profile.path} does not exist",
            fix=f"copy the weights there first, or fix `path:` in models/{profile.name}.yml "
            "(or --set path=DIR)",
        ))
    missing = facts.model.weights.get("missing") or []
    if missing:
        listed = facts.model.weights.get("listed", "?")
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        out.append(RefusedError(
            f"{host_name}: model directory {profile.path} is incomplete: {len(missing)} of "
            f"{listed} shards listed in model.safetensors.index.json are absent ({shown})",
            fix="finish copying the weights (compare with the source's file list)",
        ))
    if facts.model.files is not None:
        found = weights.problems(facts.model.files, profile.extra_args)
        if found:
            out.append(RefusedError(
                f"{host_name}: model directory {profile.path} would not load:\n    "
                + "\n    ".join(found),
                fix="copy the named files again from the source (compare sizes), "
                    "then deploy; the running service was not touched",
            ))
    config = facts.model.config or {}
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and profile.max_model_len > limit:
        out.append(RefusedError(
            f"{host_name}: max_model_len {profile.max_model_len} is above the model's "
            f"max_position_embeddings {limit} ({profile.path}/config.json)",
            fix=f"set max_model_len to {limit} or less",
        ))
    elif not isinstance(limit, int):
        # no max_position_embeddings: the other keys vLLM reads bound it (n_positions, ...)
        keys = config.get("max_len_keys") or {}
        if isinstance(keys, dict) and keys:
            key, bound = min(keys.items(), key=lambda kv: kv[1])
            if isinstance(bound, int) and profile.max_model_len > bound:
                out.append(RefusedError(
                    f"{host_name}: max_model_len {profile.max_model_len} is above the "
                    f"model's {key} {bound} ({profile.path}/config.json)",
                    fix=f"set max_model_len to {bound} or less",
                ))
    heads = config.get("num_attention_heads")
    if isinstance(heads, int) and heads % profile.tensor_parallel_size:
        out.append(RefusedError(
            f"{host_name}: tensor_parallel_size {profile.tensor_parallel_size} does not "
            f"divide the model's {heads} attention heads ({profile.path}/config.json)",
            fix="use a tensor_parallel_size that divides the head count",
        ))
    if profile.device == "cuda":
        need = gpus_needed or profile.gpus_needed
        have = facts.gpus.count
        if have < need and gpus_needed:
            out.append(RefusedError(
                f"{host_name}: its node group puts {need} GPUs of work on each node; "
                f"the host shows {have} (via {facts.gpus.source})",
                fix="add nodes to the group or lower the parallel sizes"))
        elif have < need:
            why = f" (NVML: {facts.gpus.error})" if facts.gpus.error and not have else ""
            out.append(RefusedError(
                f"{host_name}: profile {profile.name} needs tensor_parallel_size "
                f"{profile.tensor_parallel_size} x pipeline_parallel_size "
                f"{profile.pipeline_parallel_size} x data_parallel_size "
                f"{profile.data_parallel_size} = {need} GPUs; the host shows {have} "
                f"(via {facts.gpus.source}){why}",
                fix="lower the parallel sizes or pick a host with more GPUs",
            ))
        stale = stale_gpu_processes(facts)
        if stale and not kill_stale:
            out.append(RefusedError(
                f"{host_name}: GPU memory is held by {len(stale)} process(es) outside "
                f"{r.paths.unit.rsplit('/', 1)[1]}:\n    "
                + "\n    ".join(s.describe() for s in stale),
                fix="end them (deploy --kill-stale ends exactly these), or find their owner",
            ))
        if stack is not None:
            out += gpucheck.problems(host_name, stack, r.env, facts.gpus,
                                     policy or GpuPolicy(), need)
    flag = runtime.flag_problem(r.argv, facts.vllm_flags, facts.env_dir or r.paths.env_dir)
    if flag:
        out.append(RefusedError(
            f"{host_name}: {flag}",
            fix=f"drop it from extra_args (or the field that renders it) in "
            f"models/{profile.name}.yml, or pin a vLLM that has it in the stack"))
    port = int(_port_of(r))
    ours = set(facts.service_pids)
    others = [(pid, cmd) for pid, cmd in facts.port_owners if pid not in ours]
    if facts.port_listening and (others or not facts.port_owners):
        who = "; ".join(f"pid {pid}: {cmd or '?'}" for pid, cmd in others) or (
            "a process not visible from the host's PID namespace")
        out.append(RefusedError(
            f"{host_name}: port {port} is taken by another process ({who})",
            fix=f"stop it, or serve on another port (--set port=...) than {port}",
        ))
    return out


def _port_of(r: Rendered) -> str:
    word = next((a for a in r.argv if a.startswith("--port=")), "--port=0")
    return word.split("=", 1)[1]
