"""torchrun on one or more nodes: one command per node, meeting through the c10d rendezvous on node 0.

Each node runs ``python -m torch.distributed.run --nnodes=N --node-rank=R
--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --nproc-per-node=P
--max-restarts=K`` with the worker.  A worker that dies makes the agents
restart the whole worker group (elastic, up to ``--max-restarts`` times); the
new workers resume from the run directory's last checkpoint, which must be on
storage every node sees.  NCCL on GPUs, gloo on CPUs.
"""

from __future__ import annotations

from trainplan.errors import SpecError
from trainplan.run.launch import torchrun_args
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import RUN_JSON, base_files, install_hint, python, worker_env, worker_target


def launcher_argv(plan: LaunchPlan, node_rank: int, *, master_addr: str | None, interpreter: str | None = None) -> list[str]:
    """torchrun for node ``node_rank`` of the plan (standalone on one node without a rendezvous host), before what it
    starts in each process."""
    p = plan.placement
    return torchrun_args(
        nproc_per_node=p.procs_per_node,
        max_restarts=plan.options.max_restarts,
        nnodes=p.nodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=plan.options.master_port,
        rdzv_id=f"trainplan-{plan.name}",
        python=interpreter or python(plan),
    )


def node_argv(plan: LaunchPlan, node_rank: int, *, master_addr: str | None, config_path: str, interpreter: str | None = None) -> list[str]:
    """The torchrun command of node ``node_rank``: the launcher, then trainplan's worker (or the user's script)."""
    return launcher_argv(plan, node_rank, master_addr=master_addr, interpreter=interpreter) + worker_target(plan, config_path)


def check(plan: LaunchPlan) -> None:
    if plan.is_tabular:
        raise unsupported(plan, "tabular jobs run in one process per machine; use --to local, ray, dask, slurm or skypilot")
    if plan.placement.nodes > 1 and not plan.options.master_addr:
        raise SpecError(
            f"torchrun on {plan.placement.nodes} nodes needs the rendezvous host (node 0's address)", field="--master-addr"
        )


def render(plan: LaunchPlan) -> Rendered:
    check(plan)
    config_path = str(plan.path(RUN_JSON))
    env = worker_env(plan, config_path)
    nodes = plan.placement.nodes
    commands = tuple(
        Command(
            argv=tuple(node_argv(plan, rank, master_addr=plan.options.master_addr, config_path=config_path)),
            env=env,
            where=f"node {rank} of {nodes}" + (" (the rendezvous host)" if rank == 0 and nodes > 1 else ""),
        )
        for rank in range(nodes)
    )
    notes = (("the run directory must be on storage every node sees (checkpoints, metrics)",) if nodes > 1 else ()) + (
        install_hint(plan),)
    return Rendered(plan.target, base_files(plan, wheel=True), commands, notes)
