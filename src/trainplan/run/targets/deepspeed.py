"""The DeepSpeed launcher with a hostfile and the generated DeepSpeed JSON.

``deepspeed --hostfile hostfile --num_nodes N --num_gpus P --master_addr A
--master_port PORT --module trainplan.run.worker run.json``: the launcher on
node 0 starts P processes on each of the first N hosts (over passwordless
SSH and pdsh when there are several), each with ``--local_rank``.  The workers
take the ZeRO configuration from ``run.json`` (``ds_config.json`` is the
same, for reading and for scripts).  Variables the remote nodes need are in
``deepspeed_env`` (``DS_ENV_FILE`` points the launcher at it).  On a CPU the
hostfile's slots are processes.
"""

from __future__ import annotations

import re

from trainplan.errors import SpecError
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import (
    RUN_JSON,
    base_files,
    hosts_for,
    install_hint,
    python,
    worker_env,
    worker_target,
)
from trainplan.strategies import Engine

HOSTFILE = "hostfile"
ENV_FILE = "deepspeed_env"
# DeepSpeed's launcher exports each deepspeed_env value in double quotes on every node's shell
# (multinode_runner.py, add_export: `"{var}"` when it has special characters); inside double quotes these still
# expand or end the quoting, and no quoting written into the file survives that step, so they are refused.
SHELL_ACTIVE_IN_DOUBLE_QUOTES = re.compile(r'[$`"\\\n\r]')


def check(plan: LaunchPlan) -> dict[str, int]:
    if plan.is_tabular:
        raise unsupported(plan, "tabular jobs have no DeepSpeed engine; use --to local, ray, dask, slurm or skypilot")
    if plan.strategy.engine is not Engine.DEEPSPEED:
        raise unsupported(
            plan, f"the DeepSpeed launcher runs ZeRO strategies (zero1-3, offload); the option's strategy is {plan.strategy.value} — use --to torchrun"
        )
    return hosts_for(plan)


def render(plan: LaunchPlan) -> Rendered:
    hosts = check(plan)
    p = plan.placement
    config_path = str(plan.path(RUN_JSON))
    env = worker_env(plan, config_path)
    master = plan.options.master_addr or ("127.0.0.1" if len(hosts) == 1 else next(iter(hosts)))
    argv = [
        python(plan), "-m", "deepspeed.launcher.runner",
        "--hostfile", str(plan.path(HOSTFILE)),
        "--num_nodes", str(p.nodes),
        "--num_gpus", str(p.procs_per_node),
        "--master_addr", master,
        "--master_port", str(plan.options.master_port),
    ]  # fmt: skip
    if len(hosts) == 1:
        argv.append("--no_ssh_check")  # one host: started locally, no SSH involved
    argv += worker_target(plan, config_path)
    files = base_files(plan, wheel=True)
    files[HOSTFILE] = "".join(f"{host} slots={slots}\n" for host, slots in hosts.items())
    for key, value in env.items():
        if SHELL_ACTIVE_IN_DOUBLE_QUOTES.search(value):
            raise SpecError(
                f"{key}={value!r} would be expanded by the shell on every node (DeepSpeed's launcher exports "
                "deepspeed_env values in double quotes); use a path without $, `, \", \\ or line breaks", field="--out")
    files[ENV_FILE] = "".join(f"{k}={v}\n" for k, v in env.items())
    notes = (("the launcher reaches the other hosts over passwordless SSH (pdsh)",) if len(hosts) > 1 else ()) + (
        install_hint(plan),)
    command = Command(argv=tuple(argv), env={**env, "DS_ENV_FILE": str(plan.path(ENV_FILE))}, where="node 0", cwd=plan.out)
    return Rendered(plan.target, files, (command,), notes)
