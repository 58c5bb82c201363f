"""A node group's file, ``inventory/node_groups/<name>.yml``: its record and how it is
read and found (pure). Host targets ask it whether a host is a node; the group's checks
and rendering (``groups.py``) build on it."""

from __future__ import annotations

from pydantic import Field

from vigil.desired.config import Name, SafeText, Strict
from vigil.desired.inventory import Inventory, parse_model, read_yaml
from vigil.errors import ConfigError

GROUPS_DIR = "node_groups"


class NodeGroupSpec(Strict):
    name: Name
    description: SafeText = ""
    head: Name
    workers: list[Name] = Field(min_length=1)
    backend: Name = "native"  # an engine of vigil/desired/engines/ (checked on resolving)
    master_addr: SafeText | None = Field(None, description="default: the head's address")
    master_port: int = Field(29501, ge=1, le=65535)
    ray_port: int = Field(6379, ge=1, le=65535)
    model: Name | None = None
    stack: Name | None = None
    # The lab's switch: vLLM's CPU build refuses the Ray executor at engine start, so a
    # CPU group with backend ray is refused up front; with this it is deployed anyway to
    # prove the Ray units, the cluster and the crash verdict up to vLLM's own error.
    prove_cpu_ray_refusal: bool = Field(
        False, description="CPU + ray only: deploy although vLLM will refuse it")


def names(inv: Inventory) -> list[str]:
    return sorted(p.stem for p in (inv.root / GROUPS_DIR).glob("*.yml"))


def load_spec(inv: Inventory, name: str) -> tuple[NodeGroupSpec, str]:
    path = inv.root / GROUPS_DIR / f"{name}.yml"
    if not path.is_file() or "/" in name or name.startswith("."):
        raise ConfigError(f"unknown node group {name!r}", file=str(path.parent),
                          fix=f"use one of: {', '.join(names(inv)) or '(none)'}")
    data = read_yaml(path)
    extra = {} if isinstance(data, dict) and "name" in data else {"name": name}
    spec = parse_model(NodeGroupSpec, data, str(path), **extra)
    if spec.name != name:
        raise ConfigError(f"name {spec.name!r} does not match the file name {name!r}",
                          file=str(path), key="name")
    return spec, str(path)


def group_of(inv: Inventory, host: str) -> str | None:
    """The node group a host belongs to, if any (a node is never deployed alone)."""
    for name in names(inv):
        spec, _ = load_spec(inv, name)
        if host == spec.head or host in spec.workers:
            return name
    return None
