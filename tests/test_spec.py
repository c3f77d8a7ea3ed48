"""Job-file parsing and validation (trainplan.spec): one clear SpecError per bad input, naming the field.

The CLI-level behaviour of the same inputs (exit code 2, one ``error:`` line on stderr) is in test_cli.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from trainplan import SpecError, TabularJob, TorchJob, TransformerJob, load_job, parse_job
from trainplan.spec import Checkpointing, FlashAttention, Method, ModelArch, Precision

FIXTURES = Path(__file__).parent / "fixtures" / "jobs"
EXAMPLES = Path(__file__).parents[1] / "src" / "trainplan" / "examples"
OLD_EXAMPLES = ("llama7b-sft.yaml", "gpt2-pretrain.yaml", "llama2-70b-lora.yaml", "xgboost-10m.yaml")


def _job_dict(name: str = "llama7b-sft.yaml") -> dict:
    return yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))


def _spec_error(data: dict) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_job(data)
    err = info.value
    assert "\n" not in str(err), "a spec error is one line"
    return err


# ----------------------------------------------------------------------------- old job files (format compatibility)


@pytest.mark.parametrize("name", OLD_EXAMPLES)
def test_old_example_job_files_still_parse(name: str) -> None:
    """The four job files shipped with 0.1 are kept verbatim as fixtures; they must keep parsing."""
    job = load_job(FIXTURES / name)
    assert job.name == Path(name).stem


@pytest.mark.parametrize("name", OLD_EXAMPLES)
def test_fixture_copies_parse_like_the_shipped_examples(name: str) -> None:
    old, shipped = load_job(FIXTURES / name), load_job(EXAMPLES / name)
    if name == "llama7b-sft.yaml":
        # the shipped reference job no longer lists the four built-in clouds: every cloud of the catalog (issue 19)
        assert old.constraints.clouds == ("aws", "gcp", "azure", "local") and shipped.constraints.clouds is None
        old = old.model_copy(update={"constraints": old.constraints.model_copy(update={"clouds": None})})
    assert old == shipped


def test_reference_job_values() -> None:
    job = load_job(FIXTURES / "llama7b-sft.yaml")
    assert isinstance(job, TransformerJob)
    assert job.model == "llama-7b"
    assert (job.seq_len, job.micro_batch, job.global_batch) == (512, 4, 128)
    assert job.precision is Precision.BF16 and job.method is Method.FULL
    assert job.total_tokens(128) == 7.8e7
    assert job.total_steps(128) == 1191  # ceil(7.8e7 / (128 * 512))


def test_fixture_with_every_transformer_field() -> None:
    job = load_job(FIXTURES / "inline-arch-all-fields.yaml")
    assert isinstance(job, TransformerJob)
    assert isinstance(job.model, ModelArch) and job.model.kv_heads == 2 and job.model.head_dim == 32
    assert job.lora_spec is not None and job.lora_spec.rank == 16
    assert job.activation_checkpointing is Checkpointing.SELECTIVE
    assert job.flash_attention is FlashAttention.TRUE  # YAML boolean accepted
    # epochs × examples × min(tokens_per_example, seq_len)
    assert job.total_tokens(16) == 2 * 10000 * 700
    assert job.constraints.deadline_hours == 48 and job.constraints.budget_usd == 500
    assert job.constraints.max_gpus == 8


def test_fixture_with_every_tabular_field() -> None:
    job = load_job(FIXTURES / "tabular-all-fields.yaml")
    assert isinstance(job, TabularJob)
    assert job.depth == 8  # log2(255 leaves) rounded up
    assert job.cv_folds == 5 and job.classes == 4
    assert list(job.constraints.clouds) == ["aws", "gcp"]


def test_fixture_torch_job() -> None:
    job = load_job(FIXTURES / "torch-mlp.yaml")
    assert isinstance(job, TorchJob)
    assert job.total_steps(256) == 704  # ceil(3 * 60000 / 256)


def test_fixture_boolean_checkpointing_means_full() -> None:
    job = load_job(FIXTURES / "t5-steps.yaml")
    assert job.activation_checkpointing is Checkpointing.FULL
    assert job.total_steps(8) == 1000


def test_job_is_frozen() -> None:
    job = load_job(FIXTURES / "llama7b-sft.yaml")
    with pytest.raises(Exception):
        job.micro_batch = 8  # type: ignore[misc]


# ----------------------------------------------------------------------------- load_job errors


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nkind: transformer\nmodel: [llama-7b\nseq_len: 512\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_job(p)
    msg = str(info.value)
    assert "malformed YAML" in msg
    assert "line 4, column 8" in msg
    assert str(p) in msg


def test_tab_indentation_is_malformed_yaml(tmp_path: Path) -> None:
    p = tmp_path / "tab.yaml"
    p.write_text("kind: tabular\n\tlibrary: xgboost\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"malformed YAML at line 2, column 1"):
        load_job(p)


def test_missing_job_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="job file not found"):
        load_job(tmp_path / "nope.yaml")


def test_job_file_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="is a directory"):
        load_job(tmp_path)


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n"])
def test_job_file_not_a_mapping(tmp_path: Path, text: str) -> None:
    p = tmp_path / "j.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_job(p)


def test_non_utf8_job_file_is_a_spec_error(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"kind: transformer\nmodel: llama-7b\nname: caf\xe9\n")
    with pytest.raises(SpecError):
        load_job(p)


# ----------------------------------------------------------------------------- parse_job errors


def test_missing_required_field() -> None:
    data = _job_dict()
    del data["seq_len"]
    err = _spec_error(data)
    assert err.field == "seq_len"
    assert "is required" in str(err)


def test_missing_kind() -> None:
    data = _job_dict()
    del data["kind"]
    err = _spec_error(data)
    assert err.field == "kind"


def test_unknown_kind_suggests_the_close_one() -> None:
    data = _job_dict()
    data["kind"] = "transfomer"
    err = _spec_error(data)
    assert err.field == "kind"
    assert "did you mean 'transformer'" in str(err)


def test_unknown_field_did_you_mean() -> None:
    data = _job_dict()
    data["micro_bach"] = data.pop("micro_batch")
    err = _spec_error(data)
    assert err.field == "micro_bach"
    assert "unknown field" in str(err)
    assert "did you mean 'micro_batch'" in str(err)


def test_unknown_nested_field_did_you_mean() -> None:
    data = _job_dict()
    data["constraints"] = {"deadline_hour": 5}
    err = _spec_error(data)
    assert err.field == "constraints.deadline_hour"
    assert "did you mean 'deadline_hours'" in str(err)


def test_unknown_field_in_inline_model() -> None:
    data = {"kind": "transformer", "seq_len": 8, "micro_batch": 1, "steps": 10,
            "model": {"layers": 2, "hiden": 64, "heads": 2, "ffn_hidden": 128, "vocab": 100}}  # fmt: skip
    err = _spec_error(data)
    assert err.field == "model.hiden"
    assert "'hidden'" in str(err)


def test_unknown_model_preset_lists_close_matches() -> None:
    data = _job_dict()
    data["model"] = "llama-7"
    err = _spec_error(data)
    assert err.field == "model"
    msg = str(err)
    assert "unknown model preset 'llama-7'" in msg
    assert "llama-7b" in msg and "llama-2-7b" in msg


def test_model_preset_is_case_insensitive() -> None:
    data = _job_dict()
    data["model"] = "LLaMA-7B"
    assert parse_job(data).model == "LLaMA-7B"


@pytest.mark.parametrize(
    ("base", "field", "value"),
    [
        ("llama7b-sft.yaml", "micro_batch", 0),
        ("llama7b-sft.yaml", "seq_len", -1),
        ("llama7b-sft.yaml", "tokens", 0),
        ("llama7b-sft.yaml", "global_batch", -128),
        ("xgboost-10m.yaml", "rows", 0),
        ("xgboost-10m.yaml", "features", -3),
        ("xgboost-10m.yaml", "trees", 0),
    ],
)
def test_zero_or_negative_sizes_are_rejected(base: str, field: str, value: int) -> None:
    data = _job_dict(base)
    data[field] = value
    err = _spec_error(data)
    assert err.field == field
    assert "must be > 0" in str(err)
    assert repr(value) in str(err)


def test_fractional_size_is_rejected() -> None:
    data = _job_dict()
    data["micro_batch"] = 2.5
    err = _spec_error(data)
    assert err.field == "micro_batch"
    assert "integer" in str(err)


def test_counts_in_scientific_notation_as_yaml_reads_them(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1) reads ``rows: 1e7`` — no dot — as the string "1e7": a whole count written so is that count;
    a fraction or an overflow written so is still refused on the field."""
    path = tmp_path / "job.yaml"
    path.write_text("kind: tabular\nlibrary: xgboost\nrows: 1e7\nfeatures: 2_000\ntrees: 5E2\n", encoding="utf-8")
    assert yaml.safe_load(path.read_text())["rows"] == "1e7"  # what the loader hands over
    job = load_job(path)
    assert isinstance(job, TabularJob) and (job.rows, job.features, job.trees) == (10_000_000, 2000, 500)
    for bad in ("1.5e0", "1e99", "e6"):
        path.write_text(f"kind: tabular\nlibrary: xgboost\nrows: {bad}\nfeatures: 100\n", encoding="utf-8")
        with pytest.raises(SpecError) as info:
            load_job(path)
        assert info.value.field == "rows"


def test_global_batch_not_a_multiple_of_micro_batch() -> None:
    data = _job_dict()
    data["global_batch"] = 130
    err = _spec_error(data)
    msg = str(err)
    assert "global_batch (130) must be a multiple of micro_batch (4)" in msg


@pytest.mark.parametrize(
    ("constraints", "field", "needle"),
    [
        ({"deadline_hours": 0}, "constraints.deadline_hours", "must be > 0"),
        ({"deadline_hours": -1}, "constraints.deadline_hours", "must be > 0"),
        ({"budget_usd": -5}, "constraints.budget_usd", "must be > 0"),
        ({"clouds": ["ibm cloud!"]}, "constraints.clouds", "not a cloud name"),  # a name unknown to the catalog: plan
        ({"clouds": []}, "constraints.clouds", "at least one cloud"),
        ({"max_gpus": 0}, "constraints.max_gpus", "must be > 0"),
    ],
)
def test_bad_constraints(constraints: dict, field: str, needle: str) -> None:
    data = _job_dict()
    data["constraints"] = constraints
    err = _spec_error(data)
    assert err.field == field
    assert needle in str(err)


def test_unknown_enum_value_lists_the_allowed_ones() -> None:
    data = _job_dict("xgboost-10m.yaml")
    data["library"] = "xgbost"
    err = _spec_error(data)
    assert err.field == "library"
    assert "'xgboost'" in str(err) and "'lightgbm'" in str(err)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tokens": None}, "give exactly one of tokens, steps, or epochs"),
        ({"steps": 10}, "got tokens, steps"),
        ({"tokens": None, "epochs": 2}, "epochs needs dataset"),
        ({"lora": {"rank": 8}}, "method is full"),
    ],
)
def test_job_length_and_lora_rules(change: dict, needle: str) -> None:
    data = _job_dict()
    for k, v in change.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    assert needle in str(_spec_error(data))


def test_unknown_lora_target() -> None:
    data = _job_dict("llama2-70b-lora.yaml")
    data["lora"] = {"targets": ["q_proj", "qkv"]}
    err = _spec_error(data)
    assert err.field == "lora.targets"
    assert "unknown target 'qkv'" in str(err)


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        pytest.param({"layers": 0}, "model.layers", "must be > 0", id="layers-0"),
        pytest.param({"heads": 6, "kv_heads": 4}, "model", "multiple of kv_heads", id="gqa"),
        pytest.param({"mlp": "relu"}, "model.mlp", "'swiglu'", id="mlp-enum"),
    ],
)
def test_invalid_inline_architecture_names_the_model_field(change: dict, field: str, needle: str) -> None:
    model = {"layers": 2, "hidden": 64, "heads": 2, "ffn_hidden": 128, "vocab": 100, **change}
    data = {"kind": "transformer", "seq_len": 8, "micro_batch": 1, "steps": 1, "model": model}
    err = _spec_error(data)
    assert err.field == field
    assert needle in str(err)
    assert "valid string" not in str(err)


def test_valid_inline_architecture() -> None:
    model = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 100}
    job = parse_job({"kind": "transformer", "seq_len": 8, "micro_batch": 1, "steps": 1, "model": model})
    assert isinstance(job.model, ModelArch) and job.model.kv_heads == 2


def test_torch_model_must_be_an_import_path() -> None:
    data = yaml.safe_load((FIXTURES / "torch-mlp.yaml").read_text(encoding="utf-8"))
    data["model"] = "my_package.models.make_mlp"
    err = _spec_error(data)
    assert err.field == "model"
    assert "package.module:factory" in str(err)


def test_source_is_named_in_file_errors(tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    shutil.copy(FIXTURES / "llama7b-sft.yaml", p)
    p.write_text(p.read_text(encoding="utf-8").replace("micro_batch: 4", "micro_batch: 0"), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_job(p)
    assert str(info.value).startswith(f"{p}: micro_batch: ")


@pytest.mark.parametrize("name", ["x\ntouch pwned\n#", "a b", "[/bold]", "", "-x", "a" * 101, "x;rm -rf ~", "名前",
                                  "x\n---\nrun: id"])  # fmt: skip
def test_a_job_name_outside_the_safe_set_is_refused(name: str) -> None:
    data = yaml.safe_load((FIXTURES / "torch-mlp.yaml").read_text(encoding="utf-8"))
    data["name"] = name
    err = _spec_error(data)
    assert err.field == "name" and "letters, digits" in str(err)
    assert "\n" not in str(err).replace(repr(name), "")


def test_a_job_name_in_the_safe_set_is_kept() -> None:
    data = yaml.safe_load((FIXTURES / "torch-mlp.yaml").read_text(encoding="utf-8"))
    data["name"] = "Llama-3.1_8B.sft-v2"
    assert parse_job(data).name == "Llama-3.1_8B.sft-v2"


@pytest.mark.parametrize("field, value, needle", [
    ("tokens", float("inf"), "finite number"),
    ("tokens", float("nan"), "finite number"),
    ("tokens", 1e308, "less than"),
    ("seq_len", 10**400, "less than"),
    ("micro_batch", 10**41, "less than"),
])  # fmt: skip
def test_values_that_would_overflow_are_refused(field: str, value: object, needle: str) -> None:
    data = {"name": "x", "kind": "transformer", "model": "llama-7b", "seq_len": 512, "micro_batch": 1, "tokens": 1e9}
    data[field] = value
    err = _spec_error(data)
    assert err.field == field and needle in str(err)


@pytest.mark.parametrize("text, needle", [
    ("a: " + "[" * 20000 + "]" * 20000 + "\n", "nested deeper than 50 levels"),
    ("\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]"
                                                          for i in range(1, 12)]) + "\n", "more than 100 aliases"),
    ("name: a\nkind: transformer\nseq_len: 8\nseq_len: 4096\n", "duplicate key 'seq_len'"),
])  # fmt: skip
def test_hostile_yaml_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(text)
    with pytest.raises(SpecError, match=needle) as info:
        load_job(f)
    assert "\n" not in str(info.value)


def test_a_job_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "job.fifo"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_job(fifo)  # returns at once: a FIFO is never opened
