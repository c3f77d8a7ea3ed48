"""What ``activation_checkpointing: selective`` keeps, per stack (knobs.selective_recompute): Korthikanti's attention
core recomputed (Megatron-LM), PyTorch selective checkpointing keeping every matmul and attention output (trainplan
run, the trace), or torchtitan's op mode keeping every other matmul's (memory.selective_saved_bytes_per_token)."""

from __future__ import annotations

import pytest

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.memory import selective_saved_bytes_per_token
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import (
    _block_matmuls,
    resolve_transformer,
    selective_recomputed_params,
    transformer_profile,
)
from trainplan.spec import SelectiveRecompute, parse_job

CAT = get_catalog()
H, Q, KV, F, HEADS = 4096, 4096, 1024, 14336, 32  # Llama 3 8B


def job(checkpointing: str = "selective", **kw: object):
    data = {"kind": "transformer", "model": "llama-3-8b", "seq_len": 8192, "micro_batch": 1, "steps": 1,
            "precision": "bf16", "activation_checkpointing": checkpointing}  # fmt: skip
    data.update(kw)
    return parse_job(data)


def test_the_policies_keep_what_their_code_marks_must_save() -> None:
    llama = [(Q, False), (KV, False), (KV, False), (H, True), (F, False), (F, False), (H, True)]  # q k v o gate up down
    common = dict(linears=llama, hidden=H, heads=HEADS, q_dim=Q, seq_len=8192, e=2.0, flash_attention=True)
    everything = selective_saved_bytes_per_token(**common, selective=SelectiveRecompute.MATMUL_OUTPUTS)
    assert everything == (2.0 * (H + H + H), 2.0 * (Q + KV + KV + F + F) + 2.0 * Q + 4.0 * HEADS)
    # torchtitan: the 1st, 3rd, 5th and 7th matmul — q, v, gate, down — and the attention kernel's output
    alternate = selective_saved_bytes_per_token(**common, selective=SelectiveRecompute.ALTERNATE_MATMULS)
    assert alternate == (2.0 * (H + H), 2.0 * (Q + KV + F) + 2.0 * Q + 4.0 * HEADS)
    eager = selective_saved_bytes_per_token(**{**common, "flash_attention": False}, selective=SelectiveRecompute.MATMUL_OUTPUTS)
    assert eager[1] - everything[1] == pytest.approx(2.0 * HEADS * 8192 - 4.0 * HEADS)  # the scores matmul's output


def test_lora_adapters_are_matmuls_in_the_order_peft_runs_them() -> None:
    lora = job(method="lora", lora={"rank": 16, "targets": ["q_proj", "v_proj"]})
    arch = resolve_transformer(lora, CAT).arch
    names = [name for name, *_ in _block_matmuls(lora, arch, arch.ffn_hidden)]
    assert names == ["q_proj", "q_proj.lora_A", "q_proj.lora_B", "k_proj", "v_proj", "v_proj.lora_A", "v_proj.lora_B",
                     "o_proj", "gate_proj", "up_proj", "down_proj"]  # fmt: skip
    full = transformer_profile(job(), CAT).memory.activations
    adapted = transformer_profile(lora, CAT).memory.activations
    assert adapted > full - 2 * 2**30  # adapters' outputs are kept too (frozen norms keep a little less)


def test_each_stack_says_which_selective_it_runs() -> None:
    assert effective_knobs(job(), CAT).selective_recompute is SelectiveRecompute.MATMUL_OUTPUTS  # plain = trainplan run
    assert effective_knobs(job(stack="torchtitan"), CAT).selective_recompute is SelectiveRecompute.ALTERNATE_MATMULS
    assert effective_knobs(job(stack="hf-trainer"), CAT).selective_recompute is SelectiveRecompute.ATTENTION_CORE
    knob = effective_knobs(job(stack="torchtitan", knobs={"selective_recompute": "attention-core"}), CAT)
    assert knob.selective_recompute is SelectiveRecompute.ATTENTION_CORE and knob.notes
    with pytest.raises(SpecError) as err:
        job(knobs={"selective_recompute": "some"})
    assert "selective_recompute" in f"{err.value.field} {err.value}"
    # a traced torch model keeps what the trace's own policy keeps: the knob is refused there, not ignored
    torch_job = parse_job({"kind": "torch", "model": "resnet-50", "micro_batch": 1, "steps": 1,
                           "knobs": {"selective_recompute": "attention-core"}})  # fmt: skip
    with pytest.raises(SpecError) as err:
        effective_knobs(torch_job, CAT)
    assert err.value.field == "knobs.selective_recompute"


def test_activations_order_none_attention_core_matmuls_alternate_full() -> None:
    acts = {name: transformer_profile(job(**kw), CAT).memory.activations for name, kw in {
        "none": {"activation_checkpointing": "none"},
        "attention-core": {"knobs": {"selective_recompute": "attention-core"}},
        "matmul-outputs": {},
        "alternate-matmuls": {"knobs": {"selective_recompute": "alternate-matmuls"}},
        "full": {"activation_checkpointing": "full"}}.items()}  # fmt: skip
    # with a fused attention kernel the attention core is not kept anyway: Korthikanti's selective saves nothing
    assert acts["attention-core"] == acts["none"]
    assert acts["none"] > acts["matmul-outputs"] > acts["alternate-matmuls"] > acts["full"]


def test_what_each_policy_recomputes() -> None:
    sel = transformer_profile(job(), CAT).flops
    assert sel.recompute == 0.0  # every matmul and the attention kernel kept: only memory-bound ops run again
    alt_job = job(knobs={"selective_recompute": "alternate-matmuls"})
    arch = resolve_transformer(alt_job, CAT).arch
    params = selective_recomputed_params(alt_job, arch, effective_knobs(alt_job, CAT))
    assert params == pytest.approx(32 * (H * KV + Q * H + H * F))  # k, o and up in each of 32 blocks
    assert transformer_profile(alt_job, CAT).flops.recompute == pytest.approx(2 * 8192 * params)
    core = transformer_profile(job(knobs={"selective_recompute": "attention-core"}), CAT).flops
    assert core.recompute > 0 and core.split is not None and sel.split is not None
    assert sel.split.bytes_backward > core.split.bytes_backward  # the PyTorch policies rerun the memory-bound ops


def test_grouped_gemm_experts_are_recomputed_under_a_pytorch_policy() -> None:
    """Neither PyTorch policy saves torch._grouped_mm (trainplan's SELECTIVE_SAVE_OPS, torchtitan's _op_sac_save_list):
    an MoE block keeps no routed-expert activations, one block's come back while its backward runs, and the experts'
    forward is paid again; matmul-outputs keeps the router's logits (an mm), torchtitan force-recomputes them."""
    from trainplan.estimate.stack import Knobs
    from trainplan.estimate.transformer import block_activation_bytes, kept_routed_expert_bytes, routed_expert_bytes
    from trainplan.spec import Stack

    moe = job(model="qwen3-30b-a3b", micro_batch=2)
    arch = resolve_transformer(moe, CAT).arch
    tokens = 8192 * 2
    for policy, router in ((SelectiveRecompute.MATMUL_OUTPUTS, 2.0 * tokens * arch.moe.experts),
                           (SelectiveRecompute.ALTERNATE_MATMULS, 0.0)):
        k = Knobs(stack=Stack.PLAIN, selective_recompute=policy)
        assert kept_routed_expert_bytes(moe, arch, k) == router
        kept = block_activation_bytes(moe, arch, k)
        everything = Knobs(stack=Stack.PLAIN, selective_recompute=SelectiveRecompute.ATTENTION_CORE)
        # one layer's routed experts are in the transient, not 48 layers' worth
        assert kept < block_activation_bytes(moe, arch, everything)
        assert kept > routed_expert_bytes(moe, arch)
        params = selective_recomputed_params(moe, arch, k)
        per_expert = 3 * arch.hidden * arch.moe.expert_ffn_hidden
        assert params >= arch.moe.top_k * per_expert * arch.moe_layers
    none = job("none", model="qwen3-30b-a3b", micro_batch=2)
    assert kept_routed_expert_bytes(none, arch, Knobs(stack=Stack.PLAIN)) == routed_expert_bytes(none, arch)


def test_torchtitans_moe_keeps_an_fp32_copy_of_the_routed_outputs() -> None:
    """knobs.moe_fp32_combine (the torchtitan stack's default): torchtitan combines the experts' outputs with a bmm
    over their fp32 copy, kept for backward (4·h a routed token) where transformers keeps the 16-bit output (e·h)."""
    from trainplan.estimate.transformer import routed_expert_bytes

    moe = job("none", model="qwen3-30b-a3b")
    arch = resolve_transformer(moe, CAT).arch
    titan = job("none", model="qwen3-30b-a3b", stack="torchtitan")
    assert effective_knobs(titan, CAT).moe_fp32_combine and not effective_knobs(moe, CAT).moe_fp32_combine
    delta = routed_expert_bytes(moe, arch, fp32_combine=True) - routed_expert_bytes(moe, arch)
    assert delta == 8192 * arch.moe.top_k * (4 - 2) * arch.hidden
    with pytest.raises(SpecError, match="knobs.moe_fp32_combine"):
        effective_knobs(parse_job({"kind": "torch", "model": "tests.torch_models:mlp", "inputs": [{"shape": [8]}],
                                   "micro_batch": 1, "steps": 1, "knobs": {"moe_fp32_combine": True}}), CAT)
    with pytest.raises(SpecError, match="dense") as err:  # a dense model has nothing to combine: refused, not ignored
        resolve_transformer(parse_job({"kind": "transformer", "model": "llama-7b", "seq_len": 512, "micro_batch": 1,
                                       "steps": 1, "knobs": {"moe_fp32_combine": True}}), CAT)
    assert err.value.field == "knobs.moe_fp32_combine"
    dense_titan = job("none", model="llama-7b", stack="torchtitan")  # the stack's default is not a statement
    assert resolve_transformer(dense_titan, CAT).arch.moe is None
