"""Tensor / sequence / pipeline / context / expert parallelism: the layout value object, the memory per rank against
Korthikanti et al. 2022 (Table 2) and Megatron-LM's ``theoretical_memory_usage.py``, step-time terms, bad input.

The Megatron formulas below are restated from that file (NVIDIA/Megatron-LM, megatron/training/
theoretical_memory_usage.py, read 2026-12-04): ``compute_weight_and_optimizer_memory`` (parameters on the most
loaded shard), ``compute_activation_memory`` (sequence parallel + selective recomputation) and
``compute_activation_memory_without_sp`` (its ×1.05 allowance removed).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.cli.main import main
from trainplan.errors import SpecError
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.parallel import (
    block_activation_bytes,
    bubble_fraction,
    chunk_layers,
    in_flight_microbatches,
    layout_error,
    rank_layers,
    stage_layers,
    stage_loads,
)
from trainplan.estimate.transformer import transformer_profile
from trainplan.spec import parse_job
from trainplan.strategies import Layout, Schedule, Strategy

CAT = get_catalog()

# GPT-3 style blocks as Korthikanti et al. and Megatron count them: LayerNorm, GELU MLP 4h, dropout, untied head
GPT = {"arch": "decoder", "layers": 96, "hidden": 12288, "heads": 96, "ffn_hidden": 49152, "mlp": "gelu",
       "vocab": 51200, "tied_embeddings": False, "position": "learned", "norm": "layernorm", "bias": True,
       "max_seq_len": 2048, "dropout": 0.1, "name": "GPT 175B"}  # fmt: skip


def gpt_job(**kw: object) -> object:
    data = {"kind": "transformer", "model": dict(GPT), "method": "full", "seq_len": 2048, "micro_batch": 1,
            "global_batch": 64, "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": "selective",
            "flash_attention": False, "tokens": 1e9,
            "knobs": {"selective_recompute": "attention-core"}}  # Megatron's selective, as the references count it  # fmt: skip
    data.update(kw)
    return parse_job(data)


def gpt_split(**kw: object):
    job = gpt_job(**kw)
    split = transformer_profile(job, CAT).split
    assert split is not None
    return job, split


# ----------------------------------------------------------------------------- the layout value object


def test_layout_degrees_multiply_to_the_world_size() -> None:
    lay = Layout(gpus_per_node=8, nodes=64, tp=8, pp=8, cp=1, sequence_parallel=True)
    assert lay.data_parallel == 8 and lay.world_size == 512 and lay.model_parallel
    assert lay.schedule is Schedule.ONE_F_ONE_B
    assert replace(lay, vpp=2).schedule is Schedule.INTERLEAVED
    assert Layout(8, 2).model_parallel is False and Layout(8, 2).schedule is Schedule.NONE
    d = lay.to_dict(Strategy.FSDP)
    assert d == {"dp_replicate": 1, "dp_shard": 8, "tp": 8, "pp": 8, "vpp": 1, "cp": 1, "ep": 1,
                 "sequence_parallel": True, "schedule": "1f1b"}  # fmt: skip
    assert lay.to_dict(Strategy.DDP)["dp_replicate"] == 8


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"tp": 3}, "--tp/--pp/--cp"),
        ({"tp": 8, "pp": 3}, "--tp/--pp/--cp"),
        ({"vpp": 2}, "--vpp"),
        ({"tp": 2, "ep": 3}, "--ep"),
        ({"sequence_parallel": True}, "--sp"),
        ({"tp": 0}, "--tp"),
    ],
)
def test_layout_refuses_degrees_that_do_not_go_together(kw: dict, field: str) -> None:
    with pytest.raises(SpecError) as exc:
        Layout(gpus_per_node=8, nodes=2, **kw)
    assert exc.value.field == field


def test_layout_errors_against_the_model() -> None:
    _, split = gpt_split()
    assert layout_error(split, Layout(8, 1, tp=8), Strategy.ZERO1) is None
    field, msg = layout_error(split, Layout(8, 8, tp=8, pp=8, vpp=16), Strategy.ZERO1)  # type: ignore[misc]
    assert field == "--vpp" and "96 layers" in msg
    field, msg = layout_error(split, Layout(8, 16, pp=128), Strategy.ZERO1)  # type: ignore[misc]
    assert field == "--pp" and "exceeds" in msg
    field, msg = layout_error(split, Layout(8, 1, ep=2), Strategy.ZERO1)  # type: ignore[misc]
    assert field == "--ep" and "dense" in msg
    field, msg = layout_error(split, Layout(8, 1, pp=2), Strategy.ZERO2)  # type: ignore[misc]
    assert field == "--strategy" and "ZeRO-1" in msg
    assert layout_error(split, Layout(8, 1, pp=2), Strategy.FSDP) is None
    _, long = gpt_split(seq_len=2048)
    assert layout_error(long, Layout(8, 1, cp=8), Strategy.FSDP) is None
    field, _ = layout_error(long, Layout(8, 1, cp=8), Strategy.ZERO2_OFFLOAD)  # type: ignore[misc]
    assert field == "--strategy"


# ----------------------------------------------------------------------------- memory: Korthikanti Table 2


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_block_activations_follow_korthikanti_table_2(tp: int) -> None:
    """Per block: sbh(10 + 24/t + 5as/(ht)) with TP, sbh/t·(34 + 5as/h) with TP + SP, the 5as/h term gone under
    selective recomputation (fp16/bf16 activations, dropout, no fused attention)."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    for ckpt, sp, expected in (
        ("none", False, sbh * (10 + 24 / tp + 5 * a * s / (h * tp))),
        ("none", True, sbh / tp * (34 + 5 * a * s / h)),
        ("selective", False, sbh * (10 + 24 / tp)),
        ("selective", True, sbh * 34 / tp),
    ):
        if sp and tp == 1:
            continue
        # bf16-pure under llm-foundry's torch attention (no autocast, no explicit up-cast): the softmax keeps 16 bits,
        # as Megatron's fused softmax does (transformers' and LitGPT's eager attention up-cast it: _fp32_scores)
        _, split = gpt_split(activation_checkpointing=ckpt, precision="bf16-pure", stack="llm-foundry")
        got = block_activation_bytes(split, Layout(8, 1, tp=tp, sequence_parallel=sp), moe=False)
        # trainplan also counts each LayerNorm's fp32 mean and rstd (8 bytes per token, twice per block)
        assert got == pytest.approx(expected, rel=2e-4), (ckpt, sp)


# ----------------------------------------------------------------------------- memory: Megatron's formula


def megatron_most_loaded_params(layers: int, h: int, f: int, v: int, tp: int, pp: int, untied: bool) -> float:
    """num_parameters_on_most_loaded_model_shard for a GPT block (LayerNorm, GELU, biases as Megatron omits them)."""
    layer = 2 * h * (f + 2) + 2 * h * h * 2  # MLP + two LayerNorms; attention 4h² (MHA)
    block = layer * layers + 2 * h  # + the final LayerNorm
    embedding = h * v
    params = (block / pp + embedding) / tp
    if untied and pp == 1:
        params += embedding / tp
    return params


def megatron_activations_sp_selective(s: int, b: int, h: int, f: int, layers: int, tp: int, pp: int, vpp: int | None,
                                      m: int | None) -> float:  # fmt: skip
    acts = s * b * h * (18 + 4 * f / h) * layers
    acts += 8 * s * b * pp + s * b * h * pp  # input ids and the embedding dropout mask, pp micro-batches in flight
    if vpp is not None:
        acts *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1 and m is not None:
        acts *= min(1, m / pp)
    return acts / tp


def megatron_activations_without_sp(s: int, b: int, h: int, layers: int, tp: int, pp: int, m: int) -> float:
    acts = s * b * h * (10 + 24 / tp) * layers + 8 * s * b * pp + s * b * h * pp
    if pp > 1:
        acts *= min(1, m / pp)
    return acts  # Megatron multiplies by 1.05 for temporaries; trainplan counts those itself


LAYOUTS = [  # (tp, pp, vpp, nodes, global batch): 12 layouts of GPT-3 175B on 8-GPU nodes
    (8, 2, None, 2, 64), (8, 4, None, 4, 64), (8, 8, None, 8, 64), (8, 8, None, 8, 4), (8, 8, 2, 8, 64),
    (8, 8, 4, 16, 128), (4, 8, None, 4, 64), (4, 16, 2, 8, 64), (2, 16, None, 4, 32), (8, 16, 3, 16, 64),
    (8, 32, None, 32, 64), (4, 4, None, 2, 16),
]  # fmt: skip


@pytest.mark.parametrize(("tp", "pp", "vpp", "nodes", "gb"), LAYOUTS)
def test_memory_per_rank_equals_megatron_theoretical_memory_usage(tp: int, pp: int, vpp: int | None, nodes: int, gb: int) -> None:
    s, h, f, v, layers = 2048, 12288, 49152, 51200, 96
    job, split = gpt_split(global_batch=gb)
    layout = Layout(8, nodes, tp=tp, pp=pp, vpp=vpp or 1, sequence_parallel=True)
    m = gb // (1 * layout.data_parallel)
    first = stage_loads(split, layout, m)[0]
    # parameters on the most loaded rank: exactly Megatron's count (its attention has no biases; add trainplan's)
    biases = (4 * h + f + h) * layers / pp / tp  # QKV, out-proj, fc1, fc2 biases Megatron's formula leaves out
    positions = s * h / tp  # the learned position embedding, which Megatron's embedding_size leaves out too
    assert first.dense_params - biases - positions == pytest.approx(megatron_most_loaded_params(layers, h, f, v, tp, pp, True), rel=2e-4)
    # activations of the first stage: Megatron's compute_activation_memory (SP + selective)
    expected = megatron_activations_sp_selective(s, 1, h, f, layers, tp, pp, vpp, m)
    assert first.activations == pytest.approx(expected, rel=2e-4)


@pytest.mark.parametrize(("tp", "pp", "nodes", "gb"), [(8, 4, 4, 64), (4, 8, 4, 16), (2, 2, 1, 8), (8, 8, 8, 4)])
def test_activations_without_sequence_parallel_equal_megatron(tp: int, pp: int, nodes: int, gb: int) -> None:
    """compute_activation_memory_without_sp: 10 + 24/t per block (fused attention: no s² tensors)."""
    job, split = gpt_split(global_batch=gb, activation_checkpointing="none", flash_attention=True)
    layout = Layout(8, nodes, tp=tp, pp=pp)
    m = gb // layout.data_parallel
    first = stage_loads(split, layout, m)[0]
    expected = megatron_activations_without_sp(2048, 1, 12288, 96, tp, pp, m)
    # trainplan keeps FlashAttention's fp32 log-sum-exp (4 bytes per head per token) where Megatron counts nothing
    assert first.activations == pytest.approx(expected, rel=2e-3)


def test_model_states_shard_over_data_and_context_parallel_ranks() -> None:
    """ZeRO-1 (Megatron's distributed optimizer) keeps 16-bit weights and gradients and 12/N bytes of optimizer
    state per parameter of the rank's shard, N = dp × cp (Rajbhandari et al. 2020)."""
    job, split = gpt_split(global_batch=64)
    hw = hardware_for_gpu(find_accelerator("A100-80GB", CAT), CAT, gpus=8, nodes=8)
    hw = replace(hw, layout=Layout(8, 8, tp=8, pp=4, sequence_parallel=True))
    e = compose(job, transformer_profile(job, CAT), hw, Strategy.ZERO1, CAT)
    first = stage_loads(split, hw.layout, 64 // 2)[0]
    dp = hw.layout.data_parallel
    assert dp == 2
    assert e.memory.optimizer == pytest.approx(first.dense_params * 12 / dp, rel=1e-9)
    assert e.memory.weights == pytest.approx(first.dense_params * 2, rel=1e-9)


def test_pipeline_in_flight_and_bubble() -> None:
    assert in_flight_microbatches(Layout(8, 8, tp=8, pp=8), 4) == 4  # fewer micro-batches than stages
    assert in_flight_microbatches(Layout(8, 8, tp=8, pp=8), 64) == 8
    assert in_flight_microbatches(Layout(8, 8, tp=8, pp=8, vpp=2), 64) == pytest.approx(8 * (1 + 7 / 16))
    assert bubble_fraction(Layout(8, 8, tp=8, pp=8), 32) == pytest.approx(7 / 32)
    assert bubble_fraction(Layout(8, 8, tp=8, pp=8, vpp=4), 32) == pytest.approx(7 / 128)
    assert bubble_fraction(Layout(8, 8, tp=8), 32) == 0.0


def test_in_flight_per_rank_follows_the_schedules_warm_up() -> None:
    """1F1B: rank r holds p − r micro-batches (its p − r − 1 warm-up forwards and the one in hand); interleaved:
    Megatron-Core's warm-up of (p − r − 1)·2 + (v − 1)·p chunk forwards plus one, over v chunks."""
    lay = Layout(8, 8, tp=8, pp=8)
    assert [in_flight_microbatches(lay, 64, r) for r in range(8)] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert in_flight_microbatches(lay, 3, 1) == 3  # fewer micro-batches than the warm-up
    inter = Layout(8, 8, tp=8, pp=8, vpp=2)
    assert in_flight_microbatches(inter, 64, 7) == pytest.approx((8 + 1) / 2)  # the last rank: (v − 1)·p + 1 chunks
    assert in_flight_microbatches(inter, 2, 0) == pytest.approx(2)  # capped at every chunk of every micro-batch


def llama3_405b_split(**knobs: int):
    job = parse_job({"kind": "transformer", "model": "llama-3.1-405b", "method": "full", "seq_len": 8192,
                     "micro_batch": 1, "global_batch": 2048, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "none", "tokens": 1e9, "knobs": knobs})  # fmt: skip
    split = transformer_profile(job, CAT).split
    assert split is not None and split.layers == 126
    return job, split


def test_embedding_and_head_counted_as_blocks_give_llama3s_split() -> None:
    """torchtitan's defaults (first / last stage less layers 1): 126 blocks + 2 over 16 stages deal 8 each, the
    first and last giving one to the embedding and the head — 7, 8, …, 8, 7, Meta's split (Dubey et al. 2024, Sec.
    3.3.2).  With neither counted the even split puts the remainder first."""
    _, split = llama3_405b_split(pipeline_first_stage_less_layers=1, pipeline_last_stage_less_layers=1)
    lay = Layout(8, 1024, tp=8, pp=16, sequence_parallel=True)
    assert chunk_layers(split, lay) == (7,) + (8,) * 14 + (7,)
    assert stage_layers(split, lay) == 8
    _, plain = llama3_405b_split()
    assert chunk_layers(plain, lay) == (8,) * 14 + (7,) * 2
    # torchtitan's own docstring case: 32 blocks + 2 over 4 stages is 9, 9, 8, 8 less the embedding and head
    _, split = llama3_405b_split(pipeline_first_stage_less_layers=1, pipeline_last_stage_less_layers=1)
    small = replace(split, layers=32)
    assert chunk_layers(small, Layout(4, 1, pp=4)) == (8, 9, 8, 7)
    # interleaved: rank r holds chunks r and r + pp
    assert chunk_layers(small, Layout(4, 1, pp=4, vpp=2)) == (4, 5, 4, 4, 4, 4, 4, 3)
    assert rank_layers(small, Layout(4, 1, pp=4, vpp=2)) == (8, 9, 8, 7)


def test_the_most_loaded_rank_can_be_the_second() -> None:
    """With the first stage one block short, rank 1 (8 blocks × 15 micro-batches in flight) holds more activations
    than rank 0 (7 × 16): the loads include it, and the estimate's peak is the larger."""
    _, split = llama3_405b_split(pipeline_first_stage_less_layers=1, pipeline_last_stage_less_layers=1)
    lay = Layout(8, 1024, tp=8, pp=16, sequence_parallel=True)
    loads = {ld.name: ld for ld in stage_loads(split, lay, 32)}
    assert set(loads) == {"first", "second", "last"}
    per_block = block_activation_bytes(split, lay, moe=False)
    assert loads["second"].activations == pytest.approx(15 * 8 * per_block)
    assert loads["first"].activations > 16 * 7 * per_block  # plus the embedding's own
    assert loads["second"].activations > loads["first"].activations


def test_embedding_weight_larger_than_a_chunk_is_refused() -> None:
    """torchtitan's own check: the embedding's (or head's) share may not exceed the smallest chunk's units."""
    _, split = llama3_405b_split(pipeline_first_stage_less_layers=5)
    err = layout_error(split, Layout(8, 32, tp=8, pp=32), Strategy.FSDP)  # 131 units over 32: chunks of 4
    assert err is not None and err[0] == "knobs.pipeline_first_stage_less_layers" and "at most" in err[1]
    assert layout_error(split, Layout(8, 16, tp=8, pp=16), Strategy.FSDP) is None  # chunks of 8


def test_fsdp_under_a_pipeline_keeps_the_stage_gathered() -> None:
    """torch.distributed.pipelining turns an FSDP stage's reshard_after_backward and gradient sync off until the
    last backward, and torchtitan does not reshard after forward under PP: the stage's 16-bit parameters and its
    unsharded (fp32-reduced) gradients are held — fsdp and fsdp-grad-op then hold the same, unlike at pp = 1."""
    job = gpt_job(global_batch=64)
    prof = transformer_profile(job, CAT)
    hw = hardware_for_gpu(find_accelerator("A100-80GB", CAT), CAT, gpus=8, nodes=8)
    piped = replace(hw, layout=Layout(8, 8, tp=8, pp=4, sequence_parallel=True))
    full, grad_op = (compose(job, prof, piped, s, CAT) for s in (Strategy.FSDP, Strategy.FSDP_GRAD_OP))
    assert full.memory.weights == pytest.approx(grad_op.memory.weights)
    assert full.memory.gradients == pytest.approx(grad_op.memory.gradients)
    params = stage_loads(prof.split, piped.layout, 64 // 2)[0].dense_params
    assert full.memory.gradients == pytest.approx(params * 4)  # unsharded, fp32 (mixed precision's reduce dtype)
    assert full.memory.weights >= params * 2  # the gathered 16-bit copy, plus the fp32 shards
    flat = replace(hw, layout=Layout(8, 8, tp=8, sequence_parallel=True))
    full1, grad_op1 = (compose(job, prof, flat, s, CAT) for s in (Strategy.FSDP, Strategy.FSDP_GRAD_OP))
    assert full1.memory.weights < grad_op1.memory.weights


def test_uneven_stages_take_the_ceiling() -> None:
    """126 layers on 16 stages: the fullest stage has 8 blocks (Llama 3's layout)."""
    job = parse_job({"kind": "transformer", "model": "llama-3.1-405b", "method": "full", "seq_len": 8192,
                     "micro_batch": 1, "global_batch": 2048, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "full", "tokens": 1e9})  # fmt: skip
    split = transformer_profile(job, CAT).split
    assert split is not None and split.layers == 126
    layout = Layout(8, 2048, tp=8, pp=16, sequence_parallel=True)
    first = stage_loads(split, layout, 16)[0]
    block = split.block_params / split.layers
    assert first.dense_params == pytest.approx((8 * block + split.embedding_params) / 8)


# ----------------------------------------------------------------------------- step time


def test_model_parallel_step_time_terms() -> None:
    """Tensor-parallel all-reduces grow with tp, the bubble falls with interleaving, MFU stays below 1."""
    job = gpt_job(global_batch=64)
    prof = transformer_profile(job, CAT)
    hw = hardware_for_gpu(find_accelerator("A100-80GB", CAT), CAT, gpus=8, nodes=8)
    est = {}
    for tp, pp, vpp in ((8, 8, 1), (8, 8, 2), (4, 16, 1)):
        h = replace(hw, layout=Layout(8, 8, tp=tp, pp=pp, vpp=vpp, sequence_parallel=True))
        est[(tp, pp, vpp)] = compose(job, prof, h, Strategy.ZERO1, CAT)
    plain, inter, narrow = est[(8, 8, 1)], est[(8, 8, 2)], est[(4, 16, 1)]
    assert plain.fits and 0 < plain.mfu < 1
    assert plain.time_breakdown["tp_comm_s"] > narrow.time_breakdown["tp_comm_s"] > 0
    assert inter.time_breakdown["pipeline_bubble_s"] < plain.time_breakdown["pipeline_bubble_s"]
    assert plain.time_breakdown["pp_comm_s"] > 0 and plain.time_breakdown["cp_comm_exposed_s"] == 0
    # m = 64 / dp 1 = 64 micro-batches, p = 8: bubble (p − 1)/m of the pipelined time
    per_micro = (plain.time_breakdown["compute_s"] + plain.time_breakdown["tp_comm_s"] + plain.time_breakdown["pp_comm_s"]) / 64
    assert plain.time_breakdown["pipeline_bubble_s"] == pytest.approx(7 * per_micro, rel=1e-6)


def test_expert_parallel_divides_the_experts() -> None:
    job = parse_job({"kind": "transformer", "model": "mixtral-8x7b", "method": "full", "seq_len": 4096,
                     "micro_batch": 1, "global_batch": 64, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "full", "tokens": 1e9})  # fmt: skip
    prof = transformer_profile(job, CAT)
    hw = hardware_for_gpu(find_accelerator("H100-80GB", CAT), CAT, gpus=8, nodes=1)
    one = compose(job, prof, replace(hw, layout=Layout(8, 1, tp=2, sequence_parallel=True)), Strategy.ZERO1, CAT)
    ep = compose(job, prof, replace(hw, layout=Layout(8, 1, tp=2, ep=4, sequence_parallel=True)), Strategy.ZERO1, CAT)
    assert ep.memory.weights < one.memory.weights
    assert ep.time_breakdown["ep_comm_s"] > 0 and one.time_breakdown["ep_comm_s"] == 0


def test_expert_groups_fold_over_the_tensor_parallel_ranks() -> None:
    """Experts are not tensor-parallel, so the expert layers map a stage's tp × cp × dp ranks with ep innermost
    (Megatron Core's MoE parallel folding): ep 8 with tp 2 on two 8-GPU nodes is a valid layout whose all-to-alls stay
    on NVLink, and ep may use the tensor-parallel ranks too (tp 2 × dp 1 on 2 GPUs: ep 2)."""
    from trainplan.estimate.parallel import parallel_comm
    from trainplan.estimate.steptime import links_for

    assert Layout(2, 1, tp=2, ep=2).ep == 2
    with pytest.raises(SpecError):
        Layout(8, 2, tp=2, ep=32)  # 32 does not divide tp × cp × dp = 16
    job = parse_job({"kind": "transformer", "model": "mixtral-8x7b", "method": "full", "seq_len": 4096,
                     "micro_batch": 1, "global_batch": 64, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "full", "tokens": 1e9})  # fmt: skip
    split = transformer_profile(job, CAT).split
    hw = hardware_for_gpu(find_accelerator("H100-80GB", CAT), CAT, gpus=8, nodes=2)
    links = links_for(hw, CAT)
    inside = parallel_comm(split, Layout(8, 2, tp=2, ep=8, sequence_parallel=True), links).expert
    across = parallel_comm(split, Layout(8, 2, tp=2, ep=16, sequence_parallel=True), links).expert
    # the same bytes leave each rank ((n − 1)/n of them); 8 ranks fit a node, 16 do not
    assert inside > 0 and across > 3 * inside
    # a stage holds each expert's optimizer state once, sharded over the expert layers' data-parallel ranks
    # (tp × cp × dp / ep): ep 8 and ep 16 on the same 16 ranks leave the same state per rank, fewer weights at ep 16
    job = parse_job({"kind": "transformer", "model": "qwen3-30b-a3b", "method": "full", "seq_len": 4096,
                     "micro_batch": 1, "global_batch": 64, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "full", "tokens": 1e9})  # 128 experts: ep 8 and 16 both divide them
    prof = transformer_profile(job, CAT)
    mems = [compose(job, prof, replace(hw, layout=Layout(8, 2, tp=2, ep=ep, sequence_parallel=True)), Strategy.ZERO1,
                    CAT).memory for ep in (8, 16)]  # fmt: skip
    assert mems[0].optimizer == pytest.approx(mems[1].optimizer)
    assert mems[1].weights < mems[0].weights


# ----------------------------------------------------------------------------- the command line


@pytest.fixture
def job405(tmp_path: Path) -> Path:
    p = tmp_path / "j.yaml"
    p.write_text("kind: transformer\nmodel: llama-3.1-405b\nmethod: full\nseq_len: 8192\nmicro_batch: 1\n"
                 "global_batch: 2048\nprecision: bf16\noptimizer: adamw\nactivation_checkpointing: full\ntokens: 2.0e12\n")
    return p


def test_estimate_takes_a_named_layout(capsys: pytest.CaptureFixture[str], job405: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    code = main(["estimate", str(job405), "--gpu", "H100-80GB", "--gpus", "8", "--nodes", "2048", "--tp", "8",
                 "--pp", "16", "--sp", "--strategy", "fsdp", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    d = json.loads(out)
    assert d["parallel"] == {"dp_replicate": 1, "dp_shard": 128, "tp": 8, "pp": 16, "vpp": 1, "cp": 1, "ep": 1,
                             "sequence_parallel": True, "schedule": "1f1b"}  # fmt: skip
    assert d["fits"] and d["time_breakdown_s"]["pipeline_bubble_s"] > 0


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--tp", "3"], "--tp/--pp/--cp"),
        (["--tp", "16", "--nodes", "2"], "--tp"),  # 16 does not divide 8 kv heads
        (["--pp", "256", "--nodes", "256"], "--pp"),
        (["--cp", "3", "--nodes", "3"], "--cp"),
        (["--ep", "2"], "--ep"),
        (["--tp", "8", "--nodes", "0"], "--nodes"),
        (["--tp", "8", "--pp", "4", "--nodes", "2"], "--tp/--pp/--cp"),
    ],
)
def test_bad_layouts_get_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], job405: Path, flags: list[str], field: str) -> None:
    code = main(["estimate", str(job405), "--gpu", "H100-80GB", "--gpus", "8", *flags])
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), err
    assert "Traceback" not in err


def test_a_pipeline_knob_too_large_for_the_layout_is_one_line(capsys: pytest.CaptureFixture[str], job405: Path) -> None:
    job405.write_text(job405.read_text() + "knobs: {pipeline_first_stage_less_layers: 5}\n")
    code = main(["estimate", str(job405), "--gpu", "H100-80GB", "--gpus", "8", "--nodes", "32", "--tp", "8", "--pp", "32"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: knobs.pipeline_first_stage_less_layers:") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_fsdp_gathers_only_the_local_experts_of_an_moe_block_under_expert_parallel() -> None:
    """DeepSeek-V3's MoE block holds 256 routed experts (11.3B parameters); with ep 64 a rank's FSDP all-gather brings
    its 4 (torchtitan and AutoModel shard the experts over their own data-parallel ranks), not all 256 — counted
    whole, the gather buffers alone were 69 GB and NeMo AutoModel's published 256-GPU run read "does not fit"."""
    from trainplan.estimate.architecture import largest_block_params
    from trainplan.estimate.compose import local_block_params

    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "deepseek-v3", "method": "full", "seq_len": 4096, "micro_batch": 1,
                     "steps": 10, "precision": "bf16", "activation_checkpointing": "full"})  # fmt: skip
    split = transformer_profile(job, cat).split
    from trainplan.catalog import resolve_model

    largest = largest_block_params(resolve_model("deepseek-v3", cat))
    per_layer_experts = split.expert_params / (split.moe_layers + split.extra_last_layers)  # 58 + the MTP block
    assert per_layer_experts == pytest.approx(256 * 3 * 7168 * 2048)
    assert local_block_params(largest, split, Layout(gpus_per_node=8, nodes=32)) == largest  # ep 1: the block whole
    ep64 = local_block_params(largest, split, Layout(gpus_per_node=8, nodes=32, pp=4, ep=64))
    assert ep64 == pytest.approx(largest - per_layer_experts * 63 / 64)
    assert local_block_params(largest, split, Layout(gpus_per_node=8, tp=2, ep=4)) == pytest.approx((largest - per_layer_experts * 3 / 4) / 2)
