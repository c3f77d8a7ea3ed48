"""A LoRA job's frozen block under PEFT, byte by byte: trainplan's count against what autograd saves.

One block past the first adapted one (a 5-block model less a 4-block one), bf16 base, PEFT adapters in fp32 (its
default since 0.11) and in bf16, on CPU with saved-tensor hooks (``benchmarks/lora_saved_bytes.py`` prints the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import lora_saved_bytes as bench  # noqa: E402

PER = bench.SEQ * bench.BATCH  # tokens; both sides are bytes of one block


@pytest.mark.parametrize("targets", bench.TARGETS, ids="+".join)
def test_peft_fp32_adapters_keep_what_trainplan_counts(targets: list[str]) -> None:
    """Each adapted layer keeps its own fp32 copy of its input and its fp32 lora_A output; the 16-bit input only
    where a bf16 reader still needs it; a frozen SwiGLU keeps 3e·f."""
    assert bench.predicted(targets) == pytest.approx(bench.measured(targets, fp32_adapters=True))


@pytest.mark.parametrize("targets", [t for t in bench.TARGETS if "o_proj" not in t], ids="+".join)
def test_bf16_adapters_share_their_input(targets: list[str]) -> None:
    """With 16-bit adapters (PEFT before 0.11, or autocast_adapter_dtype=False) lora_A reads the shared input.  The
    output projection is left out here: on CPU the SDPA kernel's output and o_proj's contiguous copy share one storage,
    where CUDA's flash kernel returns (B, H, S, D) and the copy is a tensor of its own (trainplan counts the copy)."""
    assert bench.predicted(targets, fp32_adapters=False) == pytest.approx(bench.measured(targets, fp32_adapters=False))


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk-norm", "no-qk-norm"])
@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"]], ids="+".join)
def test_cohere_s_parallel_block_keeps_its_one_norm_output_once(targets: list[str], qk_norm: bool) -> None:
    """Cohere's block (one fp32 Python LayerNorm whose output attention and the MLP both read) under PEFT: what
    trainplan counts per token, plus what the 5-less-4-block difference also holds once a block — each norm's fp32 copy
    of its frozen weight (``self.weight.to(torch.float32)``: h, and a weight per head of q and k with ``use_qk_norm``)."""
    cfg = {**bench.CONFIG, "model_type": "cohere", "use_qk_norm": qk_norm, "bos_token_id": None, "eos_token_id": None}
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    weights = 4 * (h + ((heads + kv) * h // heads if qk_norm else 0))
    assert bench.measured(targets, fp32_adapters=True, config=cfg) == bench.predicted(targets, config=cfg) + weights


def test_the_fp32_copies_are_the_difference() -> None:
    # q alone: the fp32 copy (4·h) and fp32 lora_A output (4·r) replace the shared bf16 input (2·h) and 2·r
    h, r = bench.CONFIG["hidden_size"], bench.RANK
    assert bench.predicted(["q_proj"]) - bench.predicted(["q_proj"], fp32_adapters=False) == PER * (2 * h + 2 * r)


@pytest.mark.parametrize("fp32_adapters", [True, False], ids=["fp32", "bf16"])
@pytest.mark.parametrize("targets", bench.TARGETS, ids="+".join)
def test_lora_dropout_keeps_each_adapters_dropped_copy_and_its_mask(targets: list[str], fp32_adapters: bool) -> None:
    """With lora_dropout each adapter keeps its own dropped copy and the mask.  trainplan counts CUDA's mask (a bool
    from native_dropout); the CPU fallback this runs on keeps a noise tensor of the input's dtype instead, so the
    measurement exceeds the count by exactly (dtype bytes − 1) per adapted input element — and by nothing else."""
    from trainplan.estimate import architecture as arch_mod
    from trainplan.hfconfig import arch_from_hf_config
    from trainplan.spec import LoraSpec

    fan_in = sum(i for i, _ in arch_mod.lora_targets(arch_from_hf_config(bench.CONFIG), LoraSpec(targets=tuple(targets))).values())
    cpu_noise = (4 if fp32_adapters else 2) - 1
    measured = bench.measured(targets, fp32_adapters=fp32_adapters, dropout=0.1)
    assert measured - bench.predicted(targets, fp32_adapters=fp32_adapters, dropout=0.1) == pytest.approx(PER * fan_in * cpu_noise)
    assert bench.predicted(targets, fp32_adapters=fp32_adapters, dropout=0.1) > bench.predicted(targets, fp32_adapters=fp32_adapters)


def test_dropout_outside_peft_is_refused_naming_the_field() -> None:
    from trainplan.catalog import get_catalog
    from trainplan.errors import SpecError
    from trainplan.estimate.transformer import resolve_transformer
    from trainplan.spec import parse_job

    job = {"kind": "transformer", "model": "llama-2-7b", "seq_len": 512, "micro_batch": 1, "steps": 1, "method": "lora",
           "lora": {"rank": 8, "dropout": 0.05}}  # fmt: skip
    resolve_transformer(parse_job({**job, "stack": "hf-trainer"}), get_catalog())  # PEFT: modelled
    resolve_transformer(parse_job({**job, "stack": "torchtune"}), get_catalog())  # torchtune's LoRALinear: modelled
    for stack in ("litgpt",):
        with pytest.raises(SpecError, match="PEFT") as err:
            resolve_transformer(parse_job({**job, "stack": stack}), get_catalog())
        assert err.value.field == "lora.dropout"
    with pytest.raises(SpecError, match="lora.dropout"):
        parse_job({**job, "lora": {"rank": 8, "dropout": 1.0}})


def test_the_adapter_dtype_knob_is_refused_where_it_means_nothing() -> None:
    """knobs.lora_fp32_adapters describes PEFT's adapters: on a full fine-tune, or a stack with its own LoRA layers,
    it would be read and ignored — refused in one line instead."""
    from trainplan.catalog import get_catalog
    from trainplan.errors import SpecError
    from trainplan.estimate.stack import effective_knobs
    from trainplan.spec import parse_job

    base = {"kind": "transformer", "model": "llama-2-7b", "seq_len": 512, "micro_batch": 1, "steps": 1,
            "knobs": {"lora_fp32_adapters": False}}  # fmt: skip
    assert not effective_knobs(parse_job({**base, "method": "lora", "stack": "hf-trainer"}), get_catalog()).lora_fp32_adapters
    for data, words in (({"method": "full"}, "method lora or qlora"), ({"method": "lora", "stack": "torchtune"}, "its own")):
        with pytest.raises(SpecError, match=words) as err:
            effective_knobs(parse_job({**base, **data}), get_catalog())
        assert err.value.field == "knobs.lora_fp32_adapters"


# ----------------------------------------------------------------------------- torchtune's own LoRA layers

GQA_WIDENING = 2 * 2 * (bench.CONFIG["hidden_size"] - bench.CONFIG["hidden_size"] // bench.CONFIG["num_attention_heads"]
                        * bench.CONFIG["num_key_value_heads"])  # e·2·(q − kv): K and V copied out to every head


@pytest.mark.parametrize("targets", bench.TARGETS, ids="+".join)
def test_torchtune_lora_is_bf16_adapters_with_every_heads_k_and_v(targets: list[str]) -> None:
    """torchtune's LoRALinear keeps what PEFT's bf16 adapters keep (lora_a reads the shared input in the model's dtype;
    measured: benchmarks/lora_saved_bytes.py --torchtune), and its attention copies grouped-query K and V out to every
    head before SDPA, which keeps the copies."""
    assert bench.predicted(targets, stack="torchtune") - bench.predicted(targets, fp32_adapters=False) == pytest.approx(PER * GQA_WIDENING)


def test_torchtune_keeps_k_and_v_of_every_head() -> None:
    """Measured: a torchtune block with 2 KV heads keeps what the same block with 8 keeps; trainplan says the same for
    stack torchtune, and not for a stack whose attention reads the grouped K and V."""
    mha = {**bench.CONFIG, "num_key_value_heads": bench.CONFIG["num_attention_heads"]}
    assert bench.predicted(["q_proj"], stack="torchtune") == bench.predicted(["q_proj"], stack="torchtune", config=mha)
    assert bench.predicted(["q_proj"], fp32_adapters=False) < bench.predicted(["q_proj"], fp32_adapters=False, config=mha)


@pytest.fixture(scope="module")
def side() -> dict[str, float]:
    """The torchtune and LitGPT measurements (``benchmarks/lora_saved_bytes.py --measure-json``), run by the side
    environment's interpreter, $TRAINPLAN_LORA_STACKS_PYTHON (.ci/run builds it: torchtune 0.6.1, torchao 0.14.1,
    LitGPT 0.5.13, layered on the main environment); skipped where it is not set."""
    import json
    import os
    import subprocess

    python = os.environ.get("TRAINPLAN_LORA_STACKS_PYTHON")
    if not python:
        pytest.skip("set TRAINPLAN_LORA_STACKS_PYTHON to an environment with torchtune 0.6.1 and LitGPT 0.5.13 "
                    "(benchmarks/lora_saved_bytes.py, its docstring)")  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run([python, str(root / "benchmarks" / "lora_saved_bytes.py"), "--measure-json"], env=env,
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


TT_CASES = [bench.torchtune_targets(a, m) for a, m in bench.TORCHTUNE_TARGETS if "output_proj" not in a]
HEAD_DIM = bench.CONFIG["hidden_size"] // bench.CONFIG["num_attention_heads"]
ROPE_CACHE = bench.SEQ * HEAD_DIM * 2  # each torchtune block keeps its slice of the cos/sin cache: not counted


@pytest.mark.parametrize("targets", TT_CASES, ids="+".join)
def test_torchtune_blocks_keep_what_trainplan_counts(side: dict[str, float], targets: list[str]) -> None:
    """Equal but for the slice of its cos/sin cache each block's rotary embedding keeps (seq_len × head_dim bf16
    values, whatever the batch); output_proj is left out for the CPU layout reason above.  2 and 8 KV heads keep the
    same (K and V copied out to every head)."""
    heads = bench.CONFIG["num_attention_heads"]
    measured = side[bench.measurement_key("torchtune", targets, 0.0, 2)]
    assert measured - bench.predicted(targets, stack="torchtune") == pytest.approx(ROPE_CACHE)
    assert measured == side[bench.measurement_key("torchtune", targets, 0.0, heads)]


@pytest.mark.parametrize("targets", TT_CASES, ids="+".join)
def test_torchtune_lora_dropout_keeps_each_adapters_dropped_copy(side: dict[str, float], targets: list[str]) -> None:
    """torchtune's nn.Dropout before lora_a: each adapter's own dropped copy and its mask, as PEFT's (the CPU fallback's
    mask in the input's dtype: 1 byte more per adapted input element than CUDA's bool, as above)."""
    from trainplan.estimate import architecture as arch_mod
    from trainplan.hfconfig import arch_from_hf_config
    from trainplan.spec import LoraSpec

    fan_in = sum(i for i, _ in arch_mod.lora_targets(arch_from_hf_config(bench.CONFIG), LoraSpec(targets=tuple(targets))).values())
    measured = side[bench.measurement_key("torchtune", targets, 0.1, 2)]
    predicted = bench.predicted(targets, stack="torchtune", dropout=0.1)
    assert measured - predicted == pytest.approx(PER * fan_in * (2 - 1) + ROPE_CACHE)


# ----------------------------------------------------------------------------- LitGPT's own LoRA layers

Q_DIM = bench.CONFIG["hidden_size"]


@pytest.mark.parametrize("targets", bench.TARGETS, ids="+".join)
def test_litgpt_lora_is_torchtunes_plus_the_fused_qkv_adapters_output(targets: list[str]) -> None:
    """LitGPT's adapters, norms and expanded K / V keep what torchtune's do; its fused-QKV adapter (LoRAQKVLinear)
    also keeps lora_B's output, as wide as the adapted q / k / v, for its zero_pad — skipped when all three are
    adapted (measured: benchmarks/lora_saved_bytes.py --litgpt)."""
    kv = Q_DIM // bench.CONFIG["num_attention_heads"] * bench.CONFIG["num_key_value_heads"]
    widths = [{"q_proj": Q_DIM, "k_proj": kv, "v_proj": kv}[t] for t in targets if t in ("q_proj", "k_proj", "v_proj")]
    fused = 2 * sum(widths) if 0 < len(widths) < 3 else 0
    assert bench.predicted(targets, stack="litgpt") - bench.predicted(targets, stack="torchtune") == pytest.approx(PER * fused)


def test_litgpt_without_grouped_queries_keeps_the_fused_qkv_output() -> None:
    """With as many KV heads as heads LitGPT's V is a view into the fused QKV output, which SDPA keeps whole (measured:
    an 8-KV-head block keeps 2e·q a token more than a 2-KV-head one); torchtune copies K and V either way."""
    mha = {**bench.CONFIG, "num_key_value_heads": bench.CONFIG["num_attention_heads"]}
    grown = bench.predicted(["q_proj"], stack="litgpt", config=mha) - bench.predicted(["q_proj"], stack="litgpt")
    assert grown == pytest.approx(PER * 2 * 2 * Q_DIM)
    assert bench.predicted(["q_proj"], stack="torchtune", config=mha) == bench.predicted(["q_proj"], stack="torchtune")


@pytest.mark.parametrize("targets", [t for _, t in bench.LITGPT_TARGETS], ids="+".join)
@pytest.mark.parametrize("kv_heads", [2, 8])
def test_litgpt_blocks_keep_what_trainplan_counts(side: dict[str, float], targets: list[str], kv_heads: int) -> None:
    """Within 0.6%: what is left are per-block constants (the norms' fp32 weight copies, the RoPE cos / sin, the fused
    adapter's int64 index), not counted."""
    config = {**bench.CONFIG, "num_key_value_heads": kv_heads}
    measured = side[bench.measurement_key("litgpt", targets, 0.0, kv_heads)]
    assert bench.predicted(targets, stack="litgpt", config=config) == pytest.approx(measured, rel=6e-3)


def test_mlp_targets_on_a_mixture_of_experts_adapt_every_expert_and_are_refused() -> None:
    """PEFT on transformers 5 turns ``gate_proj`` / ``up_proj`` / ``down_proj`` on a mixture of experts into LoRA on
    the routed experts' stacked weights and keeps a merged copy of them per layer for backward: measured, one more
    Qwen3-MoE block keeps more than all its experts' bf16 weights beyond the attention-only LoRA. trainplan does not
    estimate that and refuses those targets (and all-linear) in one line naming ``lora.targets``."""
    from trainplan.errors import SpecError
    from trainplan.estimate.torchjob import trace_transformer_job
    from trainplan.estimate.transformer import transformer_profile
    from trainplan.spec import parse_job

    cfg = {**bench.CONFIG, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 64, "head_dim": 32, "bos_token_id": None, "eos_token_id": None}  # fmt: skip

    def block(targets: list[str]) -> int:
        return (bench._saved(targets, True, 0.0, layers=5, config=cfg)
                - bench._saved(targets, True, 0.0, layers=4, config=cfg))  # fmt: skip

    experts = 8 * 3 * cfg["hidden_size"] * cfg["moe_intermediate_size"] * 2  # gate, up and down of every expert, bf16
    assert block(["q_proj", "gate_proj", "up_proj", "down_proj"]) - block(["q_proj"]) > experts
    from trainplan.hfconfig import arch_from_hf_config

    model = arch_from_hf_config({**cfg, "num_hidden_layers": 4}).model_dump(exclude_none=True)
    for targets in (["q_proj", "gate_proj", "up_proj"], ["all-linear"]):
        job = parse_job({"kind": "transformer", "model": model, "seq_len": 64, "micro_batch": 2, "steps": 1,
                         "method": "lora", "lora": {"targets": targets}})  # fmt: skip
        for profile in (transformer_profile, trace_transformer_job):  # the formulas and the trace alike
            with pytest.raises(SpecError, match="adapts every routed expert") as err:
                profile(job)
            assert err.value.field == "lora.targets"
    attention = parse_job({"kind": "transformer", "model": model, "seq_len": 64, "micro_batch": 2, "steps": 1,
                           "method": "lora", "lora": {"targets": ["q_proj", "v_proj"]}})  # fmt: skip
    assert transformer_profile(attention).memory.activations > 0



# MiniCPM3 (DeepSeek-V2's latent attention in a dense decoder) of CONFIG's width: query and key-value ranks 96 / 64
MLA = {**bench.CONFIG, "model_type": "minicpm3", "num_key_value_heads": 8, "q_lora_rank": 96, "kv_lora_rank": 64,
       "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24, "pad_token_id": 0}  # fmt: skip
MLA_TARGETS = (["q_a_proj"], ["q_b_proj"], ["kv_a_proj_with_mqa"], ["kv_b_proj"], ["q_a_proj", "kv_a_proj_with_mqa"],
               ["q_b_proj", "kv_b_proj", "o_proj"], ["o_proj"], ["gate_proj", "up_proj", "down_proj"], ["all-linear"])  # fmt: skip


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("fp32_adapters", [True, False], ids=["fp32", "bf16"])
@pytest.mark.parametrize("targets", MLA_TARGETS, ids="+".join)
def test_latent_attention_adapters_keep_what_trainplan_counts(targets: list[str], fp32_adapters: bool, dropout: float) -> None:
    """A frozen latent-attention block keeps neither its normalised latents nor its rotary key slices (its
    up-projections take no weight gradient); q_a_proj's and kv_a_proj_with_mqa's adapters read the block's normalised
    input as q, k and v do, q_b_proj's and kv_b_proj's their own latents (an input copy each, or the shared 16-bit
    latent with 16-bit adapters). Byte for byte, but for the CPU dropout's noise tensor (as above)."""
    from trainplan.estimate import architecture as arch_mod
    from trainplan.hfconfig import arch_from_hf_config
    from trainplan.spec import LoraSpec

    fan_in = sum(i for i, _ in arch_mod.lora_targets(arch_from_hf_config(MLA), LoraSpec(targets=tuple(targets))).values())
    cpu_noise = ((4 if fp32_adapters else 2) - 1) * fan_in if dropout else 0
    measured = bench.measured(targets if targets != ["all-linear"] else "all-linear", fp32_adapters=fp32_adapters,
                              dropout=dropout, config=MLA)  # fmt: skip
    assert measured - bench.predicted(targets, fp32_adapters=fp32_adapters, dropout=dropout, config=MLA) == PER * cpu_noise


def test_a_frozen_latent_attention_keeps_less_than_a_trained_one() -> None:
    """The terms a frozen block drops, at two sets of ranks: e·(q_lora_rank + kv_lora_rank + 2·qk_rope_head_dim) (q/k
    heads as wide as v: this CPU's SDPA takes unequal widths through its math path, which no GPU kernel is)."""
    from trainplan.estimate.transformer import mla_latent_bytes_per_token
    from trainplan.hfconfig import arch_from_hf_config
    from trainplan.spec import Precision

    for ranks in ({}, {"q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 8}):
        arch = arch_from_hf_config({**MLA, **ranks})
        assert arch.mla is not None
        m = arch.mla
        frozen = mla_latent_bytes_per_token(arch, Precision.BF16_PURE, trainable=False, frozen_up=True)
        assert mla_latent_bytes_per_token(arch, Precision.BF16_PURE, trainable=False) - frozen == 2 * (
            (m.q_lora_rank or 0) + m.kv_lora_rank + 2 * m.qk_rope_head_dim)
        assert bench.measured(["o_proj"], fp32_adapters=True, config={**MLA, **ranks}) == bench.predicted(
            ["o_proj"], config={**MLA, **ranks})
