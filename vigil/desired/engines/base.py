"""What a node-group engine is: the one interface every engine module implements.

An engine is how a group's nodes run one vLLM together (vLLM's own multi-node, Ray, ...).
Everything the rest of vigil needs to know about one is here, so a new engine is one
module in this package (plus its unit template, if it runs a unit of its own): checks,
the rendezvous its workers dial, each node's vLLM flags and its own unit, and how verify
asks its cluster who joined. Pure: values in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from vigil.desired.render import TemplateDirs
from vigil.desired.targets import Target
from vigil.errors import ConfigError


class GroupFile(Protocol):
    """The fields of a node group's file (``NodeGroupSpec``) an engine reads."""

    @property
    def name(self) -> str: ...
    @property
    def master_port(self) -> int: ...
    @property
    def ray_port(self) -> int: ...
    @property
    def prove_cpu_ray_refusal(self) -> bool: ...


@dataclass(frozen=True)
class Layout:
    backend: str
    tp: int
    pp: int
    dp: int
    nnodes: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def per_node(self) -> int:
        return self.world // self.nnodes

    @property
    def label(self) -> str:
        """The layout as history keys and reports show it."""
        return f"{self.nnodes}n-tp{self.tp}-pp{self.pp}-dp{self.dp}-{self.backend}"


@dataclass(frozen=True)
class SideUnit:
    """An engine's own unit on a node beside (or instead of) vLLM's, e.g. a Ray node."""

    label: str  # the release's name in plans and reports ("ray": lab7/ray)
    name: str  # unit name, e.g. vllm-ray.service
    path: str
    text: str
    argv: tuple[str, ...]
    # The unit as a release of its own (its unit, env file, backup and lock, the group's
    # environment), so deploy, restart and rollback handle it like a vLLM unit.
    target: Target


@dataclass(frozen=True)
class ClusterProbe:
    """How verify asks the engine's cluster which nodes joined: ``python -c script arg``
    with the group's environment on the head."""

    script: str
    arg: str


def refuse_proof_switch(backend: str, file: str, device: str) -> None:
    raise ConfigError(
        f"only a CPU group with backend ray takes it; this one is {device} with "
        f"backend {backend}", file=file, key="prove_cpu_ray_refusal",
        fix="remove prove_cpu_ray_refusal")


class Engine:
    """The defaults are those of an engine with no cluster of its own: every node runs
    vLLM, the head's address and ``master_port`` are the rendezvous."""

    name: ClassVar[str]

    def rendezvous(self, spec: GroupFile) -> tuple[tuple[str, int], ...]:
        """(group-file key, port) the head binds and every worker dials first."""
        return (("master_port", spec.master_port),)

    def reserved(self, spec: GroupFile) -> tuple[tuple[str, int], ...]:
        """(key, port) the group takes on the head: none may be its HTTP port or repeat."""
        return (("master_port", spec.master_port),)

    def check_platform(self, spec: GroupFile, file: str, device: str) -> None:
        """Refuse a platform the engine cannot run on (raise ConfigError/RefusedError)."""
        if spec.prove_cpu_ray_refusal:
            refuse_proof_switch(self.name, file, device)

    def check_stack(self, spec: GroupFile, file: str, head: Target) -> None:
        """Refuse a stack that lacks what the engine runs (raise ConfigError)."""

    def serves(self, rank: int) -> bool:
        """Whether node ``rank`` runs vLLM itself."""
        return True

    def describe(self, rank: int, addr: str, spec: GroupFile) -> tuple[str, str]:
        """The node's role and where it meets the others, for its unit's note."""
        raise NotImplementedError

    def argv(self, spec: GroupFile, layout: Layout, addr: str, rank: int,
             args: list[str]) -> list[str]:
        """Node ``rank``'s vLLM argv: ``args`` (the single-host serve argv) plus the
        engine's flags."""
        raise NotImplementedError

    def side_unit(self, spec: GroupFile, addr: str, t: Target, rank: int, note: str,
                  template_dir: TemplateDirs) -> SideUnit | None:
        """The engine's own unit on node ``rank``, if it runs one."""
        return None

    def cluster_probe(self, spec: GroupFile, addr: str) -> ClusterProbe | None:
        """How verify counts the nodes that joined; None: vLLM's own logs say it."""
        return None

    def alive_nodes(self, text: str) -> int | None:
        """Joined nodes in the probe's output; None when it gave no answer."""
        return None
