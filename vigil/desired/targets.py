"""Resolve selected hosts into targets: every input read, validated and rendered for
every host before the first connection, so a bad file, an unknown profile or a template
error changes no host (pure: files in, values out)."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from vigil.desired.config import HostVars, ModelProfile, Stack
from vigil.desired.inventory import Inventory
from vigil.desired.render import TEMPLATES, Rendered, TemplateDirs, render
from vigil.desired.roles import RenderedRole, render_role
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

    def takes(self, role: str) -> bool:
        return role in self.vars.roles


def parse_sets(
    items: list[str] | tuple[str, ...], role_keys: Collection[str] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--set key=value`` flags, split into host variables (user roles' variables
    included) and profile overrides."""
    host: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"--set {item!r} is not key=value", fix="e.g. --set max_model_len=8192"
            )
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise ConfigError(
                f"--set {key}: the value is not valid YAML ({problem})", key=key,
                fix="quote it for the shell and YAML, e.g. --set 'served_model_name=\"[x\"'",
            ) from None
        if key in HostVars.model_fields or key in role_keys:
            host[key] = value
        elif key in ModelProfile.model_fields and key != "name":
            profile[key] = value
        else:
            raise ConfigError(
                f"--set {key}: not a host variable or model profile field",
                fix="see inventory/group_vars/all.yml and inventory/models/*.yml for the keys",
            )
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
    require_secrets: bool = True,
    fits: bool = True,
) -> list[Target]:
    host_flags, profile_flags = parse_sets(sets, inv.role_keys())
    env = os.environ if operator_env is None else operator_env
    targets = []
    from vigil.desired.groups import group_of  # groups builds on this module

    for name in inv.select(pattern):
        node_of = group_of(inv, name) if fits else None
        if node_of is not None:
            raise ConfigError(
                f"host {name} is a node of node group {node_of}: its units, start and "
                "verdict belong to the group", file=f"node_groups/{node_of}.yml",
                fix=f"invoke group.deploy --name {node_of} (or group.verify, group.render)")
        resolved = inv.resolve(name, host_flags)
        hv = resolved.vars
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
                fix=f"pass --model (one of: {', '.join(inv.names('models'))}) "
                "or set model: in the inventory",
            )
        profile = inv.profile(profile_name, {**hv.overrides, **profile_flags})
        stack_name = stack or hv.stack or profile.stack
        if not stack_name:
            raise ConfigError(
                f"no stack for host {name}",
                fix=f"pass --stack (one of: {', '.join(inv.names('stacks'))}) or set stack:",
            )
        st = inv.stack(stack_name)
        if fits:  # a node group checks its layout across its nodes instead
            check_fits(name, hv, profile)
        rendered = render(name, hv, profile, st, env, template_dir,
                          require_secrets=require_secrets)
        values = {**hv.model_dump(), **resolved.role_vars}
        user = tuple(render_role(r, name, values) for r in resolved.user_roles)
        _check_dests(name, user, (rendered.paths.unit, rendered.paths.env))
        targets.append(Target(name, hv, profile, st, rendered, user, resolved.origin,
                              resolved.role_vars))
    return targets



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


