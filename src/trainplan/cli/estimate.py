"""`trainplan estimate JOB --gpu/--instance/--cpus`: one configuration in detail."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from trainplan.catalog import find_accelerator, find_instance, get_catalog
from trainplan.cli.common import dump_json, grid_regions, read_job
from trainplan.errors import SpecError
from trainplan.estimate.hardware import Hardware, hardware_for_gpu, hardware_for_instance, with_layout
from trainplan.planner.calibrated import efficiency_lookup
from trainplan.planner.core import estimate_option
from trainplan.planner.fit import least_checkpointing, micro_batch_fit
from trainplan.planner.local import cpus_hardware
from trainplan.spec import TabularJob, TransformerJob
from trainplan.cli.tables import estimate_panel
from trainplan.strategies import Layout, Strategy


def _hardware(gpu: str | None, gpus: int, nodes: int, instance: str | None, cpus: int | None) -> Hardware:
    given = [name for name, v in (("--gpu", gpu), ("--instance", instance), ("--cpus", cpus)) if v is not None]
    if len(given) != 1:
        raise SpecError("give exactly one of --gpu NAME, --instance NAME, --cpus N", field="hardware")
    catalog = get_catalog()
    Layout(gpus_per_node=gpus, nodes=nodes)  # validates the degrees
    if gpu is not None:
        return hardware_for_gpu(find_accelerator(gpu, catalog), catalog, gpus=gpus, nodes=nodes)
    if instance is not None:
        return hardware_for_instance(find_instance(instance, catalog), catalog, nodes=nodes)
    assert cpus is not None
    if cpus < 1:
        raise SpecError(f"must be >= 1, got {cpus}", field="--cpus")
    return cpus_hardware(cpus, catalog)  # as fast as this machine's cores when `trainplan probe` measured them


def estimate_command(
    job_file: Annotated[Optional[Path], typer.Argument(help="Job file (YAML). Default: the built-in LLaMA-7B fine-tune.")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="Accelerator ID, e.g. A100-80GB (case-insensitive).")] = None,
    gpus: Annotated[int, typer.Option(help="GPUs per node.")] = 1,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    instance: Annotated[Optional[str], typer.Option(help="Instance type, e.g. p4de.24xlarge (or cloud:name).")] = None,
    cpus: Annotated[Optional[int], typer.Option(help="vCPUs of a CPU-only machine.")] = None,
    strategy: Annotated[Optional[str], typer.Option(help="single, ddp, zero1-3, zero1-offload, zero2-offload, zero3-offload, fsdp, fsdp-grad-op, fsdp-offload (with --tp/--pp/--cp/--ep: the data-parallel sharding). Default: the best that fits.")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor parallel degree (divides the attention heads; within a node).")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline parallel stages.")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual pipeline stages per rank (interleaved 1F1B).")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context parallel degree (2 x cp divides seq_len).")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert parallel degree (MoE models; divides the experts).")] = 1,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism over the tensor-parallel ranks.", metavar="")] = False,
    trace: Annotated[bool, typer.Option("--trace", help="Transformer jobs: trace the real model on the fake device instead of the formulas.", metavar="")] = False,
    max_micro_batch: Annotated[bool, typer.Option("--max-micro-batch", help="Also find the largest micro-batch (and, for transformers, the longest sequence at micro-batch 1) that fits.", metavar="")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.", metavar="")] = False,
    region: Annotated[Optional[list[str]], typer.Option(help="Grid region for the CO2 figure, CLOUD:REGION (e.g. gcp:europe-west4).")] = None,
) -> None:
    """Memory, time and cost of the job on one configuration."""
    job = read_job(job_file)
    hw = with_layout(_hardware(gpu, gpus, nodes, instance, cpus), dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sequence_parallel=sp))
    catalog = get_catalog()
    regions = grid_regions(region or [], catalog)
    e = estimate_option(job, hw, catalog, strategy=Strategy.parse(strategy) if strategy else None,
                        efficiency_for=efficiency_lookup(job), trace=trace, regions=regions)  # fmt: skip
    fit = None
    if max_micro_batch:
        if isinstance(job, TabularJob):
            raise SpecError("applies to neural jobs (kind: transformer or torch), not to tabular jobs", field="--max-micro-batch")
        fit = micro_batch_fit(job, e, catalog, trace=trace)
    # under full checkpointing: the fewest blocks checkpointed that still fit (from the formulas)
    lighter = least_checkpointing(job, e, catalog) if max_micro_batch and isinstance(job, TransformerJob) and not trace else None
    if json_out:
        extra = {"micro_batch_fit": fit.to_dict()} if fit else {}
        if lighter is not None:
            extra["checkpoint_fit"] = lighter.to_dict()
        typer.echo(dump_json(dict(e.to_dict(), **extra)))
        return
    console = Console(width=None if Console().is_terminal else 120)
    console.print(estimate_panel(e))
    if fit is not None:
        console.print(f"[bold]largest micro-batch[/] {escape(fit.text)}")
    if lighter is not None:
        console.print(f"[bold]least checkpointing[/] {escape(lighter.text)}")
