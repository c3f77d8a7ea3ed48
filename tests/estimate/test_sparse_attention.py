"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer's parameters, its forward FLOPs, the s x s
scores a head it holds for a moment, the sparse mask SDPA keeps, and what is refused because it was not measured."""

from __future__ import annotations

import pytest

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.compute import KernelSplit
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.steptime import step_time
from trainplan.estimate.transformer import (estimate_transformer, indexer_forward_flops, indexer_transient_bytes,
                                            sparse_mask_bytes_per_token)  # fmt: skip
from trainplan.hfconfig import arch_from_hf_config
from trainplan.spec import Optimizer, Precision, parse_job
from trainplan.strategies import Strategy

# a tiny DeepSeek-V3.2 of dense layers only (transformers' trace runs grouped-GEMM experts in bf16-pure only)
TINY = {"model_type": "deepseek_v32", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 101, "pad_token_id": 0, "bos_token_id": None,
        "eos_token_id": None, "first_k_dense_replace": 2, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 12, "index_head_dim": 8, "index_topk": 16, "index_n_heads": 4}  # fmt: skip
# the same with routed experts, as trainplan reads it (at least one sparse layer)
MOE = {**TINY, "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
       "moe_intermediate_size": 16, "n_group": 1, "topk_group": 1}  # fmt: skip


def _job(cfg: dict, **extra: object):
    arch = arch_from_hf_config(cfg)
    return parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": 512,
                      "micro_batch": 1, "steps": 1, **extra}), arch  # fmt: skip


def _trace(cfg: dict, precision: str, seq: int = 512):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step

    return trace_training_step(lambda: build_hf_causal_lm(cfg), lambda b: (torch.randint(0, 101, (b, seq)),),
                               micro_batch=1, precision=precision)  # fmt: skip


@pytest.mark.parametrize("precision", ["bf16", "bf16-pure"])
def test_the_indexer_scores_are_the_forward_peak_the_trace_sees(precision: str) -> None:
    """Traced on the fake CUDA device (autocast as in a bf16 run), doubling the indexer's heads raises the forward peak
    by what :func:`indexer_transient_bytes` adds — two [s, heads, s] score tensors alive at once, 2-byte under autocast
    and fp32 without it — within 4% (the query's own small copies are not counted); its FLOPs beyond a DeepSeek-V3 of
    one shape are :func:`indexer_forward_flops`, exactly."""
    four, eight = (_trace({**TINY, "index_n_heads": h}, precision) for h in (4, 8))
    assert four.peak_phase == eight.peak_phase == "forward"
    job4, arch4 = _job(MOE, precision=precision)  # TINY's 4 indexer heads
    job8, arch8 = _job({**MOE, "index_n_heads": 8}, precision=precision)
    predicted = indexer_transient_bytes(job8, arch8) - indexer_transient_bytes(job4, arch4)
    assert predicted == 2 * (2 if precision == "bf16" else 4) * 4 * 512 * 512
    assert abs((eight.at_peak.activations - four.at_peak.activations) / predicted - 1) < 0.04
    v3 = {k: v for k, v in TINY.items() if not k.startswith("index_")} | {"model_type": "deepseek_v3", "num_nextn_predict_layers": 0}
    flops, fp32 = indexer_forward_flops(job4, arch4)
    assert four.flops_forward - _trace(v3, precision).flops_forward == flops
    assert fp32 == (0.0 if precision == "bf16" else 2.0 * 512 * 512 * 4 * (8 + 1) * 2)  # the scores, both layers


def test_the_sparse_mask_is_kept_through_sdpa_only() -> None:
    """SDPA keeps the additive mask the indexer's choice becomes (e·s bytes a token and layer; the saved-tensor
    measurement is ``tests/estimate/test_norm_saves.py``'s deepseek_v32 / glm_moe_dsa rows); eager attention adds it to
    its scores and keeps none of it."""
    job, arch = _job(MOE)
    assert sparse_mask_bytes_per_token(job, arch) == 2 * 512
    eager, _ = _job(MOE, flash_attention="false")
    assert sparse_mask_bytes_per_token(eager, arch) == 0.0
    fp32, _ = _job(MOE, precision="fp32")
    assert sparse_mask_bytes_per_token(fp32, arch) == 4 * 512


def test_the_scores_in_fp32_are_priced_on_the_fp32_units() -> None:
    """Under bf16-pure the indexer's fp32 matmuls run on the plain fp32 units: the step takes exactly their FLOPs at the
    fp32 peak instead of the bf16 one (same GEMM efficiency)."""
    cat = get_catalog()
    hw = hardware_for_gpu(cat.accelerators["H100-80GB"], cat, gpus=1)
    common = dict(hw=hw, strategy=Strategy.SINGLE, catalog=cat, precision=Precision.BF16_PURE, optimizer=Optimizer.ADAMW,
                  micro_steps=1, flops_forward=1e15, flops_backward=2e15, flops_model=3e15, trainable_params=1e9,
                  total_params=1e9, efficiency=0.5)  # fmt: skip
    plain = step_time(**common, split=KernelSplit(0.0, 0.0, 0.0, 0.0))
    slow = step_time(**common, split=KernelSplit(0.0, 0.0, 0.0, 0.0, fp32_forward=1e14, fp32_backward=5e13))
    acc = hw.accelerator
    assert acc is not None and acc.peak_fp32_tflops and acc.peak_bf16_tflops
    from trainplan.estimate.steptime import gemm_efficiency

    e = gemm_efficiency(cat, acc.id)
    extra = 1.5e14 / e * (1 / (acc.peak_fp32_tflops * 1e12) - 1 / (acc.peak_bf16_tflops * 1e12))
    assert slow.breakdown["compute_s"] - plain.breakdown["compute_s"] == pytest.approx(extra, rel=1e-9)


def test_deepseek_v32_costs_its_indexer_beside_deepseek_v3() -> None:
    """The same shape with and without DeepSeek Sparse Attention on 8 H200s: the indexer's parameters, the attention
    without a causal skip and the indexer's forward make the step slower; the scores make the forward peak higher by at
    least the transient."""
    cat = get_catalog()
    hw = hardware_for_gpu(cat.accelerators["H200"], cat, gpus=8)
    big = {"model_type": "deepseek_v32", "num_hidden_layers": 8, "n_routed_experts": 16, "vocab_size": 32000}
    v32 = {**big, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 4096,
           "moe_intermediate_size": 512, "first_k_dense_replace": 1}  # fmt: skip
    v3 = {k: v for k, v in v32.items() if k != "model_type"} | {"model_type": "deepseek_v3", "q_lora_rank": 1536,
                                                               "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                                               "qk_rope_head_dim": 64, "v_head_dim": 128,
                                                               "num_experts_per_tok": 8, "n_shared_experts": 1,
                                                               "num_nextn_predict_layers": 0}  # fmt: skip
    spec = {"seq_len": 4096, "micro_batch": 1, "global_batch": 8, "activation_checkpointing": "full", "steps": 1}
    jobs = {mt: _job(cfg, **spec) for mt, cfg in (("v3", v3), ("v32", v32))}
    est = {mt: estimate_transformer(job, hw, Strategy.FSDP, cat) for mt, (job, _) in jobs.items()}
    job, arch = jobs["v32"]
    assert est["v32"].step_time_s > est["v3"].step_time_s
    assert est["v32"].memory.peak - est["v3"].memory.peak >= indexer_transient_bytes(job, arch)


@pytest.mark.parametrize(("extra", "field"), [
    ({"flash_attention": "true"}, "flash_attention"),
    ({"knobs": {"compile": True}}, "knobs.compile"),
    ({"activation_checkpointing": "selective"}, "activation_checkpointing"),
    ({"stack": "torchtune"}, "stack"),
])  # fmt: skip
def test_what_was_not_measured_is_refused_in_one_line(extra: dict, field: str) -> None:
    cat = get_catalog()
    job, _ = _job(MOE, **extra)
    with pytest.raises(SpecError) as err:
        estimate_transformer(job, hardware_for_gpu(cat.accelerators["H100-80GB"], cat, gpus=1), Strategy.SINGLE, cat)
    assert err.value.field == field and "\n" not in str(err.value)
