"""FSDP memory mechanisms: CPU offload as a strategy, gradients kept unsharded while accumulating without sync,
and gradients FSDP allocates for frozen weights that share a unit with trainable ones (memory.model_state_bytes,
the stacks' defaults in catalog/data/stacks.yaml)."""

from __future__ import annotations

import pytest
import yaml

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.memory import GIB, model_state_bytes
from trainplan.estimate.published import compare
from trainplan.estimate.result import RejectKind
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import transformer_profile
from trainplan.spec import Optimizer, Precision, parse_job
from trainplan.strategies import Engine, Strategy, strategies_for

LORA_7B = {"kind": "transformer", "model": "llama-2-7b", "method": "lora", "seq_len": 1024, "micro_batch": 1,
           "precision": "bf16-pure", "activation_checkpointing": "full", "steps": 10}  # fmt: skip


def _hw(gpu: str = "A100-40GB", gpus: int = 2):
    return hardware_for_gpu(find_accelerator(gpu), get_catalog(), gpus=gpus)


def _states(strategy: Strategy, **kw):
    base = dict(trainable_params=1e9, frozen_bytes=0.0, precision=Precision.BF16, optimizer=Optimizer.ADAMW,
                strategy=strategy, world_size=4)  # fmt: skip
    return model_state_bytes(**{**base, **kw})


def test_fsdp_offload_is_a_full_shard_fsdp_strategy_with_everything_on_the_host() -> None:
    s = Strategy.parse("fsdp-offload")
    assert s.engine is Engine.FSDP and s.shards_parameters and s.offloads_parameters and s.offloads_optimizer
    assert not s.multi_device_only and s in strategies_for(1) and s in strategies_for(8)
    on, plain = _states(Strategy.FSDP_OFFLOAD), _states(Strategy.FSDP)
    assert on.weights == on.gradients == on.optimizer == 0.0
    # host per rank: the fp32 parameter shard, its fp32 gradient shard, AdamW's two fp32 states: 16 B / 4 ranks
    assert on.host == pytest.approx(1e9 * (4 + 4 + 8) / 4)
    assert on.host == pytest.approx(plain.weights + plain.gradients + plain.optimizer)


def test_frozen_weight_gradients_are_fsdp_gradients_sharded_like_the_others() -> None:
    extra = 8e9  # bytes of gradients for frozen weights in mixed units
    fsdp = _states(Strategy.FSDP, frozen_gradient_bytes=extra)
    assert fsdp.gradients - _states(Strategy.FSDP).gradients == pytest.approx(extra / 4)
    for other in (Strategy.DDP, Strategy.ZERO3):  # frozen weights keep requires_grad=False outside FSDP1 flat parameters
        assert _states(other, frozen_gradient_bytes=extra).gradients == _states(other).gradients


def test_unsharded_accumulation_keeps_full_gradients_on_the_device() -> None:
    assert _states(Strategy.FSDP, unsharded_gradients=True).gradients == pytest.approx(4 * _states(Strategy.FSDP).gradients)
    assert _states(Strategy.ZERO3, unsharded_gradients=True).gradients == _states(Strategy.ZERO3).gradients
    off = _states(Strategy.FSDP_OFFLOAD, unsharded_gradients=True)  # FSDP1 no_sync docs: not offloaded inside no_sync
    assert off.gradients == pytest.approx(1e9 * 4) and off.weights == off.optimizer == 0.0


def test_litgpt_defaults_and_what_they_add_to_a_lora_fsdp_step() -> None:
    cat = get_catalog()
    job = parse_job({**LORA_7B, "stack": "litgpt", "global_batch": 64})
    k = effective_knobs(job, cat)
    assert k.unsharded_accumulation and k.frozen_weight_gradients
    quiet = parse_job({**LORA_7B, "stack": "litgpt", "global_batch": 64,
                       "knobs": {"unsharded_accumulation": False, "frozen_weight_gradients": False}})  # fmt: skip
    hw = _hw()
    with_knobs = compose(job, transformer_profile(job, cat), hw, Strategy.FSDP, cat)
    without = compose(quiet, transformer_profile(quiet, cat), hw, Strategy.FSDP, cat)
    # bf16 gradients of every block weight (frozen included), unsharded: 2 B x the 6.48e9 block parameters of Llama 2 7B
    added = with_knobs.memory.gradients - without.memory.gradients
    assert added / GIB == pytest.approx(2 * 6.476e9 / GIB, rel=0.01)
    # one micro-step per optimizer step: nothing accumulates, only the frozen-weight gradients remain (sharded)
    single = parse_job({**LORA_7B, "stack": "litgpt", "global_batch": 2})
    one = compose(single, transformer_profile(single, cat), hw, Strategy.FSDP, cat)
    assert one.memory.gradients / GIB == pytest.approx(2 * 6.476e9 / 2 / GIB, rel=0.01)
    # DDP on the same job: frozen weights get no gradient there
    ddp = compose(job, transformer_profile(job, cat), hw, Strategy.DDP, cat)
    assert ddp.memory.gradients < 0.1 * GIB


def test_the_litgpt_13b_two_gpu_oom_is_predicted() -> None:
    """LitGPT's resource table prints OOM for Llama 2 13B LoRA on 2 x A100 40GB; 4 GPUs fit (tests/data/published_stacks.yaml)."""
    records = {r["id"]: r for r in yaml.safe_load(open("tests/data/published_stacks.yaml"))}
    oom = compare(records["litgpt-2xa100-40gb-llama2-13b-lora-fsdp-mb1-oom"])
    fits = compare(records["litgpt-4xa100-40gb-llama2-13b-lora-fsdp-mb1"])
    assert oom is not None and fits is not None
    assert not oom.predicted_fits and fits.predicted_fits
    assert fits.predicted_peak_gib == pytest.approx(fits.measured_peak_gib, rel=0.10)


def test_which_stacks_may_run_fsdp_offload() -> None:
    cat = get_catalog()
    tune = parse_job({**LORA_7B, "method": "full", "stack": "torchtune"})
    prof = transformer_profile(tune, cat)
    assert compose(tune, prof, _hw("A100-80GB", 8), Strategy.FSDP_OFFLOAD, cat).rejection is None
    rejected = compose(tune, prof, _hw("A100-80GB", 8), Strategy.ZERO3_OFFLOAD, cat).rejection
    assert rejected is not None and rejected.kind is RejectKind.PLATFORM and "torchtune" in rejected.text
    ds = parse_job({**LORA_7B, "stack": "deepspeed"})
    reason = compose(ds, transformer_profile(ds, cat), _hw(), Strategy.FSDP_OFFLOAD, cat).rejection
    assert reason is not None and "fsdp-offload" in reason.text
    tpu = hardware_for_gpu(cat.accelerators["TPUv5e"], cat, gpus=8)
    plain = parse_job({**LORA_7B, "precision": "bf16"})
    on_tpu = compose(plain, transformer_profile(plain, cat), tpu, Strategy.FSDP_OFFLOAD, cat).rejection
    assert on_tpu is not None and on_tpu.kind is RejectKind.PLATFORM and "XLA" in on_tpu.text


def test_fsdp_offload_moves_the_70b_model_states_to_the_host() -> None:
    """torchtune's README: Llama 3.1 70B full fine-tune on 8 x A100 'Uses CPU offload' (published_llm.yaml)."""
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "llama-3.1-70b", "seq_len": 2048, "micro_batch": 2, "steps": 10,
                     "precision": "bf16-pure", "activation_checkpointing": "full", "stack": "torchtune"})  # fmt: skip
    prof, hw = transformer_profile(job, cat), _hw("A100-80GB", 8)
    fsdp, off = compose(job, prof, hw, Strategy.FSDP, cat), compose(job, prof, hw, Strategy.FSDP_OFFLOAD, cat)
    assert off.fits and off.memory.weights == off.memory.gradients == off.memory.optimizer == 0.0
    states = 70.55e9 * (2 + 2 + 4) / 8  # bf16 params, grads and two bf16 AdamW states, one rank's shard
    assert fsdp.memory.weights + fsdp.memory.optimizer == pytest.approx(70.55e9 * 6 / 8, rel=0.01)
    assert off.memory.host >= 8 * states  # every rank's shard in the node's RAM
    assert off.memory.peak < fsdp.memory.peak / 3  # what stays: gathered blocks, activations, context


def test_the_fit_hint_offers_fsdp_offload_to_a_stack_without_deepspeed() -> None:
    """torchtune cannot run ZeRO offload; for a 70B full fine-tune on 8 x A100 40GB the hint names FSDP's own offload."""
    from trainplan.planner.core import fit_hint

    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "llama-3.1-70b", "seq_len": 2048, "micro_batch": 1, "steps": 10,
                     "precision": "bf16-pure", "activation_checkpointing": "full", "stack": "torchtune"})  # fmt: skip
    hint = fit_hint(job, _hw("A100-40GB", 8), Strategy.FSDP, cat)
    assert hint is not None and "strategy fsdp-offload" in hint and "zero" not in hint


def test_shard_grad_op_drops_its_unsharded_parameters_after_backward() -> None:
    """SHARD_GRAD_OP keeps the unsharded parameters through backward, so the end of backward holds them with every
    gradient shard; the optimizer step sees only the shards (Lightning's demo 1B, fp32, 2 GPUs: 11.5 GiB measured)."""
    from trainplan.estimate.memory import step_peak

    grad_op = _states(Strategy.FSDP_GRAD_OP, precision=Precision.FP32, world_size=2)
    assert grad_op.unsharded_until_backward_end == pytest.approx(1e9 * 4)
    assert _states(Strategy.FSDP).unsharded_until_backward_end == 0.0
    kw = dict(activations=0.1e9, forward_temporaries=0.0, fixed_overhead=0.0, fragmentation=0.0, grads_live_in_forward=False)
    small_step = step_peak(states=grad_op, optimizer_temporaries=1e9, **kw)
    assert small_step.phase == "backward" and small_step.peak == pytest.approx(grad_op.weights + grad_op.gradients + grad_op.optimizer)
    big_step = step_peak(states=grad_op, optimizer_temporaries=8e9, **kw)
    assert big_step.phase == "optimizer" and big_step.weights == pytest.approx(grad_op.weights - 4e9)
    records = {r["id"]: r for r in yaml.safe_load(open("tests/data/published_stacks.yaml"))}
    c = compare(records["lightning-fabric-2xa100-40gb-demo1b-fsdp-shardgradop"])
    assert c is not None and c.predicted_peak_gib == pytest.approx(c.measured_peak_gib, rel=0.05)


def test_fsdp2_buffers_follow_its_all_gather_and_reduce_scatter_lifetimes() -> None:
    """FSDP2 (torch 2.13 _fsdp_param_group.py / _fsdp_collectives.py): forward holds the running block's flat
    all-gather output, the prefetched one and the copied-out parameters (3 B); backward holds the running block's
    parameters, the prefetched output, its unsharded gradients and the previous block's reduce-scatter input."""
    from trainplan.estimate.memory import fsdp_stream_pool_bytes, sharding_buffer_bytes

    block = 1e8
    full = dict(largest_block_params=block, world_size=8, compute_bytes=2.0, reduce_bytes=4.0)
    assert sharding_buffer_bytes(Strategy.FSDP, **full) == pytest.approx(block * (2 * 2 + 2 + 4))  # backward: 10 B
    lora = {**full, "trainable_fraction": 0.01}
    assert sharding_buffer_bytes(Strategy.FSDP, **lora) == pytest.approx(3 * 2 * block)  # forward: 6 B
    # bf16-pure reduces in bf16: 2 B + 2 B of gradients beside the 4 B of parameters and prefetch
    assert sharding_buffer_bytes(Strategy.FSDP, **{**full, "reduce_bytes": 2.0}) == pytest.approx(8 * block)
    # torch_xla's FSDP on a TPU: XLA assigns the buffers; three gathered blocks, whatever the gradients
    assert sharding_buffer_bytes(Strategy.FSDP, **full, xla=True) == pytest.approx(3 * 2 * block)
    # SHARD_GRAD_OP: parameters stay unsharded in the model states, only the gradient side is a buffer
    assert sharding_buffer_bytes(Strategy.FSDP_GRAD_OP, **full) == pytest.approx(6 * block)
    # the all-gather copy-in stream's pool: 2 B of outputs cached; at the forward-side peak, 1 B of it idle when
    # backward is the larger side (LoRA: the default stream's backward need beyond forward's)
    assert fsdp_stream_pool_bytes(Strategy.FSDP, **full) == pytest.approx((4 * block, 2 * block))
    assert fsdp_stream_pool_bytes(Strategy.FSDP, **lora) == pytest.approx((4 * block, 0.01 * 6 * block))
    for other in (Strategy.FSDP_GRAD_OP, Strategy.ZERO3, Strategy.DDP):
        assert fsdp_stream_pool_bytes(other, **full) == (0.0, 0.0)
    assert fsdp_stream_pool_bytes(Strategy.FSDP, **{**full, "world_size": 1}) == (0.0, 0.0)


def test_the_all_gather_pool_is_reserved_not_allocated() -> None:
    """Two bf16 blocks cached for the all-gather stream: all idle when the optimizer step holds the peak (micro-batch
    1, states larger than activations), one when the forward side does (micro-batch 8)."""
    cat = get_catalog()
    for micro_batch, phase, idle_blocks in ((1, "optimizer", 2), (8, "forward", 1)):
        job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": micro_batch,
                         "steps": 10, "precision": "bf16", "activation_checkpointing": "full"})  # fmt: skip
        prof = transformer_profile(job, cat)
        est = compose(job, prof, _hw("A100-80GB", 8), Strategy.FSDP, cat)
        assert est.memory.phase == phase
        assert est.memory.stream_pool == pytest.approx(idle_blocks * 2.0 * prof.params.largest_block)
        assert est.memory.reserved - est.memory.allocated >= est.memory.stream_pool
        assert est.memory.reserved_expandable - est.memory.allocated >= est.memory.stream_pool  # a pool per stream
    one = compose(job, prof, _hw("A100-80GB", 1), Strategy.FSDP, cat)  # nothing to gather on one device
    assert one.memory.stream_pool == 0.0
