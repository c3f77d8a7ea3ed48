"""torchtitan: the plan's layout — tensor, pipeline, context and expert parallel over FSDP2 — as a torchtitan run.

torchtitan (0.3.0, the release on the package index) selects a model and its training recipe with a Python
config function (``--module llama3 --config llama3_8b``, ``torchtitan/models/*/config_registry.py``) and takes
every other setting as a command-line override of its ``Trainer.Config`` dataclasses, parsed and validated by
its own ``ConfigManager`` (tyro).  trainplan renders one ``torchrun … -m torchtitan.train --module M --config F
<overrides>`` per node: the plan's degrees (``--parallelism.*``), batch (``--training.local-batch-size`` /
``global-batch-size``, the pipeline's micro-batch size), sequence length, steps, precision and activation
checkpointing.  The rest (optimizer, learning-rate schedule, loss, compile, data) is the config function's.

torchtitan trains its own model definitions, so a job is rendered only when its model is one torchtitan ships:
the architecture must equal the preset's field by field (:data:`MODELS`; ``tests/run/test_launch_torchtitan.py``
builds each of torchtitan's models on the meta device and checks its parameter count against trainplan's), and
the plan's precision must be the config function's (float8 is part of torchtitan's model spec, not a flag).
Refused in one line: LoRA / QLoRA, DeepSpeed ZeRO strategies (torchtitan shards with FSDP2), another model,
fp16 / bf16-pure, a user script.  When torchtitan is importable (this Python, or ``TRAINPLAN_TORCHTITAN_PYTHON``),
:func:`check_with_torchtitan` runs its ``ConfigManager`` over the rendered command before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace

from trainplan.catalog import checkpoint_dir, get_catalog, resolve_model
from trainplan.errors import SpecError
from trainplan.model import ModelArch
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import base_files
from trainplan.run.targets.torchrun import launcher_argv
from trainplan.spec import Checkpointing, JobKind, Method, Optimizer, Precision
from trainplan.strategies import Strategy

#: The release whose config layout this module renders (flags read from its ``torchtitan/config/configs.py``,
#: ``trainer.py`` and ``components/checkpointer/base.py``).
TORCHTITAN_VERSION = "0.3.0"
PYTHON_ENV = "TRAINPLAN_TORCHTITAN_PYTHON"


@dataclass(frozen=True)
class TitanModel:
    """One of torchtitan's config functions and the trainplan preset with the same architecture."""

    preset: str  # trainplan's preset (catalog/data/models.yaml)
    module: str  # torchtitan.models.<module>
    config: str  # its config_registry function
    float8: bool = False  # the function adds torchao float8 linears to the model spec (none builds MTP modules)


#: torchtitan 0.3.0's full-size config functions (torchtitan/models/*/config_registry.py) and their models.
MODELS: tuple[TitanModel, ...] = (
    TitanModel("llama-3.1-8b", "llama3", "llama3_8b"),
    TitanModel("llama-3.1-70b", "llama3", "llama3_70b"),
    TitanModel("llama-3.1-405b", "llama3", "llama3_405b", float8=True),
    TitanModel("qwen3-30b-a3b", "qwen3", "qwen3_30b_a3b"),
    TitanModel("deepseek-v3", "deepseek_v3", "deepseek_v3_671b"),
    TitanModel("gpt-oss-20b", "gpt_oss", "gpt_oss_20b"),
    TitanModel("gpt-oss-120b", "gpt_oss", "gpt_oss_120b"),
)

# Fields of a ModelArch that say where it came from or bound its use, not what it computes.
_NOT_SHAPE = {"name", "params", "max_seq_len", "hf_source", "hf_model_type", "dropout", "mtp_layers"}


def _shape(a: ModelArch) -> dict[str, object]:
    return a.model_dump(exclude=_NOT_SHAPE)


def titan_model(arch: ModelArch) -> TitanModel | None:
    """The torchtitan model with exactly ``arch``'s architecture (multi-token prediction aside), or None."""
    catalog = get_catalog()
    shape = _shape(arch)
    return next((m for m in MODELS if _shape(resolve_model(m.preset, catalog)) == shape), None)


def check(plan: LaunchPlan) -> TitanModel:
    """Why torchtitan cannot run this plan (one line), or the torchtitan model it trains."""
    job = plan.job
    if job.kind is not JobKind.TRANSFORMER:
        raise unsupported(plan, f"torchtitan trains its own transformer models; this is a kind: {job.kind.value} job")
    if plan.options.script is not None:
        raise unsupported(plan, "torchtitan runs its own trainer (torchtitan.train); a --script runs with --to torchrun")
    if job.method is not Method.FULL:
        raise unsupported(plan, f"torchtitan {TORCHTITAN_VERSION} trains all weights; method {job.method.value} runs with "
                            "--to torchrun / deepspeed")  # fmt: skip
    if job.optimizer is not Optimizer.ADAMW:
        raise unsupported(plan, f"torchtitan's config functions train with AdamW; the job's optimizer is "
                                f"{job.optimizer.value} — use optimizer: adamw, or --to torchrun")  # fmt: skip
    if plan.strategy not in (Strategy.SINGLE, Strategy.DDP, Strategy.FSDP, Strategy.FSDP_GRAD_OP, Strategy.FSDP_OFFLOAD):
        raise unsupported(plan, f"torchtitan shards with FSDP2, not DeepSpeed: the option's strategy is "
                            f"{plan.strategy.value}; pick an fsdp or ddp option (--strategy fsdp)")  # fmt: skip
    if job.precision in (Precision.FP16, Precision.BF16_PURE):
        raise unsupported(plan, f"torchtitan trains with fp32 master weights in bf16 or fp32 (training.mixed_precision_param);"
                            f" precision {job.precision.value} has no equivalent — use bf16")  # fmt: skip
    if plan.placement.device.value != "cuda":
        raise unsupported(plan, "torchtitan runs on GPUs (NCCL); --device cpu rehearses with --to torchrun")
    arch = resolve_model(job.model, get_catalog())
    model = titan_model(arch)
    if model is None:
        shipped = ", ".join(m.preset for m in MODELS)
        raise unsupported(plan, f"torchtitan {TORCHTITAN_VERSION} ships its own model definitions, and this job's model is "
                            f"none of them (same architecture as: {shipped})")  # fmt: skip
    if (job.precision is Precision.FP8) != model.float8:
        recipe = "trains in float8 (torchao float8 linears in its model spec)" if model.float8 else "has no float8"
        want = "fp8" if model.float8 else "bf16"
        raise unsupported(plan, f"torchtitan {TORCHTITAN_VERSION}'s {model.config} {recipe}; the plan's precision is "
                            f"{job.precision.value} — set precision: {want} to render it")  # fmt: skip
    if plan.knobs.checkpoint_fraction < 1.0:
        # activation_checkpoint.py of 0.3.0: FullAC and SelectiveAC wrap every block (ActivationCheckpointing.apply);
        # the layer-level option of earlier releases (selective_ac_option "N") is gone
        raise unsupported(plan, f"torchtitan {TORCHTITAN_VERSION} checkpoints every block or none; knobs.checkpoint_fraction "
                                "(a share of the blocks) renders with --to megatron or runs with trainplan run / --to torchrun")  # fmt: skip
    layout = plan.layout
    if layout.cp > 1 and job.seq_len % (2 * layout.cp):
        raise unsupported(plan, f"torchtitan's context parallel (head-tail load balancing) splits each sequence into "
                            f"2 × cp chunks: seq_len {job.seq_len} must be a multiple of {2 * layout.cp}")  # fmt: skip
    return model


def _batches(plan: LaunchPlan) -> tuple[int, int, int]:
    """(local batch per data-parallel rank, global batch, pipeline micro-batch size) in sequences.

    torchtitan accumulates gradients over ``global / (local × dp)`` steps; with pipeline parallelism the local
    batch is what one step pushes through the pipeline, split into micro-batches of
    ``pipeline_parallel_microbatch_size`` (torchtitan/config/configs.py, TrainingConfig and ParallelismConfig).
    """
    job, layout = plan.job, plan.layout
    micro, m = job.micro_batch, plan.micro_steps
    global_batch = micro * m * layout.data_parallel
    if layout.pp > 1:
        return micro * m, global_batch, micro
    return micro, global_batch, micro


def _layers_per_stage(plan: LaunchPlan, stages: int, layers: int) -> int | None:
    """torchtitan's ``pipeline_parallel_layers_per_stage`` that makes ``stages`` stages of ``layers`` units (blocks,
    plus the embedding's and the head's shares); None where no size does but torchtitan's own count does — without
    the option it makes one stage per rank under 1F1B and two under Interleaved1F1B (distributed/pipeline_parallel.py
    ``pipeline_llm``) and deals the units over them as the plan does."""
    per_stage = -(-layers // stages)
    if -(-layers // per_stage) != stages and plan.layout.vpp <= 2:
        return None
    if -(-layers // per_stage) != stages:
        raise unsupported(plan, f"torchtitan splits the {layers} units (blocks, embedding and head) into stages of equal size "
                            f"(pipeline_parallel_layers_per_stage): no size gives pp × vpp = {stages} stages")  # fmt: skip
    return per_stage


def overrides(plan: LaunchPlan, model: TitanModel) -> list[str]:
    """torchtitan command-line overrides for the plan (names as its ``--help`` prints them)."""
    job, layout, strategy = plan.job, plan.layout, plan.strategy
    local, global_batch, pp_micro = _batches(plan)
    knobs = plan.knobs
    sharded = strategy.shards_optimizer
    args = [
        "--dump-folder", str(plan.path("torchtitan")),
        "--parallelism.data-parallel-replicate-degree", str(1 if sharded else layout.data_parallel),
        "--parallelism.data-parallel-shard-degree", str(layout.data_parallel if sharded else 1),
        "--parallelism.tensor-parallel-degree", str(layout.tp),
        "--parallelism.pipeline-parallel-degree", str(layout.pp),
        "--parallelism.context-parallel-degree", str(layout.cp),
        "--parallelism.expert-parallel-degree", str(layout.ep),
        "--training.local-batch-size", str(local),
        "--training.global-batch-size", str(global_batch),
        "--training.seq-len", str(job.seq_len),
        "--training.steps", str(plan.config.total_steps),
        "--training.mixed-precision-param", "float32" if job.precision is Precision.FP32 else "bfloat16",
    ]  # fmt: skip
    if layout.tp > 1:
        args.append("--parallelism.enable-sequence-parallel" if layout.sequence_parallel
                    else "--parallelism.no-enable-sequence-parallel")  # fmt: skip
    if strategy is Strategy.FSDP_GRAD_OP:
        args += ["--parallelism.fsdp-reshard-after-forward", "never"]  # gradients and optimizer sharded, like ZeRO-2
    if strategy is Strategy.FSDP_OFFLOAD:
        args.append("--training.enable-cpu-offload")
    if layout.pp > 1 or layout.ep > 1:
        # torchtitan's own checks: "CUDA graphs do not support pipeline parallelism yet", and the all-to-all token
        # dispatcher of expert parallel needs CPU synchronisation (config/configs.py validation)
        args.append("--training.disable-cuda-graphs")
    if layout.pp > 1:
        stages = layout.pp * layout.vpp
        args += ["--parallelism.pipeline-parallel-schedule", "Interleaved1F1B" if layout.vpp > 1 else "1F1B",
                 "--parallelism.pipeline-parallel-microbatch-size", str(pp_micro)]  # fmt: skip
        # the plan's split (estimate/parallel.py chunk_layers): the blocks and the embedding's and head's shares
        # (knobs.pipeline_*_stage_less_layers) dealt over the stages; torchtitan makes ceil(units / layers_per_stage)
        # stages and deals them out the same way (distributed/pipeline_parallel.py generate_llm_fqn_per_model_part)
        first, last = knobs.pipeline_first_stage_less_layers, knobs.pipeline_last_stage_less_layers
        per_stage = _layers_per_stage(plan, stages, resolve_model(job.model, get_catalog()).layers + first + last)
        if per_stage is not None:
            args += ["--parallelism.pipeline-parallel-layers-per-stage", str(per_stage)]
        args += ["--parallelism.pipeline-parallel-first-stage-less-layers", str(first),
                 "--parallelism.pipeline-parallel-last-stage-less-layers", str(last)]  # fmt: skip
    if knobs.compile:  # the plan was estimated compiled: torchtitan compiles too
        args.append("--compile.enable")
    every = plan.config.checkpoint_every
    pretrained = checkpoint_dir(job.model)
    if every or pretrained is not None:
        args.append("--checkpoint.enable")  # torchtitan's checkpointer also does the initial load (base.py load())
    if every:
        args += ["--checkpoint.interval", str(every)]
    if pretrained is not None:
        # a save_pretrained directory: torchtitan reads its safetensors through the model's state-dict adapter and
        # its tokenizer from the same folder (checkpointer/base.py: initial_load_in_hf; trainer.py hf_assets_path)
        folder = str(pretrained.expanduser().resolve())
        args += ["--checkpoint.initial-load-path", folder, "--checkpoint.initial-load-in-hf", "--hf-assets-path", folder]
    args.append({Checkpointing.NONE: "activation-checkpoint:none", Checkpointing.SELECTIVE: "activation-checkpoint:selective",
                 Checkpointing.FULL: "activation-checkpoint:full"}[job.activation_checkpointing])  # fmt: skip
    return args


def node_argv(plan: LaunchPlan, model: TitanModel, node_rank: int, args: list[str]) -> list[str]:
    launcher = launcher_argv(plan, node_rank, master_addr=plan.options.master_addr)  # torchrun's, as --to torchrun
    return [*launcher, "-m", "torchtitan.train", "--module", model.module, "--config", model.config, *args]


def render(plan: LaunchPlan) -> Rendered:
    model = check(plan)
    nodes = plan.placement.nodes
    if nodes > 1 and not plan.options.master_addr:
        raise SpecError(f"torchtitan on {nodes} nodes needs the rendezvous host (node 0's address)", field="--master-addr")
    args = overrides(plan, model)
    files = base_files(plan)
    env = {"PYTHONUNBUFFERED": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    if plan.options.iface:
        env["NCCL_SOCKET_IFNAME"] = plan.options.iface
    commands = tuple(
        Command(argv=tuple(node_argv(plan, model, rank, args)), env=env, cwd=plan.out,
                where=f"node {rank} of {nodes}" + (" (the rendezvous host)" if rank == 0 and nodes > 1 else ""))
        for rank in range(nodes)
    )  # fmt: skip
    arch = resolve_model(plan.job.model, get_catalog())
    pretrained = checkpoint_dir(plan.job.model)
    start = f"from the weights in {pretrained}" if pretrained is not None else "from a random initialisation"
    notes = [
        f"torchtitan {TORCHTITAN_VERSION} trains {model.module}/{model.config} ({model.preset}) {start} with "
        f"{plan.layout.describe()}; install it on the nodes (pip install torchtitan=={TORCHTITAN_VERSION}, with a "
        "PyTorch it supports)",
        f"data: {model.config}'s own dataset (--dataloader.dataset / --dataloader.dataset-path); trainplan's `data` "
        "is not passed to torchtitan",
        f"optimizer: AdamW at {model.config}'s learning rate and schedule; the job's learning_rate "
        f"({plan.job.learning_rate:g}) is not passed",
    ]
    knobs = plan.knobs
    if knobs.fp8_all_gather:
        notes.append(f"float8 all-gather: {model.config}'s own float8 setting is used (the plan gathered the float8 "
                     "weights in FP8, knobs.fp8_all_gather); set its enable_fsdp_float8_all_gather to match")  # fmt: skip
    if not knobs.compile:
        notes.append(f"compile: {model.config}'s own setting (the plan was estimated without torch.compile; "
                     "knobs.compile: true renders --compile.enable)")  # fmt: skip
    if arch.mtp_layers:
        notes.append(f"torchtitan's {model.config} builds no multi-token-prediction module; the plan counted {arch.mtp_layers}")
    if plan.job.stack.value != "torchtitan":
        notes.append(f"the plan was estimated for stack {plan.job.stack.value}; set stack: torchtitan to estimate "
                     "torchtitan's own loss, optimizer and gradient-sync settings")  # fmt: skip
    if nodes > 1:
        notes.append(f"torchtitan writes checkpoints under {plan.path('torchtitan')}: storage every node sees")
    return Rendered(plan.target, files, commands, tuple(notes))


def torchtitan_python() -> str | None:
    """An interpreter that imports torchtitan (``$TRAINPLAN_TORCHTITAN_PYTHON``, else this one), or None."""
    candidate = os.environ.get(PYTHON_ENV) or sys.executable
    try:
        probe = subprocess.run([candidate, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torchtitan') is None)"],
                               capture_output=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return candidate if probe.returncode == 0 else None


# Runs in the torchtitan interpreter: parse the rendered overrides with torchtitan's ConfigManager and print
# the settings trainplan decided, as torchtitan read them.
_CHECK = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from torchtitan.config import ConfigManager
c = ConfigManager().parse_args(sys.argv[1:])
p, t = c.parallelism, c.training
print("TRAINPLAN-CHECK " + json.dumps({
    "dp_replicate": p.data_parallel_replicate_degree, "dp_shard": p.data_parallel_shard_degree,
    "tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree, "cp": p.context_parallel_degree,
    "ep": p.expert_parallel_degree, "sequence_parallel": p.enable_sequence_parallel,
    "schedule": p.pipeline_parallel_schedule, "pp_microbatch": p.pipeline_parallel_microbatch_size,
    "local_batch": t.local_batch_size, "global_batch": t.global_batch_size, "seq_len": t.seq_len,
    "steps": t.steps, "param_dtype": t.mixed_precision_param,
    "activation_checkpoint": type(c.activation_checkpoint).__qualname__,
    "reshard_after_forward": p.fsdp_reshard_after_forward, "cpu_offload": t.enable_cpu_offload,
    "layers_per_stage": p.pipeline_parallel_layers_per_stage, "dump_folder": c.dump_folder,
    "checkpoint": [c.checkpoint.enable, c.checkpoint.interval], "compile": c.compile.enable,
    "initial_load": [c.checkpoint.initial_load_path, c.checkpoint.initial_load_in_hf, c.hf_assets_path],
}))
"""


def check_with_torchtitan(rendered: Rendered, interpreter: str) -> dict[str, object]:
    """Parse the rendered command with torchtitan's own ConfigManager (in ``interpreter``); the settings it read.

    Raises :class:`SpecError` with torchtitan's own message when it rejects the configuration.
    """
    argv = list(rendered.commands[0].argv)
    args = argv[argv.index("torchtitan.train") + 1:]
    with tempfile.TemporaryDirectory(prefix="trainplan-titan-") as tmp:  # torchtitan may write next to its cwd
        proc = subprocess.run([interpreter, "-c", _CHECK, *args], capture_output=True, text=True, timeout=600,
                              cwd=tmp, env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("TRAINPLAN-CHECK "):
            return json.loads(line.removeprefix("TRAINPLAN-CHECK "))
    text = (proc.stderr or proc.stdout).translate({ord(c): " " for c in "│╭╮╰╯─"})  # tyro draws a box around it
    message = " ".join(text.split())[-400:]
    raise SpecError(f"torchtitan's ConfigManager rejected the rendered configuration: {message}", field="--to")


def checked(plan: LaunchPlan, rendered: Rendered) -> Rendered:
    """``rendered`` after torchtitan's ConfigManager has read it (a note says so), or with a note saying why not."""
    model = check(plan)
    if model.float8:
        note = (f"not checked here: {model.config} builds torchao float8 linears when its config loads, which needs torchao "
                "and an SM89+ GPU")  # fmt: skip
    else:
        interpreter = torchtitan_python()
        if interpreter is None:
            note = f"not checked here: torchtitan is not installed (pip install torchtitan=={TORCHTITAN_VERSION}, or set {PYTHON_ENV})"
        else:
            read = check_with_torchtitan(rendered, interpreter)
            note = (f"checked with torchtitan's ConfigManager ({interpreter}): dp_replicate {read['dp_replicate']} × "
                    f"dp_shard {read['dp_shard']} × tp {read['tp']} × pp {read['pp']} × cp {read['cp']}, ep {read['ep']}, "
                    f"local batch {read['local_batch']}, global batch {read['global_batch']}")  # fmt: skip
    return replace(rendered, notes=(*rendered.notes, note))
