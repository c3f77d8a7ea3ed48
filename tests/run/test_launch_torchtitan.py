"""`trainplan launch --to torchtitan`: the plan's tensor / pipeline / context / expert-parallel layout rendered as a
torchtitan 0.3.0 run, read back by torchtitan's own ConfigManager, and torchtitan's models checked against
trainplan's presets by building them on the meta device.

torchtitan's dependencies (an older huggingface-hub than transformers wants, triton, torchao) live in their own
environment in CI, layered on .ci-venv, whose interpreter is $TRAINPLAN_TORCHTITAN_PYTHON; under CI a missing
torchtitan fails the tests that need it instead of skipping them."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import write_job

from trainplan.catalog import get_catalog, resolve_model
from trainplan.cli.common import example_path
from trainplan.cli.main import main
from trainplan.errors import SpecError
from trainplan.estimate.architecture import param_counts
from trainplan.run.targets import LaunchOptions, LaunchRequest, Target, prepare_launch
from trainplan.run.targets.plan import resolve_launch
from trainplan.strategies import Strategy
from trainplan.run.targets.torchtitan import MODELS, check_with_torchtitan, render, titan_model, torchtitan_python

PRETRAIN_8B = {
    "name": "l8b", "kind": "transformer", "model": "llama-3.1-8b", "task": "pretrain", "method": "full",
    "seq_len": 8192, "micro_batch": 1, "global_batch": 64, "precision": "bf16", "optimizer": "adamw",
    "activation_checkpointing": "full", "steps": 100,
}  # fmt: skip
DEGREES = ("tp", "pp", "vpp", "cp", "ep", "sequence_parallel")


def titan_python() -> str:
    found = torchtitan_python()
    if found is not None:
        return found
    if os.environ.get("CI"):
        pytest.fail("torchtitan is not importable: .ci/run installs it and sets TRAINPLAN_TORCHTITAN_PYTHON")
    pytest.skip("torchtitan is not installed here (pip install torchtitan==0.3.0, or set TRAINPLAN_TORCHTITAN_PYTHON)")


def resolve(tmp_path: Path, job: dict, *, out: str = "out", **request):
    degrees = {k: request.pop(k) for k in DEGREES if k in request}
    path = write_job(tmp_path / "job.yaml", job)
    req = LaunchRequest(job_path=path, target=Target.TORCHTITAN, out=tmp_path / out, checkpoint_minutes=None,
                        degrees=degrees, **request)  # fmt: skip
    return resolve_launch(req)


def args_of(argv: tuple[str, ...]) -> dict[str, str]:
    """``--flag value`` pairs after ``torchtitan.train`` (a flag without a value maps to "")."""
    rest = list(argv[argv.index("torchtitan.train") + 1:])
    out: dict[str, str] = {}
    while rest:
        flag = rest.pop(0)
        out[flag] = rest.pop(0) if rest and not rest[0].startswith("--") and flag.startswith("--") else ""
    return out


def test_layout_batch_and_recipe_are_rendered(tmp_path: Path) -> None:
    job = {**PRETRAIN_8B, "activation_checkpointing": "selective"}
    with pytest.raises(SpecError, match="rendezvous host"):
        render(resolve(tmp_path, job, gpu="H100-80GB", gpus=8, nodes=2, tp=2, pp=2, vpp=2,
                       sequence_parallel=True, strategy="fsdp"))  # fmt: skip
    plan = resolve(tmp_path, job, gpu="H100-80GB", gpus=8, nodes=2, tp=2, pp=2, vpp=2, sequence_parallel=True,
                   strategy="fsdp", options=LaunchOptions(master_addr="10.0.0.1"))  # fmt: skip
    rendered = render(plan)
    assert len(rendered.commands) == 2  # one torchrun per node
    argv = rendered.commands[1].argv
    assert "--node-rank=1" in argv and "--nnodes=2" in argv and "--nproc-per-node=8" in argv
    a = args_of(argv)
    assert (a["--module"], a["--config"]) == ("llama3", "llama3_8b")
    # 16 GPUs = tp 2 × pp 2 × dp 4; fsdp shards over the 4 data-parallel ranks
    assert a["--parallelism.tensor-parallel-degree"] == "2" and a["--parallelism.pipeline-parallel-degree"] == "2"
    assert a["--parallelism.data-parallel-shard-degree"] == "4" and a["--parallelism.data-parallel-replicate-degree"] == "1"
    assert "--parallelism.enable-sequence-parallel" in a
    assert a["--parallelism.pipeline-parallel-schedule"] == "Interleaved1F1B"
    assert a["--parallelism.pipeline-parallel-layers-per-stage"] == "8"  # 32 blocks over 2 × 2 stages
    # global batch 64 sequences over 4 data-parallel ranks: 16 per rank, pushed through the pipeline in micro-batches of 1
    assert (a["--training.local-batch-size"], a["--training.global-batch-size"]) == ("16", "64")
    assert a["--parallelism.pipeline-parallel-microbatch-size"] == "1"
    assert a["--training.seq-len"] == "8192" and a["--training.steps"] == str(plan.config.total_steps)
    assert "activation-checkpoint:selective" in a
    assert plan.micro_steps == 16
    assert any("set stack: torchtitan" in n for n in rendered.notes)  # estimated for stack plain
    assert any("learning_rate (0.0001) is not passed" in n for n in rendered.notes)
    titan = resolve(tmp_path, {**job, "stack": "torchtitan"}, out="t", gpu="H100-80GB", gpus=8, tp=2, pp=2, strategy="fsdp")
    assert not any("set stack" in n for n in render(titan).notes)


def test_the_plans_pipeline_split_is_torchtitans(tmp_path: Path) -> None:
    """stack torchtitan counts the embedding and head as a block each (its defaults, knobs.pipeline_*_stage_less_layers
    1): 32 blocks + 2 over 4 stages are 9 units a stage (torchtitan deals 9, 9, 8, 8 and gives the first and last one
    back), as the plan estimated; over 8 stages no size gives 8, and torchtitan's own one-stage-per-rank count does."""
    job = {**PRETRAIN_8B, "stack": "torchtitan"}
    a = args_of(render(resolve(tmp_path, job, gpu="H100-80GB", gpus=8, pp=4, strategy="fsdp")).commands[0].argv)
    assert a["--parallelism.pipeline-parallel-layers-per-stage"] == "9"
    assert (a["--parallelism.pipeline-parallel-first-stage-less-layers"],
            a["--parallelism.pipeline-parallel-last-stage-less-layers"]) == ("1", "1")  # fmt: skip
    a = args_of(render(resolve(tmp_path, job, out="o8", gpu="H100-80GB", gpus=8, pp=8, strategy="fsdp")).commands[0].argv)
    assert "--parallelism.pipeline-parallel-layers-per-stage" not in a
    assert a["--parallelism.pipeline-parallel-schedule"] == "1F1B"
    plain = args_of(render(resolve(tmp_path, PRETRAIN_8B, out="p", gpu="H100-80GB", gpus=8, pp=4, strategy="fsdp")).commands[0].argv)
    assert plain["--parallelism.pipeline-parallel-layers-per-stage"] == "8"
    assert plain["--parallelism.pipeline-parallel-first-stage-less-layers"] == "0"


def test_data_parallel_strategies_map_to_replicate_and_shard(tmp_path: Path) -> None:
    # no torchtitan model fits one GPU's memory under DDP (an 8B keeps 120 GiB of model states): the fsdp plan with its
    # strategy swapped shows the mapping
    fsdp = resolve(tmp_path, PRETRAIN_8B, out="a", gpu="H100-80GB", gpus=8, strategy="fsdp")
    ddp = args_of(render(replace(fsdp, strategy=Strategy.DDP)).commands[0].argv)
    assert (ddp["--parallelism.data-parallel-replicate-degree"], ddp["--parallelism.data-parallel-shard-degree"]) == ("8", "1")
    # no pipeline: one micro-batch per rank and step, gradient accumulation up to the global batch
    assert (ddp["--training.local-batch-size"], ddp["--training.global-batch-size"]) == ("1", "64")
    grad_op = args_of(render(resolve(tmp_path, PRETRAIN_8B, out="b", gpu="H100-80GB", gpus=8,
                                     strategy="fsdp-grad-op")).commands[0].argv)  # fmt: skip
    assert grad_op["--parallelism.fsdp-reshard-after-forward"] == "never"
    assert grad_op["--parallelism.data-parallel-shard-degree"] == "8"


def test_refusals_are_one_line(tmp_path: Path) -> None:
    cases = [
        ({**PRETRAIN_8B, "model": "llama-7b"}, {}, "none of them"),  # the reference case's LLaMA-1: not a torchtitan model
        ({**PRETRAIN_8B, "method": "lora"}, {}, "trains all weights"),
        ({**PRETRAIN_8B, "precision": "fp16"}, {}, "no equivalent"),
        ({**PRETRAIN_8B, "optimizer": "adafactor"}, {}, "train with AdamW"),  # it would train AdamW regardless
        ({**PRETRAIN_8B, "model": "llama-3.1-405b", "global_batch": 2048}, {"gpus": 8, "nodes": 64, "tp": 8, "pp": 16},
         "set precision: fp8"),
        (PRETRAIN_8B, {"strategy": "zero2"}, "FSDP2, not DeepSpeed"),
        (PRETRAIN_8B, {"pp": 4, "vpp": 3, "gpus": 4}, "no size gives"),  # 32 blocks make 11 stages of 3 or 8 of 4, not 12
        # torchtitan 0.3.0's FullAC / SelectiveAC wrap every block: a share of them has no rendering
        ({**PRETRAIN_8B, "activation_checkpointing": "full", "knobs": {"checkpoint_fraction": 0.5}}, {},
         "checkpoints every block or none"),
    ]
    for i, (job, request, message) in enumerate(cases):
        request = {"gpu": "H100-80GB", "gpus": 8, "strategy": "fsdp", **request}
        with pytest.raises(SpecError, match=message):
            render(resolve(tmp_path, job, out=f"o{i}", **request))


def test_other_targets_refuse_model_parallel_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job(tmp_path / "job.yaml", PRETRAIN_8B)
    code = main(["launch", str(job), "--to", "torchrun", "--gpu", "H100-80GB", "--gpus", "8", "--tp", "2",
                 "--strategy", "fsdp", "--out", str(tmp_path / "x")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--to torchtitan or megatron renders" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
    code = main(["launch", str(job), "--to", "torchtitan", "--tp", "2", "--out", str(tmp_path / "y")])
    assert code == 2 and "--tp" in capsys.readouterr().err  # degrees belong to a named configuration


def test_plan_option_with_a_layout_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 405B pretraining example, in fp8 as torchtitan's llama3_405b trains it, within 300 hours: the plan's first
    option splits the model, and `launch --option 1 --to torchtitan` renders exactly that layout."""
    job = yaml.safe_load(example_path("llama3-405b-pretrain.yaml").read_text())
    job["precision"] = "fp8"
    job["constraints"]["deadline_hours"] = 300  # only layouts that split the model finish 2T tokens that fast
    path = write_job(tmp_path / "job.yaml", job)
    assert main(["plan", str(path), "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["options"][0]
    p = best["parallel"]
    assert p["tp"] * p["pp"] * p["cp"] > 1
    code = main(["launch", str(path), "--to", "torchtitan", "--option", "1", "--master-addr", "10.0.0.1",
                 "--out", str(tmp_path / "out"), "--json"])  # fmt: skip
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    a = args_of(tuple(record["commands"][0]["argv"]))
    assert a["--config"] == "llama3_405b"
    for key, flag in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context")):
        assert a[f"--parallelism.{flag}-parallel-degree"] == str(p[key])
    assert any("not checked here" in n and "float8" in n for n in record["notes"])
    nodes = len(record["commands"])
    assert nodes > 4  # within 300 h the plan needs hundreds of nodes
    # printed: nodes 0, 1 and the last, the rest summarised (launch.json keeps every command)
    assert main(["launch", str(path), "--to", "torchtitan", "--option", "1", "--master-addr", "10.0.0.1",
                 "--out", str(tmp_path / "out2")]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("# on node ") == 3 and f"nodes 2 to {nodes - 2}: the same command" in printed


def test_torchtitan_reads_the_rendered_layouts(tmp_path: Path) -> None:
    """torchtitan's ConfigManager parses each rendered command and reads back the plan's degrees and batch."""
    python = titan_python()
    moe = {**PRETRAIN_8B, "model": "qwen3-30b-a3b", "seq_len": 4096, "activation_checkpointing": "full"}
    cases = [
        ({**PRETRAIN_8B, "activation_checkpointing": "selective"}, dict(gpus=8, tp=2, pp=2, vpp=2, sequence_parallel=True, strategy="fsdp")),
        ({**PRETRAIN_8B, "knobs": {"compile": True}}, dict(gpus=8, cp=2, strategy="fsdp-grad-op", checkpoint_every=25)),
        ({**PRETRAIN_8B, "precision": "fp32", "seq_len": 2048, "activation_checkpointing": "none"},
         dict(gpus=8, tp=4, strategy="fsdp")),
        (moe, dict(gpus=8, ep=8, strategy="fsdp")),
    ]
    for i, (job, request) in enumerate(cases):
        plan = resolve(tmp_path, job, out=f"o{i}", **{"gpu": "H100-80GB", **request})
        read = check_with_torchtitan(render(plan), python)
        lay = plan.layout
        sharded = plan.strategy.shards_optimizer
        assert (read["tp"], read["pp"], read["cp"], read["ep"]) == (lay.tp, lay.pp, lay.cp, lay.ep)
        assert (read["dp_shard"], read["dp_replicate"]) == ((lay.data_parallel, 1) if sharded else (1, lay.data_parallel))
        assert read["global_batch"] == job["global_batch"] and read["seq_len"] == job["seq_len"]
        assert read["steps"] == plan.config.total_steps
        assert read["param_dtype"] == ("float32" if job["precision"] == "fp32" else "bfloat16")
        assert read["activation_checkpoint"].startswith({"none": "NoneType", "selective": "SelectiveAC", "full": "FullAC"}
                                                        [job["activation_checkpointing"]])  # fmt: skip
        if lay.tp > 1:
            assert read["sequence_parallel"] is lay.sequence_parallel
        assert read["compile"] is bool(job.get("knobs", {}).get("compile"))  # llama3_8b does not compile by itself
        every = request.get("checkpoint_every")
        assert read["checkpoint"][0] is bool(every) and (not every or read["checkpoint"][1] == every)
        if plan.strategy is Strategy.FSDP_GRAD_OP:
            assert read["reshard_after_forward"] == "never"
        if lay.pp > 1:
            assert read["layers_per_stage"] == 32 // (lay.pp * lay.vpp)
            assert read["schedule"] == ("Interleaved1F1B" if lay.vpp > 1 else "1F1B")
            assert read["local_batch"] == job["global_batch"] // lay.data_parallel


def test_a_pretrained_checkpoint_is_loaded_by_torchtitan(tmp_path: Path) -> None:
    """`model: ./checkpoint` (a save_pretrained folder whose config.json is Llama 3.1 8B): torchtitan loads its
    safetensors at the start (initial_load_in_hf, which needs the checkpointer on) and its tokenizer from the folder."""
    from trainplan.model import hf_config

    ckpt = tmp_path / "Llama-3.1-8B"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(hf_config(resolve_model("llama-3.1-8b", get_catalog()))))
    plan = resolve(tmp_path, {**PRETRAIN_8B, "model": str(ckpt), "task": "finetune"}, gpu="H100-80GB", gpus=8,
                   strategy="fsdp")  # fmt: skip
    rendered = render(plan)
    a = args_of(rendered.commands[0].argv)
    assert a["--checkpoint.initial-load-path"] == str(ckpt.resolve()) == a["--hf-assets-path"]
    assert "--checkpoint.initial-load-in-hf" in a and "--checkpoint.enable" in a
    assert any("from the weights in" in n for n in rendered.notes)
    read = check_with_torchtitan(rendered, titan_python())
    assert read["initial_load"] == [str(ckpt.resolve()), True, str(ckpt.resolve())] and read["checkpoint"][0] is True


def test_torchtitan_rejection_is_one_line(tmp_path: Path) -> None:
    """What torchtitan itself refuses comes back as one SpecError line (here a batch size that is not a number, put
    past trainplan's own checks by editing the rendered command)."""
    python = titan_python()
    rendered = render(resolve(tmp_path, PRETRAIN_8B, gpu="H100-80GB", gpus=8, strategy="fsdp"))
    argv = list(rendered.commands[0].argv)
    argv[argv.index("--training.local-batch-size") + 1] = "not-a-number"
    bad = replace(rendered, commands=(replace(rendered.commands[0], argv=tuple(argv)),))
    with pytest.raises(SpecError, match="ConfigManager rejected"):
        check_with_torchtitan(bad, python)


MODEL_COUNT = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
from torchtitan.config import ConfigManager
for pair in sys.argv[1:]:
    module, config = pair.split(":")
    c = ConfigManager().parse_args(["--module", module, "--config", config])
    with torch.device("meta"):
        model = c.model_spec.model.build()
    print("COUNT", pair, sum(p.numel() for p in model.parameters()))
"""


def test_torchtitan_models_equal_the_presets(tmp_path: Path) -> None:
    """Each torchtitan model trainplan maps a preset to has exactly the preset's parameter count (built on the meta
    device by torchtitan), so the plan and the rendered run train the same model."""
    python = titan_python()
    pairs = [f"{m.module}:{m.config}" for m in MODELS if not m.float8]  # float8 configs need an SM89+ GPU to load
    proc = subprocess.run([python, "-c", MODEL_COUNT, *pairs], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {line.split()[1]: int(line.split()[2]) for line in proc.stdout.splitlines() if line.startswith("COUNT ")}
    catalog = get_catalog()
    for m in MODELS:
        if m.float8:
            continue
        assert counts[f"{m.module}:{m.config}"] == param_counts(resolve_model(m.preset, catalog)).total - \
            param_counts(resolve_model(m.preset, catalog)).mtp, m.preset  # fmt: skip


def test_model_matching_is_by_architecture() -> None:
    catalog = get_catalog()
    assert titan_model(resolve_model("llama-3.1-8b", catalog)).config == "llama3_8b"
    assert titan_model(resolve_model("llama-3-8b", catalog)).config == "llama3_8b"  # same shapes as 3.1
    assert titan_model(resolve_model("mistral-7b", catalog)) is None
    wider = resolve_model("llama-3.1-8b", catalog).model_copy(update={"ffn_hidden": 16384})
    assert titan_model(wider) is None


def test_prepare_launch_notes_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torchtitan the render says it was not checked; it never claims a check it did not make."""
    monkeypatch.setenv("TRAINPLAN_TORCHTITAN_PYTHON", str(tmp_path / "no-python"))
    (tmp_path / "no-python").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "no-python").chmod(0o755)
    req = LaunchRequest(job_path=write_job(tmp_path / "job.yaml", PRETRAIN_8B), target=Target.TORCHTITAN, out=tmp_path / "o",
                        gpu="H100-80GB", gpus=8, strategy="fsdp", checkpoint_minutes=None, degrees={"tp": 2})  # fmt: skip
    _, rendered = prepare_launch(req)
    assert any(n.startswith("not checked here: torchtitan is not installed") for n in rendered.notes)


DEFAULTS = r"""
import json, warnings
warnings.filterwarnings("ignore")
from torchtitan.config import ConfigManager
for config in ("llama3_8b", "llama3_70b"):
    c = ConfigManager().parse_args(["--module", "llama3", "--config", config])
    print("DEFAULTS " + json.dumps({"loss": type(c.loss).__qualname__, "chunks": getattr(c.loss, "num_chunks", None),
                                    "implementation": c.optimizer.implementation, "compile": c.compile.enable}))
"""


def test_the_torchtitan_stack_is_what_torchtitan_configures(tmp_path: Path) -> None:
    """stacks.yaml's `torchtitan` row against the config torchtitan itself builds: its chunked loss with per-chunk
    backward (trainplan's fused-linear accounting), the fused AdamW, no compile."""
    from trainplan.spec import LossImpl

    python = titan_python()
    proc = subprocess.run([python, "-c", DEFAULTS], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    knobs = get_catalog().stacks["torchtitan"]["knobs"]
    for line in (x for x in proc.stdout.splitlines() if x.startswith("DEFAULTS ")):
        read = json.loads(line.removeprefix("DEFAULTS "))
        assert read["loss"] == "ChunkedLossWrapper.Config" and knobs["loss"] == LossImpl.FUSED_LINEAR.value
        assert (read["implementation"] == "fused") is knobs["fused_optimizer"]
        assert read["compile"] is knobs["compile"]


def test_the_pipeline_split_equals_torchtitans_own() -> None:
    """trainplan's chunk_layers (estimate/parallel.py) against torchtitan 0.3.0's _generate_llm_fqn_per_model_part on
    the same counts: blocks per stage, embedding and head weighted 0 or 1, even and uneven."""
    from trainplan.estimate.parallel import chunk_layers
    from trainplan.estimate.transformer import transformer_profile
    from trainplan.spec import parse_job
    from trainplan.strategies import Layout

    python = titan_python()
    cases = [(32, 4, 1, 1), (126, 16, 1, 1), (32, 8, 0, 0), (30, 8, 1, 1), (32, 12, 1, 0), (61, 8, 1, 1), (80, 10, 2, 1)]
    code = ("import json, sys\nfrom torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part as g\n"
            "print(json.dumps([[sum(n.startswith('layers.') for n in stage) for stage in g(s, n, a, b)]"
            " for n, s, a, b in json.loads(sys.argv[1])]))")  # fmt: skip
    done = subprocess.run([python, "-c", code, json.dumps(cases)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    split = transformer_profile(parse_job(PRETRAIN_8B), get_catalog()).split
    assert split is not None
    for (layers, stages, first, last), expected in zip(cases, theirs):
        ours = chunk_layers(replace(split, layers=layers, first_stage_less=first, last_stage_less=last),
                            Layout(stages, 1, pp=stages))  # fmt: skip
        assert list(ours) == expected, (layers, stages, first, last)
