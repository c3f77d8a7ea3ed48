"""knobs.recompute_modules: Megatron-Core's selective granularity, module by module (TransformerConfig.recompute_modules).

Each module's effect is checked as the difference it makes against the same job without it, term by term from the
formulas it names (estimate/transformer.py), and each refusal as one line naming the field."""

from __future__ import annotations

import pytest

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import (
    block_activation_bytes,
    model_split,
    resolve_transformer,
    routed_expert_bytes,
    transformer_profile,
)
from trainplan.spec import SelectiveRecompute, parse_job

CAT = get_catalog()


def job(modules: list[str] | None, *, model: str = "qwen3-30b-a3b", ac: str = "selective", **kw: object):
    data = {"kind": "transformer", "model": model, "seq_len": 4096, "micro_batch": 2, "steps": 1, "precision": "bf16",
            "activation_checkpointing": ac, "stack": "hf-trainer"}  # fmt: skip
    if modules is not None:
        data["knobs"] = {"recompute_modules": modules}
    data.update(kw)
    return parse_job(data)


def acts(j) -> float:  # noqa: ANN001
    m = resolve_transformer(j, CAT)
    return block_activation_bytes(j, m.arch, effective_knobs(j, CAT))


def test_megatrons_default_is_the_attention_core_alone() -> None:
    assert acts(job(["core_attn"])) == acts(job(None))
    assert transformer_profile(job(["core_attn"]), CAT).flops == transformer_profile(job(None), CAT).flops


def test_moe_act_and_layernorm_discard_what_megatron_rebuilds() -> None:
    """moe_act: each routed token's SwiGLU keeps only its gate/up input — the SiLU output and the product (2e·f) go;
    layernorm: an MoE layer's stand-alone pre-MLP norm output (e·h) goes (TE fuses the others into their linears)."""
    arch = resolve_transformer(job(None), CAT).arch
    tokens, e = 4096 * 2, 2
    moe_layers = arch.moe_layers + arch.mtp_layers
    base = acts(job(["core_attn"]))
    assert base - acts(job(["core_attn", "moe_act"])) == moe_layers * tokens * arch.moe.top_k * 2 * e * arch.moe.expert_ffn_hidden
    assert base - acts(job(["core_attn", "layernorm"])) == moe_layers * tokens * e * arch.hidden


def test_gpt_oss_clamped_swiglu_keeps_only_its_input_under_moe_act() -> None:
    j, k = job(None, model="gpt-oss-20b"), job(["core_attn", "moe_act"], model="gpt-oss-20b")
    arch = resolve_transformer(j, CAT).arch
    assert acts(j) - acts(k) == arch.moe_layers * 4096 * 2 * arch.moe.top_k * 5 * 2 * arch.moe.expert_ffn_hidden


def test_a_checkpointed_moe_layer_keeps_its_input_and_rebuilds_one_layer_in_backward() -> None:
    whole, none_kept = job(["core_attn"]), job(["core_attn", "moe"])
    arch = resolve_transformer(whole, CAT).arch
    routed = routed_expert_bytes(whole, arch)  # what one MoE layer's router and routed experts keep
    # every MoE layer's routed experts go, and one layer's come back while its backward runs
    assert acts(whole) - acts(none_kept) == pytest.approx((arch.moe_layers + arch.mtp_layers - 1) * routed)
    # the recompute runs the router and each token's top_k experts forward again
    extra = transformer_profile(none_kept, CAT).flops.recompute - transformer_profile(whole, CAT).flops.recompute
    expert = 3 * arch.hidden * arch.moe.expert_ffn_hidden
    assert extra == pytest.approx(2 * 4096 * 2 * arch.moe_layers * (arch.hidden * arch.moe.experts + arch.moe.top_k * expert))


def test_a_checkpointed_dense_mlp_keeps_its_input() -> None:
    """mlp: Llama's SwiGLU intermediates (4e·f a token) go from every layer but the one rebuilt in backward, and the
    MLP's three matmuls run forward again."""
    full, ckpt = job(["core_attn"], model="llama-3-8b"), job(["core_attn", "mlp"], model="llama-3-8b")
    arch = resolve_transformer(full, CAT).arch
    per_layer = 4096 * 2 * 4 * 2 * arch.ffn_hidden
    assert acts(full) - acts(ckpt) == pytest.approx((arch.blocks - 1) * per_layer)
    extra = transformer_profile(ckpt, CAT).flops.recompute - transformer_profile(full, CAT).flops.recompute
    assert extra == pytest.approx(2 * 4096 * 2 * arch.blocks * 3 * arch.hidden * arch.ffn_hidden)
    m = resolve_transformer(ckpt, CAT)
    split = model_split(ckpt, m, effective_knobs(ckpt, CAT))
    assert split is not None and split.recompute_working == pytest.approx(per_layer)


def test_without_core_attn_the_core_is_kept() -> None:
    eager = {"flash_attention": False}
    kept, recomputed = job([], model="llama-3-8b", **eager), job(["core_attn"], model="llama-3-8b", **eager)
    arch = resolve_transformer(kept, CAT).arch
    # eager attention under autocast: the fp32 softmax and its 16-bit copy, (4 + e) bytes per score
    assert acts(kept) - acts(recomputed) == pytest.approx(arch.blocks * 4096 * 2 * (4 + 2) * arch.heads * 4096)
    assert transformer_profile(kept, CAT).flops.recompute == 0.0


def test_a_pytorch_policy_stack_gives_way_with_a_note() -> None:
    plain = job(["core_attn", "moe_act"], stack="plain")
    k = effective_knobs(plain, CAT)
    assert k.selective_recompute is SelectiveRecompute.ATTENTION_CORE
    assert any("recompute_modules" in n for n in k.notes)


@pytest.mark.parametrize(("data", "words"), [
    ({"activation_checkpointing": "full"}, "needs activation_checkpointing: selective"),
    ({"knobs": {"recompute_modules": ["moe_act"], "selective_recompute": "matmul-outputs"}}, "cannot go with"),
    ({"model": "llama-3-8b"}, "this model is dense"),
    ({"knobs": {"recompute_modules": ["shared_experts"]}}, "no shared experts"),
    ({"method": "lora", "lora": {"rank": 8}}, "experts that train"),
])  # fmt: skip
def test_what_cannot_hold_is_refused_naming_the_field(data: dict, words: str) -> None:
    j = {"kind": "transformer", "model": "qwen3-30b-a3b", "seq_len": 4096, "micro_batch": 1, "steps": 1,
         "activation_checkpointing": "selective", "knobs": {"recompute_modules": ["moe_act"]}, **data}  # fmt: skip
    with pytest.raises(SpecError, match=words) as err:
        resolve_transformer(parse_job(j), CAT)
    assert err.value.field == "knobs.recompute_modules"


def test_a_module_trainplan_does_not_model_is_refused_at_parse() -> None:
    with pytest.raises(SpecError, match="recompute_modules"):
        job(["core_attn", "mla_up_proj"])
    with pytest.raises(SpecError, match="knobs.recompute_modules"):
        effective_knobs(parse_job({"kind": "torch", "model": "tests.torch_models:mlp", "inputs": [{"shape": [8]}],
                                   "micro_batch": 1, "steps": 1, "knobs": {"recompute_modules": ["core_attn"]}}), CAT)
