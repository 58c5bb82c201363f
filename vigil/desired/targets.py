"""Resolve selected hosts into targets: every input read, validated and rendered for
every host before the first connection, so a bad file, an unknown profile or a template
error changes no host (pure: files in, values out)."""

from __future__ import annotations

import os
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vigil.desired import vault
from vigil.desired.config import HostVars, ModelProfile
from vigil.desired.group_spec import group_of
from vigil.desired.inventory import Inventory, local_inputs, merge
from vigil.desired.render import TEMPLATES, Rendered, Secrets, TemplateDirs, render
from vigil.desired.roles import RenderedRole, render_role
from vigil.desired.sshconfig import SshConfig
from vigil.desired.stacks import Stack
from vigil.desired.yamlfile import did_you_mean, fields_at, load_yaml
from vigil.errors import ConfigError, RefusedError


@dataclass(frozen=True)
class Target:
    name: str
    vars: HostVars
    profile: ModelProfile
    stack: Stack
    rendered: Rendered
    roles: tuple[RenderedRole, ...] = ()  # the host's user roles, rendered
    origin: Mapping[str, str] = field(default_factory=dict)  # variable -> where it was set
    role_vars: Mapping[str, Any] = field(default_factory=dict)  # user roles' variables
    gpus_needed: int | None = None  # a node group's node: its share of the layout
    ssh: SshConfig | None = None  # what the user's ssh config says for it (render shows it)

    def takes(self, role: str) -> bool:
        return role in self.vars.roles


def parse_sets(
    items: list[str] | tuple[str, ...], role_keys: Collection[str] = (),
    inventory: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--set key=value`` flags, split into host variables (user roles' variables
    included) and profile overrides. A dotted key sets one key of a mapping
    (``gpu.count=4``, ``env.X=1``: an env value stays the text given)."""
    host: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    root = inventory or Path("inventory")
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"--set {item!r} is not key=value", fix="e.g. --set max_model_len=8192"
            )
        path = key.split(".")
        if not all(path):
            raise ConfigError(f"--set {key}: a dotted name has an empty part",
                              fix="e.g. --set gpu.count=4 or --set env.HF_HUB_OFFLINE=1")
        top = path[0]
        if top in HostVars.model_fields or top in role_keys:
            into, fields = host, HostVars.model_fields
        elif top in ModelProfile.model_fields and top != "name":
            into, fields = profile, ModelProfile.model_fields
        else:
            known = {*HostVars.model_fields, *role_keys, *ModelProfile.model_fields} - {"name"}
            raise ConfigError(
                f"--set {top}: not a host variable or model profile field"
                f"{did_you_mean(top, known)}",
                fix=f"see {root / 'group_vars'} and {root / 'models'} for the keys",
            )
        if len(path) > 1 and top in fields:
            annotation = fields[top].annotation
            sub = fields_at(HostVars if into is host else ModelProfile, (top,))
            if not sub and typing.get_origin(annotation) is not dict:
                raise ConfigError(f"--set {key}: {top} is not a mapping",
                                  fix=f"set it whole: --set {top}=VALUE")
            if sub and (len(path) > 2 or path[1] not in sub):
                raise ConfigError(f"--set {key}: {top} has no key {path[1]!r}"
                                  f"{did_you_mean(path[1], sub)}",
                                  fix=f"keys of {top}: {', '.join(sorted(sub))}")
        value: Any
        if len(path) > 1 and path[-2] == "env":
            value = raw  # environment values are text: env.X=1 is "1", not 1
        else:
            try:
                value = load_yaml(raw) if raw else ""
            except yaml.YAMLError as exc:
                problem = getattr(exc, "problem", None) or "not valid YAML"
                raise ConfigError(
                    f"--set {key}: the value is not valid YAML ({problem})",
                    fix="quote it for the shell and YAML, e.g. "
                    "--set 'served_model_name=\"[x\"'",
                ) from None
        for part in reversed(path[1:]):
            value = {part: value}
        merged = merge(into, {top: value})
        into.clear()
        into.update(merged)
    return host, profile


def resolve(
    inv: Inventory,
    pattern: str,
    *,
    model: str | None = None,
    stack: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    operator_env: Mapping[str, str] | None = None,
    template_dir: TemplateDirs = TEMPLATES,
    require_secrets: Secrets = True,
    fits: bool = True,
    local_files: bool = True,
) -> list[Target]:
    """Every selected host's target, checked whole before any host is contacted (its
    files on this machine too, unless ``local_files=False``: render writes files only)."""
    host_flags, profile_flags = parse_sets(sets, inv.role_keys(), inv.root)
    env = os.environ if operator_env is None else operator_env
    targets = []
    for name in inv.select(pattern):
        node_of = group_of(inv, name) if fits else None
        if node_of is not None:
            raise ConfigError(
                f"host {name} is a node of node group {node_of}: its units, start and "
                "verdict belong to the group", file=f"node_groups/{node_of}.yml",
                fix=f"invoke group.deploy --name {node_of} (or group.verify, group.render)")
        resolved = inv.resolve(name, host_flags)
        hv = resolved.vars
        if local_files:
            local_inputs(name, hv, resolved.origin)
        for flag, value, key in (("--model", model, "model"), ("--stack", stack, "stack")):
            if value is not None and key in host_flags and host_flags[key] != value:
                raise ConfigError(
                    f"{flag} {value} and --set {key}={host_flags[key]} disagree",
                    key=key, fix=f"give one of them ({flag} wins over the inventory)",
                )
        profile_name = model or hv.model
        if not profile_name:
            raise ConfigError(
                f"no model for host {name}",
                fix=f"pass --model ({_choices(inv, 'models')}) or set model: in "
                f"{inv.root / 'host_vars' / name}.yml or a group's file in "
                f"{inv.root / 'group_vars'}",
            )
        profile = inv.profile(profile_name, {**hv.overrides, **profile_flags})
        stack_name = stack or hv.stack or profile.stack
        if not stack_name:
            raise ConfigError(
                f"no stack for host {name}",
                fix=f"pass --stack ({_choices(inv, 'stacks')}) or set stack: in "
                f"{inv.root / 'host_vars' / name}.yml, a group's file in "
                f"{inv.root / 'group_vars'} or the profile",
            )
        st = inv.stack(stack_name)
        if fits:  # a node group checks its layout across its nodes instead
            check_fits(name, hv, profile)
        rendered = render(name, hv, profile, st, env, template_dir,
                          require_secrets=require_secrets)
        for key, where in resolved.origin.items():
            if key.startswith("env.") and vault.MARK in where:
                # the env file is shown by render and diffed by --check: a vault value
                # there would be shown in full; vigil's secrets come by secret_env
                raise ConfigError(f"{key} of host {name} comes from Ansible Vault ({where})",
                                  key=key, fix=f"put {key.removeprefix('env.')} in "
                                  "secret_env and export it where vigil runs")
        values = {**hv.model_dump(), **resolved.role_vars}
        user = tuple(render_role(r, name, values) for r in resolved.user_roles)
        _check_dests(name, user, (rendered.paths.unit, rendered.paths.env))
        targets.append(Target(name, hv, profile, st, rendered, user, resolved.origin,
                              resolved.role_vars, ssh=resolved.ssh))
    return targets



def _choices(inv: Inventory, kind: str) -> str:
    names = inv.names(kind)
    return f"one of: {', '.join(names)}" if names else f"none yet: {inv.root / kind} is empty"


def _check_dests(host: str, roles: tuple[RenderedRole, ...], taken: tuple[str, ...]) -> None:
    """Two owners of one file would rewrite it on every deploy: refuse before any host."""
    owner = {path: "the service role" for path in taken}
    for role in roles:
        for f in role.files:
            if f.dest in owner:
                raise ConfigError(f"{host}: role {role.name} places {f.dest}, which "
                                  f"{owner[f.dest]} already writes",
                                  file=f"roles/{role.name}/role.yml", key="files",
                                  fix="give the file its own path")
            owner[f.dest] = f"role {role.name}"


def check_fits(host_name: str, host: HostVars, profile: ModelProfile) -> None:
    """Refuse, before any connection, what the inventory already says cannot work."""
    if profile.device == "cpu":
        return
    need = profile.gpus_needed
    if host.gpu is None:
        raise RefusedError(
            f"{host_name}: profile {profile.name} needs {need} GPUs but the inventory "
            "declares no gpu for this host",
            fix="add gpu: {kind, count, memory_gib} to the host or its group",
        )
    if need > host.gpu.count:
        raise RefusedError(
            f"{host_name}: profile {profile.name} needs tensor_parallel_size "
            f"{profile.tensor_parallel_size} x pipeline_parallel_size "
            f"{profile.pipeline_parallel_size} x data_parallel_size "
            f"{profile.data_parallel_size} = {need} GPUs; the host has {host.gpu.count}",
            fix="lower the parallel sizes (with --set or host overrides) or pick a bigger host",
        )
    if profile.weights_gib_per_gpu >= host.gpu.memory_gib * profile.gpu_memory_utilization:
        raise RefusedError(
            f"{host_name}: {profile.weights_gib_per_gpu:g} GiB of weights per GPU do not fit "
            f"in {profile.gpu_memory_utilization:g} x {host.gpu.memory_gib:g} GiB",
            fix="raise tensor_parallel_size or pick a host with more GPU memory",
        )


