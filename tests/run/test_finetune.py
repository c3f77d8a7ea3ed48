"""`trainplan run` fine-tunes a real pretrained checkpoint on the user's data (issue 17).

The checkpoint is made here, offline (tests/run/pretrained_support.py): a BPE
tokenizer trained on the test's text and a 2-layer Llama trained on it, saved
with ``save_pretrained``.  Each run starts two real worker processes over gloo.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import FAULT_VARS, run, write_job
from pretrained_support import make_checkpoint, write_data
from trainplan.errors import SpecError
from trainplan.run.api import RunRequest, execute
from trainplan.run.workloads import textdata
from trainplan.spec import DataFormat

pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("pretrained") / "ckpt")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_data(tmp_path_factory.mktemp("ftdata"))


def job(ckpt: Path, data: Path, **changes: Any) -> dict[str, Any]:
    base = {"kind": "transformer", "name": "ft", "model": str(ckpt), "data": str(data), "seq_len": 32,
            "micro_batch": 4, "steps": 8, "learning_rate": 0.002, "precision": "fp32", "seed": 3,
            "data_format": {"eval_fraction": 0.1}}
    return {**base, **changes}


def metric_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def base_loss_on(ckpt: Path, out: Path, *, step: int, world: int, micro_batch: int) -> float:
    """The base model's loss on the batch of ``step`` (every rank's micro-batch), computed with transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    train, _ = textdata.read_cache(out)
    config = json.loads((out / "run.json").read_text())
    sampler = textdata.RowSampler(train, seed=config["job"]["seed"], world_size=world, micro_batch=micro_batch,
                                  grad_accum=config["grad_accum"])
    losses = []
    with torch.no_grad():
        for rank in range(world):
            batch = sampler.batch(step, 0, rank)
            losses.append(float(model(input_ids=batch["input_ids"], labels=batch["labels"]).loss))
    return sum(losses) / world


def loss_of(model: torch.nn.Module, rows: textdata.TokenRows) -> float:
    with torch.no_grad():
        return float(model(input_ids=rows.input_ids.long(), labels=rows.labels.long()).loss)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero2", "zero3"])
def test_finetune_starts_from_the_checkpoint_and_saves_a_loadable_result(tmp_path, ckpt, data, strategy, method) -> None:
    if strategy.startswith("zero"):
        pytest.importorskip("deepspeed")
    extra = {"method": "lora", "lora": {"rank": 4, "targets": ["all-linear"]}} if method == "lora" else {}
    out = tmp_path / "run"
    summary = run(write_job(tmp_path / "job.yaml", job(ckpt, data["chat"], **extra)), out,
                  strategy=strategy, devices=2)
    assert summary.status == "completed", summary.message
    lines = metric_lines(out)
    steps = [r for r in lines if "event" not in r]
    # 1. the first step's loss is the base model's loss on the same rows: training started from the weights
    expected = base_loss_on(ckpt, out, step=0, world=2, micro_batch=4)
    assert steps[0]["loss"] == pytest.approx(expected, rel=1e-4)
    load = next(r["how"] for r in lines if r.get("event") == "load")
    # FSDP: built on meta, each rank read its own rows; ZeRO-3: partitioned as each parameter was created
    assert load.startswith({"fsdp": "sharded", "zero3": "partitioned"}.get(strategy, "whole"))
    evals = [r for r in lines if r.get("event") == "eval"]
    assert evals and evals[-1]["step"] == 8 and evals[-1]["eval_loss"] > 0

    # 2. the result loads as transformers / peft load it, and has learned the data
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = out / "final"
    assert AutoTokenizer.from_pretrained(final).chat_template
    base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    if method == "lora":
        from peft import PeftModel

        assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32), final).eval()
    else:
        tuned = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    train, evaluation = textdata.read_cache(out)
    assert evaluation is not None
    assert loss_of(tuned, train) < loss_of(base, train) - 0.5  # the base never saw this chat format
    # eval loss in metrics is the saved model's loss per target token on the eval rows
    assert evals[-1]["eval_loss"] == pytest.approx(loss_of(tuned, evaluation), rel=0.02)

    # 3. the weights moved from the checkpoint's, not from a random initialisation
    if method == "full":
        torch.manual_seed(3)  # the job's seed: what a random initialisation by the run would have drawn
        random_init = AutoModelForCausalLM.from_config(base.config)
        w_tuned = tuned.model.layers[0].mlp.up_proj.weight
        w_base = base.model.layers[0].mlp.up_proj.weight
        w_rand = random_init.model.layers[0].mlp.up_proj.weight
        cos = torch.nn.functional.cosine_similarity
        assert (w_tuned != w_base).any()
        assert cos(w_tuned.flatten(), w_base.flatten(), dim=0) > 0.8
        assert abs(cos(w_tuned.flatten(), w_rand.flatten(), dim=0)) < 0.2


@pytest.mark.slow
def test_a_killed_finetune_resumes_to_the_same_weights(tmp_path, ckpt, data, monkeypatch) -> None:
    spec = job(ckpt, data["chat"], steps=6, method="lora", lora={"rank": 4})
    whole = run(write_job(tmp_path / "a.yaml", spec), tmp_path / "whole", strategy="ddp", devices=2)
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "4")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "1")
    killed = run(write_job(tmp_path / "b.yaml", spec), tmp_path / "killed", strategy="ddp", devices=2, checkpoint_every=2)
    for var in FAULT_VARS:
        monkeypatch.delenv(var)
    assert whole.status == killed.status == "completed", killed.message
    assert killed.restarts == 1
    assert killed.measured["final_loss"] == pytest.approx(whole.measured["final_loss"], abs=1e-6)
    from safetensors.torch import load_file

    a = load_file(tmp_path / "whole" / "final" / "adapter_model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- bad input: one line, nothing touched


def _refused(tmp_path: Path, spec: dict[str, Any]) -> SpecError:
    out = tmp_path / "existing"
    out.mkdir(exist_ok=True)
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SpecError) as err:
        execute(RunRequest(job_path=write_job(tmp_path / "bad.yaml", spec), out=out, overwrite=True))
    assert (out / "keep.txt").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert "\n" not in str(err.value)
    return err.value


def _copy(ckpt: Path, tmp_path: Path, *, drop: tuple[str, ...] = ()) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(ckpt, target)
    for name in drop:
        (target / name).unlink()
    return target


def test_a_checkpoint_without_weights_is_refused(tmp_path, ckpt, data) -> None:
    err = _refused(tmp_path, job(_copy(ckpt, tmp_path, drop=("model.safetensors",)), data["text"]))
    assert err.field == "model" and "no weights" in str(err)


def test_a_checkpoint_without_a_tokenizer_is_refused(tmp_path, ckpt, data) -> None:
    err = _refused(tmp_path, job(_copy(ckpt, tmp_path, drop=("tokenizer.json",)), data["text"]))
    assert err.field == "model" and "no tokenizer" in str(err)


def test_weights_of_another_model_are_refused(tmp_path, ckpt, data) -> None:
    target = _copy(ckpt, tmp_path)
    config = json.loads((target / "config.json").read_text())
    config["intermediate_size"] = 96
    (target / "config.json").write_text(json.dumps(config))
    err = _refused(tmp_path, job(target, data["text"]))
    assert err.field == "model" and "do not belong together" in str(err)


def test_a_data_file_without_the_named_field_is_refused(tmp_path, ckpt, data) -> None:
    err = _refused(tmp_path, job(ckpt, data["text"], data_format={"style": "instruction"}))
    assert err.field == "data" and "record 1: field 'instruction' is missing" in str(err)


@pytest.mark.parametrize("content", [b"", b"\n\n", b"PK\x03\x04\x00\x00binary"])
def test_empty_and_binary_data_files_are_refused(tmp_path, ckpt, content) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    err = _refused(tmp_path, job(ckpt, path))
    assert err.field == "data" and ("empty" in str(err) or "binary" in str(err))


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_structured_files_it_does_not_parse_are_refused_not_read_as_text(tmp_path, ckpt, suffix) -> None:
    path = tmp_path / f"data{suffix}"
    path.write_text('[{"text": "the cat sat"}]' if suffix == ".json" else "text\nthe cat sat\n")
    err = _refused(tmp_path, job(ckpt, path))
    assert err.field == "data" and f"{suffix} files are not read" in str(err)


def test_chat_data_without_a_chat_template_is_refused(tmp_path, ckpt, data) -> None:
    target = _copy(ckpt, tmp_path, drop=("chat_template.jinja",))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    err = _refused(tmp_path, job(target, data["chat"]))
    assert err.field == "data_format.style" and "no chat template" in str(err)


def test_a_checkpoint_needs_a_data_file_and_data_format_needs_a_checkpoint(tmp_path, ckpt) -> None:
    assert _refused(tmp_path, job(ckpt, "synthetic", data_format=None)).field == "data"
    llama = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn_hidden": 64, "vocab": 256}
    assert _refused(tmp_path, job(ckpt, "synthetic") | {"model": llama}).field == "data_format"


def test_resuming_with_changed_data_is_refused(tmp_path, ckpt, data) -> None:
    out = tmp_path / "run"
    copy = tmp_path / "instruct.jsonl"
    shutil.copy(data["instruction"], copy)
    spec = write_job(tmp_path / "job.yaml", job(ckpt, copy, steps=1, data_format=None))
    assert run(spec, out, strategy="single").status == "completed"
    copy.write_text(copy.read_text().replace("add 1", "add 9"))
    with pytest.raises(SpecError) as err:
        execute(RunRequest(job_path=spec, out=out, resume=True))
    assert err.value.field == "--resume" and "changed" in str(err.value)


# --------------------------------------------------------------------------- formatting, masks, sampling


def test_instruction_and_chat_masks_keep_the_loss_on_the_response_only(ckpt, data) -> None:
    tok = textdata.load_tokenizer(ckpt)
    for style in ("instruction", "chat"):
        prepared = textdata.prepare(ckpt, data[style], DataFormat(), 48, seed=0)
        assert prepared.stats.style == style and not prepared.stats.packing
        ids, labels = prepared.train.input_ids[0].long(), prepared.train.labels[0].long()
        learned = tok.decode(ids[labels != textdata.IGNORE])
        answer = learned.replace(tok.eos_token, "")
        assert answer.strip().isdigit()  # the sum, and nothing of the question
        assert learned.endswith(tok.eos_token)
        assert (labels[ids == tok.pad_token_id] == textdata.IGNORE).all()


def test_text_is_packed_into_full_rows_with_eos_between_documents(ckpt, data) -> None:
    tok = textdata.load_tokenizer(ckpt)
    prepared = textdata.prepare(ckpt, data["text"], DataFormat(), 32, seed=0)
    assert prepared.stats.packing and prepared.stats.dropped == 0
    assert torch.equal(prepared.train.input_ids, prepared.train.labels)  # every token has a loss
    docs = [json.loads(line)["text"] for line in data["text"].read_text().splitlines()]
    stream = []
    for d in docs:
        stream += tok(d)["input_ids"] + [tok.eos_token_id]
    assert prepared.train.rows == len(stream) // 32
    assert prepared.train.input_ids.flatten().tolist() == stream[: prepared.train.rows * 32]
    plain = textdata.prepare(ckpt, data["plain"], DataFormat(), 32, seed=0)
    assert plain.stats.style == "text" and plain.train.rows > 0


def test_rows_are_a_pure_function_of_step_micro_and_rank_and_cover_each_epoch(ckpt, data) -> None:
    prepared = textdata.prepare(ckpt, data["text"], DataFormat(), 16, seed=0)
    rows = prepared.train.rows
    sampler = textdata.RowSampler(prepared.train, seed=5, world_size=2, micro_batch=3, grad_accum=2)
    again = textdata.RowSampler(prepared.train, seed=5, world_size=2, micro_batch=3, grad_accum=2)
    assert sampler.indices(7, 1, 1) == again.indices(7, 1, 1)
    seen = [i for step in range(-(-rows // 12) + 1) for m in range(2) for r in range(2) for i in sampler.indices(step, m, r)]
    assert sorted(seen[:rows]) == list(range(rows))  # the first epoch visits every row once


def test_the_estimate_reads_the_same_checkpoint(ckpt) -> None:
    from trainplan.catalog import resolve_model
    from trainplan.estimate.architecture import param_counts
    from transformers import AutoModelForCausalLM

    arch = resolve_model(str(ckpt))
    assert param_counts(arch).total == AutoModelForCausalLM.from_pretrained(ckpt).num_parameters()


@pytest.mark.slow
def test_the_shipped_example_runs_with_a_local_checkpoint(tmp_path, ckpt) -> None:
    """src/trainplan/examples/finetune-local.yaml (the README's third line) on the test's checkpoint."""
    import yaml

    import trainplan

    examples = Path(trainplan.__file__).parent / "examples"
    spec = yaml.safe_load((examples / "finetune-local.yaml").read_text())
    spec |= {"model": str(ckpt), "data": str(examples / "data" / "instructions.jsonl")}
    out = tmp_path / "run"
    summary = run(write_job(tmp_path / "job.yaml", spec), out)
    assert summary.status == "completed", summary.message
    stats = json.loads((out / "data" / "data.json").read_text())["stats"]
    assert stats["style"] == "instruction" and stats["examples"] == 54 and stats["eval_examples"] == 6
    # epochs: 2 over the tokenized rows (54), global batch 8 → ceil(108 / 8) optimizer steps
    assert summary.steps == 14
    assert (out / "final" / "model.safetensors").is_file()
