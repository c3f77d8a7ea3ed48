"""Step time of analytic transformer profiles: matmuls, the fused attention kernel and memory-bound ops each at their
own rate (compute.KernelSplit, steptime.step_time)."""

from __future__ import annotations

import pytest

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.estimate.compute import memory_bound_bytes_per_token, training_step_flops
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.steptime import attention_efficiency, gemm_efficiency
from trainplan.estimate.transformer import estimate_transformer, transformer_profile
from trainplan.model import ModelArch
from trainplan.spec import Checkpointing, Precision, parse_job
from trainplan.strategies import Strategy

GPT_125M = dict(layers=12, hidden=768, heads=12, ffn_hidden=3072, vocab=50368, mlp="gelu", position="learned",
                norm="layernorm", bias=True)  # fmt: skip
KW = dict(tokens=4096.0, matmul_params=1e9, trainable_matmul_params=1e9, adapter_params=0.0, layers=24, seq_len=4096,
          attn_dim=2048, lm_head_params=1e8)  # fmt: skip


def _job(seq_len: int = 2048, micro_batch: int = 4, **extra):
    model = dict(GPT_125M)
    model.update(extra.pop("model", {}))
    data = {"kind": "transformer", "model": model, "seq_len": seq_len, "micro_batch": micro_batch, "steps": 1}
    data.update(extra)
    return parse_job(data)


def test_fused_attention_backward_recomputes_the_scores() -> None:
    # FlashAttention's backward runs 5 matmuls against the forward's 2 (Dao et al. 2022, Alg. 4): 2.5x, not 2x
    plain = training_step_flops(checkpointing=Checkpointing.NONE, **KW)  # type: ignore[arg-type]
    fused = training_step_flops(checkpointing=Checkpointing.NONE, causal_fused_attention=True,
                                block_bytes_per_token=1.0, **KW)  # type: ignore[arg-type]  # fmt: skip
    assert fused.split is not None
    assert fused.split.attention_backward == pytest.approx(2.5 * fused.split.attention_forward)
    assert fused.kernel_recompute == pytest.approx(0.5 * fused.split.attention_forward)
    # MFU's numerator stays the conventional count (full attention, no recomputation of any kind)
    assert fused.model == pytest.approx(plain.model)
    assert fused.hardware < plain.hardware  # the causal half is skipped, the extra 0.5x does not make it up


def test_full_checkpointing_recomputes_attention_and_memory_bound_ops() -> None:
    kw = dict(causal_fused_attention=True, block_bytes_per_token=100.0, **KW)
    none = training_step_flops(checkpointing=Checkpointing.NONE, **kw)  # type: ignore[arg-type]
    full = training_step_flops(checkpointing=Checkpointing.FULL, **kw)  # type: ignore[arg-type]
    sel = training_step_flops(checkpointing=Checkpointing.SELECTIVE, **kw)  # type: ignore[arg-type]
    assert none.split and full.split and sel.split
    attn = none.split.attention_forward
    assert full.split.attention_backward == pytest.approx(none.split.attention_backward + attn)
    assert sel.split.attention_backward == pytest.approx(none.split.attention_backward + attn)
    assert none.split.bytes_forward == pytest.approx(100.0 * 24 * 4096)
    assert none.split.bytes_backward == pytest.approx(1.5 * none.split.bytes_forward)
    assert full.split.bytes_backward == pytest.approx(2.5 * none.split.bytes_forward)
    assert sel.split.bytes_backward == pytest.approx(none.split.bytes_backward)  # selective recomputes only attention


def test_memory_bound_bytes_count_the_ops_of_a_block() -> None:
    gpt = ModelArch(**GPT_125M)
    # AMP: fp32 residual stream. norm 2·4h + cast (4+2)h; residual add (2·4+2)h; GELU 2·2·4h — each twice but GELU
    h = 768
    assert memory_bound_bytes_per_token(gpt, Precision.BF16) == 2 * (8 * h + 6 * h) + 2 * (10 * h) + 2 * 2 * 4 * h
    # pure bf16: everything 16-bit, no casts
    assert memory_bound_bytes_per_token(gpt, Precision.BF16_PURE) == 2 * (4 * h) + 2 * (6 * h) + 2 * 2 * 4 * h
    llama = ModelArch(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=11008, vocab=32000)
    h, f, q, kv = 4096, 11008, 4096, 1024
    # SwiGLU: act(gate) read+write, product read 2 write 1; rotary reads and writes q and k
    expected = 2 * (8 * h + 6 * h) + 2 * (10 * h) + 5 * 2 * f + 2 * 2 * (q + kv)
    assert memory_bound_bytes_per_token(llama, Precision.BF16) == expected
    # Cohere: one fp32 Python LayerNorm a block (48 bytes an element of fp32 kernels; on a 16-bit stream the casts in
    # and out add 2·(2 + 4)), in place of two norms
    cohere = llama.model_copy(update={"norm": "layernorm", "norm_python": True, "block_norms": 1})
    assert memory_bound_bytes_per_token(cohere, Precision.BF16) == expected - 2 * (8 * h + 6 * h) + 48 * h
    pure = memory_bound_bytes_per_token(llama, Precision.BF16_PURE) - 2 * 4 * h
    assert memory_bound_bytes_per_token(cohere, Precision.BF16_PURE) == pure + (48 + 12) * h


def test_memory_bound_ops_cost_more_on_a_gpu_with_less_bandwidth() -> None:
    # A100-40GB and A100-80GB have the same tensor peak (312 TFLOP/s) but 1555 vs 2039 GB/s of HBM
    cat = get_catalog()
    job = _job()
    t = {}
    for acc in ("A100-40GB", "A100-80GB"):
        hw = hardware_for_gpu(find_accelerator(acc), cat, gpus=1)
        t[acc] = estimate_transformer(job, hw, Strategy.SINGLE, cat).step_time_s
    assert t["A100-40GB"] > t["A100-80GB"] * 1.03


def test_long_sequences_lose_mfu_on_hopper_where_attention_kernels_lag() -> None:
    # the attention share grows with s; Ampere-style kernels reach less of H100's peak than of A100's
    cat = get_catalog()
    mfu = {}
    for acc in ("A100-80GB", "H100-80GB"):
        hw = hardware_for_gpu(find_accelerator(acc), cat, gpus=1)
        mfu[acc] = [estimate_transformer(_job(seq_len=s, micro_batch=max(1, 16384 // s)), hw, Strategy.SINGLE, cat).mfu
                    for s in (2048, 32768)]  # fmt: skip
    a100, h100 = attention_efficiency(cat, "A100-80GB"), attention_efficiency(cat, "H100-80GB")
    assert h100 < a100 < gemm_efficiency(cat, "A100-80GB")
    assert mfu["H100-80GB"][1] < mfu["H100-80GB"][0]  # measured: llm-foundry H100 MFU falls from ~0.42 to ~0.33
    assert mfu["H100-80GB"][1] / mfu["H100-80GB"][0] < mfu["A100-80GB"][1] / mfu["A100-80GB"][0]


def test_step_time_adds_the_three_rates() -> None:
    cat = get_catalog()
    job = _job()
    acc = find_accelerator("A100-80GB")
    hw = hardware_for_gpu(acc, cat, gpus=1)
    prof = transformer_profile(job, cat)
    split = prof.flops.split
    assert split is not None and split.attention_forward > 0
    peak = 312e12
    bw = 2039e9 * cat.assumption("mem_bw_efficiency")
    fwd_bwd = prof.flops.forward + prof.flops.backward + prof.flops.recompute
    attn = split.attention_forward + split.attention_backward
    e_mm, e_attn = gemm_efficiency(cat, acc.id), attention_efficiency(cat, acc.id)
    moved = split.bytes_forward + split.bytes_backward + split.amp_forward + split.amp_backward  # a GPU: casts too
    expected = (fwd_bwd - attn) / (peak * e_mm) + attn / (peak * e_attn) + moved / bw
    e = estimate_transformer(job, hw, Strategy.SINGLE, cat)
    assert e.time_breakdown["compute_s"] == pytest.approx(expected)


def test_a_measured_efficiency_prices_the_whole_step_at_that_efficiency() -> None:
    # a calibration measures the step as a whole: no split, every executed FLOP at the measured rate
    cat = get_catalog()
    job = _job()
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1)
    prof = transformer_profile(job, cat)
    e = estimate_transformer(job, hw, Strategy.SINGLE, cat, efficiency=0.4)
    assert e.time_breakdown["compute_s"] == pytest.approx(prof.flops.hardware / (312e12 * 0.4))


def _offload_seconds(strategy, micro_steps: int = 4) -> float:
    from trainplan.estimate.steptime import step_time
    from trainplan.spec import Optimizer

    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=8)
    st = step_time(hw=hw, strategy=strategy, catalog=cat, precision=Precision.BF16, optimizer=Optimizer.ADAMW,
                   micro_steps=micro_steps, flops_forward=1e15, flops_backward=2e15, flops_model=3e15,
                   trainable_params=8e9, total_params=8e9, efficiency=0.5)  # fmt: skip
    return st.breakdown["offload_s"]


def test_fsdp_cpu_offload_streams_the_fp32_shard_every_micro_step() -> None:
    # FSDP's CPU offload (torch/distributed/fsdp/_flat_param.py _use_low_precision_shard, _runtime_utils.py
    # _offload_grad): the fp32 shard goes to the device at each unshard (forward, backward) and the fp32 sharded
    # gradient comes back after each reduce-scatter. Tested through the strategy's properties, as any FSDP
    # offload strategy exposes them.
    from types import SimpleNamespace

    from trainplan.strategies import Engine, ZeroStage

    fsdp_offload = SimpleNamespace(engine=Engine.FSDP, zero_stage=ZeroStage.STAGE_3, offloads_optimizer=True,
                                   offloads_parameters=True, shards_optimizer=True)  # fmt: skip
    cat = get_catalog()
    pcie = cat.assumption("pcie_gb_s") * 1e9
    shard = 8e9 / 8
    t1, t4 = _offload_seconds(fsdp_offload, 1), _offload_seconds(fsdp_offload, 4)
    assert t4 - t1 == pytest.approx(3 * (2 * shard * 4 + shard * 4) / pcie)  # per micro-step: 2 fp32 uploads, 1 down
    # DeepSpeed ZeRO-3 offload streams its 16-bit working weights; gradients go down once per step
    z1, z4 = _offload_seconds(Strategy.ZERO3_OFFLOAD, 1), _offload_seconds(Strategy.ZERO3_OFFLOAD, 4)
    assert z4 - z1 == pytest.approx(3 * 2 * shard * 2 / pcie)


def test_foreach_adamw_moves_what_pytorchs_multi_tensor_kernels_read_and_write() -> None:
    """PyTorch's foreach AdamW (torch/optim/adam.py ``_multi_tensor_adam``), run for real on CPU with foreach=True and
    every aten op it dispatches logged: the bytes its ``_foreach_*`` kernels read and write equal
    ``optimizer_bytes_touched(..., foreach=True)`` — 4w + 2g + 14s a parameter, 80 bytes in fp32 — where a fused
    kernel moves 2w + g + 4s = 28."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from trainplan.estimate.steptime import optimizer_bytes_touched
    from trainplan.spec import Optimizer, Precision

    params = [torch.nn.Parameter(torch.randn(n)) for n in (1000, 2000, 3000)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True)
    opt.step()  # creates the state; the second step is the steady one

    class Count(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            if func.__name__.startswith("_foreach_"):
                # each distinct tensor read once (addcmul_(v, g, g) names the gradient twice)
                big = list({t.data_ptr(): t for t in tree_flatten(args)[0]
                            if isinstance(t, torch.Tensor) and t.numel() > 1}.values())  # fmt: skip
                read = sum(t.numel() * t.element_size() for t in big)
                written = sum(t.numel() * t.element_size() for t in tree_flatten(out)[0]
                              if isinstance(t, torch.Tensor) and t.numel() > 1)  # fmt: skip
                if func.__name__.split(".")[0].endswith("_"):  # in place: writes its first list
                    written = sum(t.numel() * t.element_size() for t in args[0] if t.numel() > 1)
                Count.moved += read + written
            return out

    with Count():
        opt.step()
    n = sum(p.numel() for p in params)
    assert Count.moved == 80 * n
    assert optimizer_bytes_touched(n, Optimizer.ADAMW, Precision.FP32, Strategy.SINGLE, foreach=True) == 80 * n
    assert optimizer_bytes_touched(n, Optimizer.ADAMW, Precision.FP32, Strategy.SINGLE) == 28 * n


def test_eager_attention_and_a_python_gelu_move_more_bytes() -> None:
    """Eager attention writes and reads every head's s x s scores through separate kernels (8a + 8 bytes a score under
    autocast, + 2a + 1 with dropout); transformers' Python GELU is eight kernels (68 + 5a bytes an element under
    autocast, 18a at one dtype) where a fused GELU reads and writes once (2a)."""
    arch = ModelArch(layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=100, mlp="gelu", norm="layernorm",
                     position="learned", bias=True)  # fmt: skip
    base = memory_bound_bytes_per_token(arch, Precision.BF16)
    assert memory_bound_bytes_per_token(arch, Precision.BF16, seq_len=512, eager_attention=True) - base == 24 * 4 * 512
    dropped = arch.model_copy(update={"dropout": 0.1})
    assert (memory_bound_bytes_per_token(dropped, Precision.BF16, seq_len=512, eager_attention=True)
            - memory_bound_bytes_per_token(dropped, Precision.BF16)) == 29 * 4 * 512  # fmt: skip
    python_gelu = arch.model_copy(update={"gelu_python": True})
    assert memory_bound_bytes_per_token(python_gelu, Precision.BF16) - base == (78 - 4) * 256
    assert memory_bound_bytes_per_token(python_gelu, Precision.BF16_PURE) - memory_bound_bytes_per_token(
        arch, Precision.BF16_PURE) == (36 - 4) * 256


def test_autocast_casts_are_priced_where_the_weights_are_fp32() -> None:
    """DDP under AMP keeps fp32 weights and autocast casts each at use; DeepSpeed keeps 16-bit working weights and
    FSDP gathers 16-bit parameters, so the same step computes for exactly the cast traffic less
    (transformer.autocast_cast_bytes)."""
    cat = get_catalog()
    job = _job()
    acc = find_accelerator("A100-80GB")
    hw = hardware_for_gpu(acc, cat, gpus=2)
    split = transformer_profile(job, cat).flops.split
    assert split is not None and split.amp_forward > 0
    bw = acc.mem_bandwidth_gb_s * 1e9 * cat.assumption("mem_bw_efficiency")
    ddp = estimate_transformer(job, hw, Strategy.DDP, cat).time_breakdown["compute_s"]
    zero2 = estimate_transformer(job, hw, Strategy.ZERO2, cat).time_breakdown["compute_s"]
    assert ddp - zero2 == pytest.approx((split.amp_forward + split.amp_backward) / bw)  # one micro-step
    assert estimate_transformer(job, hw, Strategy.FSDP, cat).time_breakdown["compute_s"] == pytest.approx(zero2)


def test_tf32_matmul_knob_prices_fp32_matmuls_at_the_tf32_peak_where_there_is_one() -> None:
    """PyTorch runs fp32 matmuls on the fp32 units unless the code sets allow_tf32 (knobs.tf32_matmul): on an A100
    the knob moves the matmuls from the 19.5 to the 156 TFLOP/s peak; a V100 has no TF32 units; a bf16 job's
    matmuls are 16-bit either way."""
    cat = get_catalog()
    a100 = hardware_for_gpu(find_accelerator("A100-80GB", cat), cat, gpus=1)
    v100 = hardware_for_gpu(find_accelerator("V100-32GB", cat), cat, gpus=1)

    def step(hw, precision: str, tf32: bool | None) -> float:
        knobs = {} if tf32 is None else {"knobs": {"tf32_matmul": tf32}}
        return estimate_transformer(_job(precision=precision, **knobs), hw, Strategy.SINGLE, cat).step_time_s

    off, on = step(a100, "fp32", None), step(a100, "fp32", True)
    assert on < off / 3  # matmuls dominate a 125M model's step: most of 156 / 19.5 = 8x shows
    assert step(a100, "fp32", False) == off
    assert step(v100, "fp32", True) == step(v100, "fp32", None)
    assert step(a100, "bf16", True) == step(a100, "bf16", None)


def test_a_run_with_the_tf32_knob_switches_pytorch_to_tf32_matmuls() -> None:
    import torch

    from trainplan.run.worker import allow_tf32_matmul

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert not allow_tf32_matmul(_job(precision="fp32"))
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert allow_tf32_matmul(_job(precision="fp32", knobs={"tf32_matmul": True}))
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_a_tf32_knob_that_is_not_a_boolean_is_one_line_naming_it() -> None:
    from trainplan.errors import SpecError

    with pytest.raises(SpecError) as err:
        _job(precision="fp32", knobs={"tf32_matmul": "maybe"})
    assert "knobs.tf32_matmul" in str(err.value) and "\n" not in str(err.value)
