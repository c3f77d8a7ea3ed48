"""`trainplan launch --to megatron`: the plan's tensor / pipeline / context / expert-parallel layout as Megatron-LM
`pretrain_gpt.py` arguments, built into Megatron Core's own TransformerConfig (whose checks run) before anything is
written.  Megatron Core (`pip install megatron-core`, the `megatron` extra) is installed by .ci/run; under CI a
missing one fails the tests that need it instead of skipping them."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import write_job

from trainplan.model import ModelArch, MoE
from trainplan.cli.main import main
from trainplan.errors import SpecError
from trainplan.run.targets import LaunchOptions, LaunchRequest, Target, prepare_launch
from trainplan.run.targets.megatron import (
    arguments,
    check,
    check_with_megatron_core,
    megatron_core_available,
    render,
    transformer_config_kwargs,
)
from trainplan.measure.probe import Accelerator
from trainplan.run.targets.plan import resolve_launch
from trainplan.spec import Method, Precision, StackKnobs
from trainplan.strategies import Strategy

PRETRAIN_70B = {
    "name": "l70", "kind": "transformer", "model": "llama-3.1-70b", "task": "pretrain", "method": "full",
    "seq_len": 4096, "micro_batch": 1, "global_batch": 64, "precision": "bf16", "optimizer": "adamw",
    "activation_checkpointing": "selective", "steps": 50, "knobs": {"selective_recompute": "attention-core"},
}  # fmt: skip
DEGREES = ("tp", "pp", "vpp", "cp", "ep", "sequence_parallel")
NODE0 = LaunchOptions(master_addr="10.0.0.1")


def need_megatron_core() -> None:
    if megatron_core_available():
        return
    if os.environ.get("CI"):
        pytest.fail("megatron-core is not importable: .ci/run installs the megatron extra")
    pytest.skip("megatron-core is not installed here (pip install -e '.[megatron]')")


def resolve(tmp_path: Path, job: dict, **request):
    degrees = {k: request.pop(k) for k in DEGREES if k in request}
    path = write_job(tmp_path / "job.yaml", job)
    req = LaunchRequest(job_path=path, target=Target.MEGATRON, out=tmp_path / "out", checkpoint_minutes=None,
                        degrees=degrees, **request)  # fmt: skip
    return resolve_launch(req)


def args_of(argv: tuple[str, ...]) -> dict[str, str]:
    """``--flag value`` pairs after pretrain_gpt.py (a switch maps to "")."""
    rest = list(argv[next(i for i, a in enumerate(argv) if a.endswith("pretrain_gpt.py")) + 1:])
    out: dict[str, str] = {}
    while rest:
        flag = rest.pop(0)
        out[flag] = rest.pop(0) if rest and not rest[0].startswith("--") else ""
    return out


def test_a_dense_layout_is_rendered_as_megatron_arguments(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="rendezvous host"):
        render(resolve(tmp_path, PRETRAIN_70B, gpu="H100-80GB", gpus=8, nodes=4, tp=8, pp=4, sequence_parallel=True,
                       strategy="zero1"))  # fmt: skip
    plan = resolve(tmp_path, PRETRAIN_70B, gpu="H100-80GB", gpus=8, nodes=4, tp=8, pp=4, vpp=2, sequence_parallel=True,
                   strategy="zero1", options=NODE0)  # fmt: skip
    rendered = render(plan)
    assert len(rendered.commands) == 4 and "--node-rank=3" in rendered.commands[3].argv
    a = args_of(rendered.commands[0].argv)
    # Llama 3.1 70B: 80 layers, 8192 wide, 64 heads in 8 KV groups, SwiGLU 28672, RMSNorm, rope, untied head
    assert (a["--num-layers"], a["--hidden-size"], a["--num-attention-heads"], a["--ffn-hidden-size"]) == ("80", "8192", "64", "28672")
    assert a["--num-query-groups"] == "8" and "--group-query-attention" in a and "--swiglu" in a
    assert a["--normalization"] == "RMSNorm" and a["--position-embedding-type"] == "rope"
    assert "--untie-embeddings-and-output-weights" in a and "--disable-bias-linear" in a
    # 32 GPUs = tp 8 × pp 4 × dp 1; 80 layers over 4 × 2 virtual stages = 10 a stage
    assert (a["--tensor-model-parallel-size"], a["--pipeline-model-parallel-size"]) == ("8", "4")
    assert a["--num-layers-per-virtual-pipeline-stage"] == "10" and "--sequence-parallel" in a
    assert (a["--micro-batch-size"], a["--global-batch-size"], a["--seq-length"]) == ("1", "64", "4096")
    assert "--use-distributed-optimizer" in a and "--bf16" in a and a["--recompute-granularity"] == "selective"
    assert a["--train-iters"] == "50" and a["--vocab-size"] == "128256" and "--mock-data" in a
    assert "ds_config.json" not in rendered.files  # ZeRO-1 is Megatron's distributed optimizer here
    assert any("--rotary-base 500000" in n for n in rendered.notes)  # what the render leaves to the user is said


def test_experts_and_dense_layers_are_rendered(tmp_path: Path) -> None:
    moe = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 2, "ffn_hidden": 1024, "vocab": 1000,
           "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, "shared_ffn_hidden": 256, "dense_layers": [0]}}  # fmt: skip
    job = {**PRETRAIN_70B, "model": moe, "activation_checkpointing": "full"}
    plan = resolve(tmp_path, job, gpu="H100-80GB", gpus=8, ep=4, strategy="ddp")
    a = args_of(render(plan).commands[0].argv)
    assert (a["--num-experts"], a["--moe-router-topk"], a["--moe-ffn-hidden-size"]) == ("8", "2", "128")
    assert a["--moe-shared-expert-intermediate-size"] == "256" and a["--moe-layer-freq"] == "[0,1,1,1]"
    assert a["--expert-model-parallel-size"] == "4" and a["--moe-token-dispatcher-type"] == "alltoall"
    assert (a["--recompute-granularity"], a["--recompute-method"], a["--recompute-num-layers"]) == ("full", "uniform", "1")
    assert "--use-distributed-optimizer" not in a
    assert (a["--attention-dropout"], a["--hidden-dropout"]) == ("0", "0")
    dropout = args_of(render(resolve(tmp_path, {**job, "model": {**moe, "dropout": 0.05}}, gpu="H100-80GB", gpus=8,
                                     ep=4, strategy="ddp")).commands[0].argv)  # fmt: skip
    assert (dropout["--attention-dropout"], dropout["--hidden-dropout"]) == ("0.05", "0.05")  # not Megatron's 0.1
    # Megatron fuses the experts' SwiGLU with the routing weight by default: the render says the plan counted more,
    # and says nothing once the job states it
    assert any("knobs.moe_fused_activation: true" in n for n in render(plan).notes)
    (tmp_path / "fused").mkdir()
    fused = resolve(tmp_path / "fused", {**job, "knobs": {"moe_fused_activation": True}}, gpu="H100-80GB", gpus=8, ep=4,
                    strategy="ddp")  # fmt: skip
    assert not any("moe_fused_activation" in n for n in render(fused).notes)


SMALL = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 2, "ffn_hidden": 1024, "vocab": 1000}


@pytest.mark.parametrize("change,message", [
    ({"method": Method.LORA}, "method lora runs with --to torchrun"),
    ({"model": "deepseek-v3"}, "multi-head latent attention"),
    ({"model": "gemma-2-9b"}, "a sliding attention window"),
    ({"model": "olmoe-1b-7b"}, "normalises q and k over the full width"),
    ({"model": ModelArch(**SMALL, nope_layers=1)}, "layers without rotary embeddings (NoPE)"),  # SmolLM3
    ({"model": ModelArch(**SMALL, qk_norm="head", post_norms=True)}, "norms after attention and the MLP"),  # EXAONE 4
    ({"model": ModelArch(**SMALL, norm_fp32_weight=True)}, "multiply their weight in fp32"),  # Gemma
    ({"model": ModelArch(**SMALL, norm="layernorm", block_norms=1)}, "one norm a block read by attention and the MLP"),
    ({"model": ModelArch(**SMALL, norm="layernorm", norm_python=True)}, "fp32 Python LayerNorms (Cohere)"),
    ({"model": ModelArch(**SMALL, qk_norm="each_head")}, "with a weight per head"),  # Cohere
    ({"model": ModelArch(**SMALL, norm_weight=False)}, "norms have no weight"),  # nanochat
    ({"model": ModelArch(**SMALL, embedding_norm=True)}, "a norm of the embedding's output"),  # nanochat
    ({"model": ModelArch(**SMALL, attention_gate="proj")}, "a sigmoid gate on the attention output"),  # AFMoE
    ({"model": ModelArch(**SMALL, moe=MoE(experts=4, top_k=2, expert_ffn_hidden=64, output_norm=True))},
     "a norm of their output"),  # A.X K1
    ({"precision": Precision.BF16_PURE}, "bf16-pure has no equivalent"),
    ({"knobs": StackKnobs()}, "set knobs.selective_recompute: attention-core"),  # plain's selective keeps matmuls
    ({"strategy": Strategy.FSDP}, "pick a ddp or zero1 option"),
    ({"device": Accelerator.CPU}, "--device cpu rehearses with --to torchrun"),
])  # fmt: skip
def test_what_megatron_lm_cannot_run_is_one_line(tmp_path: Path, change, message) -> None:
    plan = resolve(tmp_path, {**PRETRAIN_70B, "model": SMALL}, gpu="H100-80GB", gpus=8, strategy="ddp")
    render(plan)  # the small model itself renders
    if "strategy" in change:
        plan = replace(plan, strategy=change["strategy"])
    elif "device" in change:
        plan = replace(plan, placement=replace(plan.placement, device=change["device"]))
    else:
        plan = replace(plan, job=plan.job.model_copy(update=change))
    with pytest.raises(SpecError) as err:
        render(plan)
    assert message in str(err.value) and err.value.field == "--to" and "\n" not in str(err.value)


def test_the_cli_refuses_a_cpu_rehearsal_in_one_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    path = write_job(tmp_path / "job.yaml", {**PRETRAIN_70B, "model": SMALL})
    code = main(["launch", str(path), "--to", "megatron", "--gpu", "H100-80GB", "--gpus", "8", "--tp", "2",
                 "--strategy", "zero1", "--device", "cpu", "--out", str(tmp_path / "out")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --to: megatron cannot run this plan") and "--device cpu" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_megatron_core_reads_the_rendered_arguments(tmp_path: Path) -> None:
    need_megatron_core()
    plan = resolve(tmp_path, PRETRAIN_70B, gpu="H100-80GB", gpus=8, nodes=4, tp=8, pp=4, vpp=2, sequence_parallel=True,
                   strategy="zero1", options=NODE0)  # fmt: skip
    path = write_job(tmp_path / "job.yaml", PRETRAIN_70B)
    request = LaunchRequest(job_path=path, target=Target.MEGATRON, out=tmp_path / "out2", checkpoint_minutes=None,
                            gpu="H100-80GB", gpus=8, nodes=4, strategy="zero1", options=NODE0,
                            degrees={"tp": 8, "pp": 4, "vpp": 2, "sequence_parallel": True})  # fmt: skip
    _, rendered = prepare_launch(request)
    assert rendered.notes[-1].startswith("checked: Megatron Core's TransformerConfig accepted")
    config = check_with_megatron_core(arguments(plan, check(plan)))
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (8, 4)
    assert config.virtual_pipeline_model_parallel_size == 2 and config.sequence_parallel
    assert config.num_query_groups == 8 and config.gated_linear_unit and config.recompute_granularity == "selective"


def test_megatron_core_s_own_checks_refuse_a_bad_layout_in_one_line() -> None:
    need_megatron_core()
    args = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "30",
            "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "1", "--bf16"]  # fmt: skip
    assert transformer_config_kwargs(args)["num_attention_heads"] == 30
    with pytest.raises(SpecError) as err:
        check_with_megatron_core(args)
    assert "Megatron Core's TransformerConfig rejected" in str(err.value) and "multiple of tensor_model_parallel_size" in str(err.value)


def test_context_parallel_needs_two_chunks_a_rank(tmp_path: Path) -> None:
    job = {**PRETRAIN_70B, "model": SMALL, "seq_len": 4096}
    a = args_of(render(resolve(tmp_path, job, gpu="H100-80GB", gpus=8, cp=4, strategy="ddp")).commands[0].argv)
    assert a["--context-parallel-size"] == "4"
    # Megatron splits each sequence into 2 × cp chunks (a front and a back one a rank); the plan's layout check
    # refuses a length that does not divide, before any target renders
    with pytest.raises(SpecError, match="2 × cp must divide seq_len 4098"):
        resolve(tmp_path, {**job, "seq_len": 4098}, gpu="H100-80GB", gpus=8, cp=2, strategy="ddp")


def test_the_recompute_modules_the_plan_was_estimated_with_are_rendered(tmp_path: Path) -> None:
    """knobs.recompute_modules goes to pretrain_gpt.py as --recompute-modules (Megatron-Core's selective granularity)."""
    moe = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 2, "ffn_hidden": 1024, "vocab": 1000,
           "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128}}  # fmt: skip
    job = {**PRETRAIN_70B, "model": moe, "activation_checkpointing": "selective",
           "knobs": {"recompute_modules": ["moe_act", "layernorm"]}}  # fmt: skip
    argv = render(resolve(tmp_path, job, gpu="H100-80GB", gpus=8, ep=4, strategy="ddp")).commands[0].argv
    i = argv.index("--recompute-modules")
    assert argv[i - 1] == "selective" and list(argv[i + 1:i + 3]) == ["layernorm", "moe_act"]


def test_embedding_and_loss_counted_in_the_pipeline_split_are_rendered(tmp_path: Path) -> None:
    """knobs.pipeline_first/last_stage_less_layers 1 (the split torchtitan and Meta's Llama 3 use) is Megatron-Core's
    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: 80 layers + 2 over 2 stages
    render and Megatron Core accepts them; over 4 stages (82 is not a multiple) or with virtual stages they are refused."""
    job = {**PRETRAIN_70B, "knobs": {**PRETRAIN_70B["knobs"], "pipeline_first_stage_less_layers": 1,
                                     "pipeline_last_stage_less_layers": 1}}  # fmt: skip
    plan = resolve(tmp_path, job, gpu="H100-80GB", gpus=8, nodes=4, tp=8, pp=2, sequence_parallel=True,
                   strategy="zero1", options=NODE0)  # fmt: skip
    a = args_of(render(plan).commands[0].argv)
    assert "--account-for-embedding-in-pipeline-split" in a and "--account-for-loss-in-pipeline-split" in a
    if megatron_core_available():
        config = check_with_megatron_core(arguments(plan, check(plan)))
        assert config.account_for_embedding_in_pipeline_split and config.account_for_loss_in_pipeline_split
    for i, (degrees, message) in enumerate([({"pp": 4}, "82 in all"), ({"pp": 2, "vpp": 2}, "without virtual stages")]):
        (tmp_path / str(i)).mkdir()
        bad = resolve(tmp_path / str(i), job, gpu="H100-80GB", gpus=8, nodes=4, tp=8, sequence_parallel=True,
                      strategy="zero1", options=NODE0, **degrees)  # fmt: skip
        with pytest.raises(SpecError, match=message):
            render(bad)
    (tmp_path / "p").mkdir()
    plain = args_of(render(resolve(tmp_path / "p", PRETRAIN_70B, gpu="H100-80GB", gpus=8, nodes=4, tp=8, pp=2,
                                   sequence_parallel=True, strategy="zero1", options=NODE0)).commands[0].argv)  # fmt: skip
    assert "--account-for-embedding-in-pipeline-split" not in plain


def test_full_checkpointing_on_a_share_of_the_blocks_is_megatrons_block_method(tmp_path: Path) -> None:
    """knobs.checkpoint_fraction 0.5 with 80 layers over pp 4 × vpp 2 (10 a chunk): the first 5 layers of each chunk
    checkpointed (--recompute-method block --recompute-num-layers 5); a share that is no whole number of a chunk's
    layers is refused in one line."""
    job = {**PRETRAIN_70B, "activation_checkpointing": "full", "knobs": {"checkpoint_fraction": 0.5}}
    plan = resolve(tmp_path, job, gpu="H100-80GB", gpus=8, nodes=4, tp=8, pp=4, vpp=2, sequence_parallel=True,
                   strategy="zero1", options=NODE0)  # fmt: skip
    a = args_of(render(plan).commands[0].argv)
    assert (a["--recompute-granularity"], a["--recompute-method"], a["--recompute-num-layers"]) == ("full", "block", "5")
    if megatron_core_available():
        config = check_with_megatron_core(arguments(plan, check(plan)))
        assert (config.recompute_method, config.recompute_num_layers) == ("block", 5)
    (tmp_path / "odd").mkdir()
    odd = resolve(tmp_path / "odd", {**job, "knobs": {"checkpoint_fraction": 0.25}}, gpu="H100-80GB", gpus=8, nodes=4,
                  tp=8, pp=4, vpp=2, sequence_parallel=True, strategy="zero1", options=NODE0)  # fmt: skip
    with pytest.raises(SpecError, match="0.25 of 10 layers a chunk must be a whole number") as err:
        render(odd)
    assert "\n" not in str(err.value)


def test_a_glm45_shaped_moe_renders_its_mtp_layer(tmp_path: Path) -> None:
    """A GLM-4.5-shaped model (grouped-query attention with q/k/v biases, dense-first layers, shared + routed experts,
    one multi-token-prediction layer) renders with --mtp-num-layers, which Megatron Core reads into mtp_num_layers."""
    from trainplan.model import MoE

    glm = ModelArch(**SMALL, attention_bias="qkv", mtp_layers=1,
                    moe=MoE(experts=8, top_k=2, expert_ffn_hidden=128, shared_ffn_hidden=128, dense_layers=(0,)))  # fmt: skip
    plan = resolve(tmp_path, {**PRETRAIN_70B, "model": glm.model_dump(exclude_none=True)}, gpu="H100-80GB", gpus=8, ep=8,
                   strategy="ddp")  # fmt: skip
    a = args_of(render(plan).commands[0].argv)
    assert (a["--mtp-num-layers"], a["--moe-layer-freq"], a["--moe-shared-expert-intermediate-size"]) == ("1", "[0,1,1,1]", "128")
    assert "--add-qkv-bias" in render(plan).commands[0].argv
    if megatron_core_available():
        assert transformer_config_kwargs(arguments(plan, check(plan)))["mtp_num_layers"] == 1


LLAMA31_LIKE = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
                "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "rms_norm_eps": 1e-05,
                "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}  # fmt: skip


def _from_config(tmp_path: Path, config: dict):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return resolve(tmp_path, {**PRETRAIN_70B, "model": str(path)}, gpu="H100-80GB", gpus=8, strategy="ddp")


def test_a_config_json_s_rotary_and_norm_settings_are_rendered(tmp_path: Path) -> None:
    """A model planned from its config.json trains in Megatron with that config's rotary base, Llama 3.x scaling,
    rotated fraction and norm epsilon, not Megatron's defaults (10000, none, all, 1e-5); what the config leaves out is
    said; rotary kinds Megatron's GPT does not build are refused in one line."""
    rendered = render(_from_config(tmp_path, LLAMA31_LIKE))
    a = args_of(rendered.commands[0].argv)
    assert (a["--rotary-base"], a["--rope-scaling-factor"], a["--norm-epsilon"]) == ("500000", "8", "1e-05")
    assert "--use-rope-scaling" in a and "--rotary-percent" not in a
    assert any("rendered from the model's config.json" in n and "leaves out" not in n for n in rendered.notes)
    # GLM-4.5's half-rotated heads; a Qwen2 config without rope_theta: the base is left to Megatron and said so
    glm = {"model_type": "glm4_moe", "hidden_size": 256, "intermediate_size": 1024, "moe_intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
           "n_routed_experts": 8, "num_experts_per_tok": 2, "num_nextn_predict_layers": 0,
           "rope_parameters": {"rope_theta": 1000000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}}  # fmt: skip
    (tmp_path / "stablelm-half").mkdir()  # a rotated fraction and base given inside rope_parameters
    half = {k: v for k, v in glm.items() if k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "vocab_size", "rope_parameters")}  # fmt: skip
    g = args_of(render(_from_config(tmp_path / "stablelm-half", {"model_type": "stablelm", **half, "pad_token_id": 0})).commands[0].argv)
    assert (g["--rotary-base"], g["--rotary-percent"]) == ("1000000", "0.5") and "--norm-epsilon" not in g
    (tmp_path / "glm4_moe").mkdir()  # GLM-4.5's sigmoid router with its score-correction bias is not rendered
    with pytest.raises(SpecError, match="scores experts with a sigmoid"):
        render(_from_config(tmp_path / "glm4_moe", glm))
    # StableLM rotates a quarter of each head when its config leaves the key out (StableLmConfig's default)
    (tmp_path / "stablelm").mkdir()
    stablelm = {k: v for k, v in glm.items() if k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                      "num_attention_heads", "num_key_value_heads", "vocab_size")}
    st = args_of(render(_from_config(tmp_path / "stablelm", {"model_type": "stablelm", **stablelm, "pad_token_id": 0})).commands[0].argv)
    assert st["--rotary-percent"] == "0.25"
    (tmp_path / "qwen").mkdir()
    qwen = {k: v for k, v in LLAMA31_LIKE.items() if k not in ("rope_theta", "rope_scaling")} | {"model_type": "qwen2"}
    note = next(n for n in render(_from_config(tmp_path / "qwen", qwen)).notes if "config.json" in n)
    assert "leaves out the rotary base" in note
    for name, config, message in (
        ("yarn", {**LLAMA31_LIKE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}},
         "rotary scaling ('yarn')"),
        ("llama3-other", {**LLAMA31_LIKE, "rope_scaling": {**LLAMA31_LIKE["rope_scaling"], "high_freq_factor": 2.0}},
         "Llama 3 rotary scaling sets"),
        ("glm", {**{k: v for k, v in LLAMA31_LIKE.items() if k != "rope_scaling"}, "model_type": "glm", "head_dim": 32, "pad_token_id": 0},
         "interleaved pairs"),
    ):  # fmt: skip
        (tmp_path / name).mkdir()
        with pytest.raises(SpecError) as err:
            render(_from_config(tmp_path / name, config))
        assert message in str(err.value) and "\n" not in str(err.value)


def test_megatron_core_reads_a_config_json_render(tmp_path: Path) -> None:
    need_megatron_core()
    plan = _from_config(tmp_path, LLAMA31_LIKE)
    config = check_with_megatron_core(arguments(plan, check(plan)))
    assert config.num_query_groups == 2 and config.layernorm_epsilon == 1e-05


def test_a_two_matrix_mlp_renders_its_own_activation(tmp_path: Path) -> None:
    """Megatron's default MLP activation is GELU: StarCoder2's tanh-approximated GELU renders --openai-gelu, Arcee's and
    Jais 2's ReLU² --squared-relu (each its config class's default when the key is left out), GPT-NeoX's GELU nothing; an
    activation Megatron's GPT does not build (a plain ReLU) is refused."""
    base = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
            "vocab_size": 1000, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    cases = {"starcoder2": ({"num_key_value_heads": 2}, "--openai-gelu"), "arcee": ({"num_key_value_heads": 2}, "--squared-relu"),
             "jais2": ({"num_key_value_heads": 2}, "--squared-relu"),
             "gpt_neox": ({"use_parallel_residual": False, "rotary_pct": 0.25, "rotary_emb_base": 10000}, None)}  # fmt: skip
    for mt, (extra, switch) in cases.items():
        (tmp_path / mt).mkdir()
        a = args_of(render(_from_config(tmp_path / mt, {"model_type": mt, **base, **extra})).commands[0].argv)
        assert "--swiglu" not in a and (switch is None or switch in a), (mt, a)
        if switch is None:
            assert "--openai-gelu" not in a and "--squared-relu" not in a
    neox = args_of(render(_from_config(tmp_path / "gpt_neox", {"model_type": "gpt_neox", **base, **cases["gpt_neox"][0]}))
                   .commands[0].argv)  # Pythia's older keys: a quarter of each head rotated, base 10000
    assert (neox["--rotary-percent"], neox["--rotary-base"]) == ("0.25", "10000")
    (tmp_path / "parallel").mkdir()
    with pytest.raises(SpecError, match="use_parallel_residual"):  # Pythia's default: Megatron's layer is sequential
        render(_from_config(tmp_path / "parallel", {"model_type": "gpt_neox", **base}))
    # Nemotron: ReLU², half-rotated heads and LayerNorms that scale by 1 + weight, each its config class's default
    (tmp_path / "nemotron").mkdir()
    nemo = args_of(render(_from_config(tmp_path / "nemotron", {"model_type": "nemotron", **base, "num_key_value_heads": 2,
                                                                "head_dim": 32})).commands[0].argv)  # fmt: skip
    assert "--squared-relu" in nemo and "--apply-layernorm-1p" in nemo and nemo["--rotary-percent"] == "0.5"
    assert "--disable-bias-linear" in nemo and "--normalization" not in nemo  # biased LayerNorms, unbiased projections
    (tmp_path / "relu").mkdir()
    with pytest.raises(SpecError, match="activation 'relu' is not one"):
        render(_from_config(tmp_path / "relu", {"model_type": "starcoder2", **base, "num_key_value_heads": 2, "hidden_act": "relu"}))
    (tmp_path / "hostile").mkdir()  # a config's string reaches the error quoted, on one line
    with pytest.raises(SpecError) as err:
        render(_from_config(tmp_path / "hostile", {"model_type": "starcoder2", **base, "num_key_value_heads": 2,
                                                    "hidden_act": "relu\n$(touch x)"}))  # fmt: skip
    assert "\n" not in str(err.value) and "'relu\\n$(touch x)'" in str(err.value)


def test_granite_s_scalar_multipliers_are_refused(tmp_path: Path) -> None:
    """Granite and the families built on it (HyperCLOVA X) scale the embedding, the attention scores, the residual
    branches and the logits by constants of their config — Granite's attention scale defaults to 1, not 1/sqrt(d) —,
    which Megatron's GPT does not build: refused in one line rather than rendered as a Llama that trains otherwise."""
    base = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 1000, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    for mt, extra in (("granite", {}), ("hyperclovax", {"use_post_norm": False})):
        (tmp_path / mt).mkdir()
        with pytest.raises(SpecError) as err:
            render(_from_config(tmp_path / mt, {"model_type": mt, **base, **extra}))
        assert "muP scalars" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "llama").mkdir()  # the same shape as a Llama renders
    assert render(_from_config(tmp_path / "llama", {"model_type": "llama", **base})).commands


def test_a_softmax_router_renders_whether_it_renormalises_its_top_k(tmp_path: Path) -> None:
    """Megatron's default router takes a softmax over the k largest logits — a softmax over every expert renormalised
    over the chosen k, as Mixtral's; a Qwen3-MoE without ``norm_topk_prob`` (its config class's default) keeps the
    softmax weights of all experts unrenormalised, which is ``--moe-router-pre-softmax`` (read into
    ``moe_router_pre_softmax`` by Megatron Core where it is installed)."""
    base = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 1000, "pad_token_id": 0, "num_experts_per_tok": 2}  # fmt: skip
    cases = {"mixtral": ({"num_local_experts": 8}, False),
             "qwen3_moe": ({"num_experts": 8, "moe_intermediate_size": 128, "head_dim": 32}, True),
             "qwen3_moe-normalised": ({"model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 128,
                                       "head_dim": 32, "norm_topk_prob": True}, False)}  # fmt: skip
    for name, (extra, pre_softmax) in cases.items():
        (tmp_path / name).mkdir()
        plan = _from_config(tmp_path / name, {"model_type": name, **base, **extra})
        argv = render(plan).commands[0].argv
        assert ("--moe-router-pre-softmax" in argv) is pre_softmax, name
        if megatron_core_available():
            assert transformer_config_kwargs(arguments(plan, check(plan))).get("moe_router_pre_softmax", False) is pre_softmax
