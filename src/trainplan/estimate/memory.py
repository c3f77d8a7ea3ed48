"""Per-device memory of one training step, one pure function per quantity.

Sources (each function cites the one it uses):

* Model states by ZeRO stage — Rajbhandari et al. 2020, "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models", Sec. 3.1 and 5
  (mixed-precision Adam: 2Ψ fp16 weights + 2Ψ fp16 gradients + KΨ optimizer,
  K = 12: fp32 master, momentum, variance).
* Activations of a transformer layer — Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", Sec. 4.1 (eq. 1:
  sbh(34 + 5as/h) bytes in fp16 for a GPT block), generalised term by term to
  gated MLPs, grouped-query attention, fused attention (Dao et al. 2022,
  "FlashAttention": no s² tensors kept, only the log-sum-exp) and to the
  fp32 up-cast that Hugging Face's ``LlamaRMSNorm`` performs.
* Activation checkpointing — Chen et al. 2016, "Training Deep Nets with
  Sublinear Memory Cost": keep each block's input, recompute one block at a time.
* PyTorch conventions — autocast caches low-precision copies of fp32 weights
  for the forward pass (torch.amp docs, "autocast ... caches casted weights");
  ``torch.optim.AdamW`` keeps its states in the parameter's dtype and its
  multi-tensor (foreach) step allocates one temporary per state element.
* 8-bit optimizers — Dettmers et al. 2022, "8-bit Optimizers via Block-wise
  Quantization": 1 byte per state element.

All results are bytes.  Nothing here knows about hardware prices or ranking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from trainplan.spec import Checkpointing, FusedKernels, LossImpl, Optimizer, Precision, SelectiveRecompute
from trainplan.strategies import Engine, Strategy, ZeroStage

GIB = 2**30

# DeepSpeed bucket sizes that trainplan writes into the configs it renders (run/),
# so the estimate matches the launched job.  Elements, not bytes.
DEEPSPEED_REDUCE_BUCKET_ELEMS = 200_000_000
DEEPSPEED_ALLGATHER_BUCKET_ELEMS = 200_000_000
DEEPSPEED_PREFETCH_BUCKET_ELEMS = 50_000_000
DEEPSPEED_MAX_LIVE_PARAMS = 1_000_000_000


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device at the moment of peak, by category."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float  # temporaries, buffers, CUDA context, allocator reserve
    host: float = 0.0  # host RAM per node needed by offload (bytes)
    phase: str = "forward"  # where the peak falls: "forward" (end of forward/start of backward) or "optimizer"
    context: float = 0.0  # CUDA context + communicator buffers (part of overhead; never seen by the allocator)
    fragmentation: float = 0.0  # reserved by the caching allocator but not allocated at the peak (part of overhead)
    expandable_slack: float = 0.0  # the same with expandable_segments: at most the partly used pages
    stream_pool: float = 0.0  # part of fragmentation: another stream's cached blocks (FSDP2's all-gather outputs)

    @property
    def peak(self) -> float:
        """What the device must hold: reserved + context (the figure the fit verdict compares)."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    @property
    def allocated(self) -> float:
        """Peak allocated bytes: what ``torch.cuda.max_memory_allocated`` shows."""
        return self.peak - self.context - self.fragmentation

    @property
    def reserved(self) -> float:
        """Peak reserved by the caching allocator (``torch.cuda.max_memory_reserved``)."""
        return self.allocated + self.fragmentation

    @property
    def reserved_expandable(self) -> float:
        """Peak reserved with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
        return self.allocated + self.expandable_slack


# ----------------------------------------------------------------------------- model states


def optimizer_state_elems_per_param(optimizer: Optimizer, *, state_elems_per_param: float = 0.0) -> float:
    """State elements kept per trainable parameter.

    AdamW: momentum + variance (Loshchilov & Hutter 2019); SGD with momentum and
    Lion (Chen et al. 2023): one buffer; Adafactor (Shazeer & Stern 2018): a
    factored second moment, rows + columns per matrix, no first moment by
    default — passed in by the caller, who knows the shapes.  Muon (torch.optim.Muon:
    one ``momentum_buffer`` per 2-D hidden matrix, torch/optim/_muon.py) beside AdamW's
    two on the other parameters: the mix is passed in by the caller too.  adam8bit has two
    states too; its element size differs (see :func:`optimizer_bytes_per_param`).
    """
    return {
        Optimizer.ADAMW: 2.0,
        Optimizer.ADAM8BIT: 2.0,
        Optimizer.SGD: 1.0,
        Optimizer.LION: 1.0,
        Optimizer.ADAFACTOR: state_elems_per_param,
        Optimizer.MUON: state_elems_per_param,
    }[optimizer]


def optimizer_bytes_per_param(
    optimizer: Optimizer, precision: Precision, engine: Engine, *, state_elems_per_param: float = 0.0
) -> float:
    """Optimizer bytes per trainable parameter, fp32 master copy included where the engine keeps one.

    DeepSpeed with fp16/bf16 keeps 2-byte working weights and an fp32 master in
    the optimizer (ZeRO paper K = 12 for Adam); PyTorch AMP and FSDP keep fp32
    weights, so no separate master.  Pure bf16 keeps states in bf16.
    """
    elems = optimizer_state_elems_per_param(optimizer, state_elems_per_param=state_elems_per_param)
    if optimizer is Optimizer.ADAM8BIT:
        state = elems * 1.0
    elif precision is Precision.BF16_PURE:
        state = elems * 2.0
    else:
        state = elems * 4.0
    master = 4.0 if (engine is Engine.DEEPSPEED and precision.mixed) else 0.0
    return state + master


def weight_bytes_per_param(precision: Precision, engine: Engine) -> float:
    """Bytes of a trainable weight as held on the device between steps."""
    if precision is Precision.FP32:
        return 4.0
    if precision is Precision.BF16_PURE:
        return 2.0
    # mixed precision: DeepSpeed holds fp16/bf16 working weights; torch AMP and FSDP hold fp32.
    return 2.0 if engine is Engine.DEEPSPEED else 4.0


def gradient_bytes_per_param(precision: Precision, engine: Engine) -> float:
    """Gradients have the dtype of the weights they belong to (PyTorch autograd); FSDP reduces into fp32 shards."""
    return weight_bytes_per_param(precision, engine)


@dataclass(frozen=True)
class ModelStates:
    weights: float
    gradients: float
    optimizer: float
    host: float
    # part of ``weights`` that exists from forward through backward only: SHARD_GRAD_OP's unsharded parameters,
    # resharded after backward (PyTorch FSDP docs, ShardingStrategy.SHARD_GRAD_OP), so absent at the optimizer step
    unsharded_until_backward_end: float = 0.0


def model_state_bytes(
    *,
    trainable_params: float,
    frozen_bytes: float,
    precision: Precision,
    optimizer: Optimizer,
    strategy: Strategy,
    world_size: int,
    state_elems_per_param: float = 0.0,
    frozen_gradient_bytes: float = 0.0,
    unsharded_gradients: bool = False,
) -> ModelStates:
    """Weights, gradients and optimizer state per device, and host bytes per rank for offload.

    Sharding by ZeRO stage (Rajbhandari et al. 2020, Fig. 1): stage 1 divides
    the optimizer state by the data-parallel degree N, stage 2 also the
    gradients, stage 3 also the weights.  Frozen weights (LoRA) carry no
    gradients or optimizer state and are sharded only at stage 3.
    Offload (Ren et al. 2021, "ZeRO-Offload"): the optimizer state, its fp32
    master and the fp32 gradient partition live in host memory; ZeRO-3 offload
    (Rajbhandari et al. 2021, "ZeRO-Infinity") moves the weights there too.
    FSDP's CPU offload (``CPUOffload(offload_params=True)``, FSDP2 ``CPUOffloadPolicy``)
    keeps the parameter shards and their gradient shards (in the parameters' dtype)
    in host RAM and steps the optimizer there.

    Two FSDP mechanisms (the stack's knobs decide them; the composer passes them in):

    * ``frozen_gradient_bytes``: gradients FSDP allocates for frozen weights that
      share a flat parameter with trainable ones.  With ``use_orig_params=True``
      FSDP1 lets one unit mix frozen and trainable parameters, and the flat
      parameter then requires grad as a whole (torch/distributed/fsdp/_flat_param.py,
      ``_validate_tensors_to_flatten``: ``flat_param_requires_grad`` is the OR of its
      tensors); the PyTorch FSDP docs (Limitations) warn of "higher than expected
      gradient memory usage".  Sharded like the other gradients.
    * ``unsharded_gradients``: gradient accumulation without synchronisation keeps
      every gradient unsharded until the last micro-batch (FSDP1 ``no_sync()``: "FSDP
      will accumulate the full model gradients (instead of gradient shards) until the
      eventual sync"; FSDP2 ``set_requires_gradient_sync(False)`` likewise).
      Under offload those gradients stay on the device too (FSDP1 ``no_sync`` docs).
    """
    engine = strategy.engine
    n = max(1, world_size)
    w = trainable_params * weight_bytes_per_param(precision, engine) + frozen_bytes
    g = trainable_params * gradient_bytes_per_param(precision, engine)
    if engine is Engine.FSDP:
        g += frozen_gradient_bytes
    o = trainable_params * optimizer_bytes_per_param(
        optimizer, precision, engine, state_elems_per_param=state_elems_per_param
    )
    stage = strategy.zero_stage
    if stage >= ZeroStage.STAGE_1:
        o /= n
    unsharded = unsharded_gradients and engine is Engine.FSDP
    if stage >= ZeroStage.STAGE_2 and not unsharded:
        g /= n
    if stage >= ZeroStage.STAGE_3:
        w /= n
    elif engine is Engine.FSDP:
        # FSDP shards the fp32 parameters at rest in both modes; SHARD_GRAD_OP keeps the
        # 16-bit unsharded parameters from forward to backward (PyTorch FSDP docs,
        # ShardingStrategy.SHARD_GRAD_OP / FSDP2 reshard_after_forward=False).
        unsharded_copy = trainable_params * (2.0 if precision.mixed else weight_bytes_per_param(precision, engine))
        w = w / n + unsharded_copy
    host = 0.0
    if strategy.offloads_optimizer and engine is Engine.FSDP:
        # the gradient shards are copied to host RAM after each reduce-scatter, in the parameters' dtype
        # (FSDP1 FlatParamHandle._cpu_grad, FSDP2 FSDPParam offload_to_cpu); inside no_sync they stay here
        host += o + (g / n if unsharded else g)
        o = 0.0
        g = g if unsharded else 0.0
    elif strategy.offloads_optimizer:
        # fp32 gradient partition is kept on the host for the CPU optimizer step. Stage 2 copies each reduced
        # partition there during backward and keeps no gradient on the device; stage 1 does not partition
        # gradients, so every parameter keeps its full 16-bit .grad on the device until the accumulation boundary
        # reduces and removes it (DeepSpeed runtime/zero/stage_1_and_2.py, reduce_ready_partitions_and_remove_grads:
        # "if self.partition_gradients or self.is_gradient_accumulation_boundary()"; measured with DeepSpeed 0.19.8
        # over gloo in tests/run/test_backends.py::test_zero1_offload_keeps_full_gradients_until_the_boundary).
        host += o + trainable_params / n * 4.0
        o = 0.0
        g = g if stage < ZeroStage.STAGE_2 else 0.0
    if strategy.offloads_parameters:
        host += w
        w = 0.0
    until_backward_end = unsharded_copy if (engine is Engine.FSDP and stage < ZeroStage.STAGE_3) else 0.0
    return ModelStates(weights=w, gradients=g, optimizer=o, host=host, unsharded_until_backward_end=until_backward_end)


# ----------------------------------------------------------------------------- activations


def norm_is_fused(norm: str, *, compiled: bool, fused_kernels: FusedKernels) -> bool:
    """Whether the RMSNorms run as one kernel that keeps its 16-bit input and an rstd: compiled, or patched by Liger's /
    Unsloth's Triton RMSNorm (``fused_kernels``) — see :func:`norm_saved_bytes_per_token`."""
    return compiled or (fused_kernels is not FusedKernels.NONE and norm == "rmsnorm")


def norm_saved_bytes_per_token(hidden: int, norm: str, precision: Precision, *, compiled: bool = False,
                               weight_trainable: bool = True, fp32_weight: bool = False, python: bool = False) -> float:  # fmt: skip
    """Bytes a normalisation layer keeps for backward, per token.

    LayerNorm (fused ``aten.native_layer_norm``) keeps its input plus fp32 mean
    and rstd.  An eager RMSNorm up-casts a 16-bit input to fp32 whatever the
    precision mode — Hugging Face ``LlamaRMSNorm``
    (``hidden_states.to(torch.float32)``), torchtune ``RMSNorm``
    (``x.float()``), LitGPT ``RMSNorm`` (``x.float()``, since early 2024) — so
    with 16-bit compute (mixed or pure) it keeps the 4-byte copy, an fp32 rstd,
    and the down-cast result that the weight multiplies (2 bytes), the latter
    only when the weight trains: autograd saves a product's operand only for
    the other operand's gradient (PyTorch ``derivatives.yaml``, ``mul``), so a
    frozen LoRA base keeps the fp32 copy and rstd.  A norm that multiplies its weight in fp32 and casts the
    product down (``fp32_weight``: Gemma's ``output * (1.0 + self.weight.float())``, gpt-oss's and OLMo 2's
    ``(self.weight * hidden_states).to(input_dtype)``, LitGPT's ``(x_normed * weight.float()).to(dtype=dtype)`` for
    every model) keeps the fp32 normalised tensor instead (4 bytes) — measured
    per family with saved-tensor hooks on transformers' own norm classes (``tests/estimate/test_norm_saves.py``).  Compiled
    (``torch.compile``), the norm is one fused kernel that keeps its input and
    an fp32 rstd per token: the partitioner recomputes the up-cast in backward
    (min-cut rematerialisation of pointwise ops, functorch/AOTAutograd
    ``min_cut_rematerialization_partition``).
    Cohere's LayerNorm (``python``; transformers 5.25 ``CohereLayerNorm``) is fp32 Python arithmetic: the square keeps
    the centred input, the product with rstd a second centring and the rstd, the weight's product the normalised
    tensor — 4 bytes an element each, whatever the compute dtype: 12h + 4 with its weight training, 8h + 4 frozen
    (measured with saved-tensor hooks, ``tests/estimate/test_norm_saves.py``).
    """
    e = precision.compute_bytes
    if compiled:
        return hidden * e + 4
    if python:
        return hidden * (8 + (4 if weight_trainable else 0)) + 4
    if norm == "rmsnorm" and e == 2:
        return hidden * (4 + ((4 if fp32_weight else e) if weight_trainable else 0)) + 4
    return hidden * e + 8


@dataclass(frozen=True)
class LoraSaves:
    """What a LoRA job's frozen 16-bit block keeps around its adapted layers (memory.layer_activation_bytes).

    A linear whose weight does not train keeps nothing of its input (autograd saves a matmul's input only for its
    weight's gradient, ``derivatives.yaml`` ``mm``), so an input stays only for the ``lora_A`` that reads it — shared
    by the layers that read one input (q, k, v; gate, up) — or for a bitsandbytes 4-bit layer, whose ``MatMul4Bit``
    keeps its input whenever either operand needs a gradient (``base_keeps_inputs``).  PEFT's adapters are fp32
    beside a 16-bit base since PEFT 0.11 (``get_peft_model(autocast_adapter_dtype=True)``, PR #1706), and each
    adapted layer casts its input to the adapter's dtype (``_cast_input_dtype``) for ``lora_A``, which keeps that copy
    — its own, not shared: ``input_copy_bytes`` per element (4 in pure 16-bit precision; under autocast ``lora_A``
    keeps autocast's 16-bit cast of it instead; 0 where ``lora_A`` reads the shared input).  ``lora_B`` keeps
    ``lora_A``'s output (``adapter_out_bytes`` × rank).  Measured byte by byte against PEFT on a small Llama with
    saved-tensor hooks (``benchmarks/lora_saved_bytes.py``, ``tests/estimate/test_lora_saves.py``)."""

    qkv: int  # of q, k, v, how many are adapted
    o: bool
    gate_up: int  # of gate and up (a GELU MLP's up alone), how many
    down: bool
    rank: int
    input_copy_bytes: float = 0.0
    adapter_out_bytes: float = 2.0
    base_keeps_inputs: bool = False
    # lora_dropout > 0: each adapter drops its (cast) input into a copy of its own, which lora_A keeps, and the
    # dropout keeps its mask — a bool on CUDA (native_dropout; CPU's fallback keeps a noise tensor of the input's dtype)
    dropout: bool = False
    # per token: what a fused-QKV adapter keeps of its own output (LitGPT's LoRAQKVLinear keeps lora_B's output,
    # as wide as the adapted q / k / v together, for its zero_pad); 0 for one adapter per projection
    qkv_out_bytes: float = 0.0
    # multi-head latent attention's up-projections that are adapted (q_b_proj, kv_b_proj): the width of each one's
    # input, the normalised latent, which only its adapter reads (its q_a_proj and kv_a_proj_with_mqa read the block's
    # normalised input and count among ``qkv``)
    latent_widths: tuple[int, ...] = ()
    DROPOUT_MASK_BYTES: ClassVar[float] = 1.0

    def own_bytes(self, e: float) -> float:
        """Bytes per input element an adapted layer keeps of its own (its cast copy, its dropped copy and mask)."""
        c = self.input_copy_bytes
        return c + ((self.DROPOUT_MASK_BYTES + (0.0 if c else e)) if self.dropout else 0.0)

    def shares_input(self, n: int) -> bool:
        """Whether the 16-bit input a group of n adapted layers reads stays for them."""
        return self.base_keeps_inputs or (n > 0 and not self.input_copy_bytes and not self.dropout)

    @property
    def adapted(self) -> int:
        return self.qkv + int(self.o) + self.gate_up + int(self.down) + len(self.latent_widths)

    def latent_bytes(self, e: float) -> float:
        """Per token: what the adapters of the latent up-projections keep of their inputs (each its own reader); a
        4-bit up-projection keeps its 16-bit input anyway (counted with the latents)."""
        alone = self.shares_input(1) and not self.base_keeps_inputs
        return sum(((e if alone else 0.0) + self.own_bytes(e)) * w for w in self.latent_widths)


def layer_activation_bytes(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    q_dim: int,
    kv_dim: int,
    ffn_hidden: int,
    mlp: str,
    norm: str,
    precision: Precision,
    flash_attention: bool,
    dropout: bool = False,
    checkpointing: Checkpointing = Checkpointing.NONE,
    compiled: bool = False,
    autocast_softmax: bool = False,
    softcap: bool = False,
    sinks: bool = False,
    frozen_norms: bool = False,
    norm_fp32_weight: bool = False,
    norm_python: bool = False,
    shared_norm: bool = False,
    attention_output_copy: bool = False,
    fused_kernels: FusedKernels = FusedKernels.NONE,
    down_proj_keeps_input: bool = True,
    gelu_python: bool = False,
    lora: LoraSaves | None = None,
    split: list[tuple[float, float]] | None = None,
    v_dim: int | None = None,
    out_dim: int | None = None,
    copy_dim: int | None = None,
) -> float:
    """Activation bytes one transformer block keeps for backward (Korthikanti et al. 2022, eq. 1, term by term).

    ``checkpointing`` selective here is Korthikanti's (Sec. 4.2: the attention core recomputed); the PyTorch
    policies keep :func:`selective_saved_bytes_per_token` instead.

    ``split``: when given, (replicated, tensor-parallel sharded) bytes are appended to it — the parts a
    tensor-parallel layout keeps whole and divides (estimate/parallel.py).

    Terms per token (e = bytes of the compute dtype):
    two norms; the QKV input (e·h); Q, K, V (e·(q + 2kv)); the attention
    output that feeds the output projection (e·q); the MLP input (e·h) and
    its intermediates: GELU keeps its input and output (2e·f), SwiGLU keeps the
    gate, SiLU output, up projection and their product (4e·f).  Without a fused
    kernel, attention keeps the softmax output (e·a·s per token), plus with
    dropout its mask (a·s) and output (e·a·s); a fused kernel keeps an fp32
    log-sum-exp per head instead.  Dropout after attention and MLP keeps a
    1-byte mask each.  For a GPT-3 block in fp16 with dropout this reproduces
    Korthikanti's 34·sbh + 5·a·s²·b.  Compiled, pointwise ops are recomputed in
    backward rather than saved (min-cut rematerialisation): a SwiGLU keeps only
    the gate and up projections (2e·f), a GELU MLP only its input (e·f).

    ``autocast_softmax``: eager attention under autocast keeps the softmax
    output in fp32 (``torch.amp`` docs: softmax is among the CUDA ops that
    "autocast to float32") plus the 16-bit copy that the PV matmul casts and
    keeps — of the dropout output, with dropout — 4 + e (+1 for the mask)
    bytes per score instead of e (+1 + e); Megatron's fused softmax (the
    Korthikanti count) keeps 16 bits.
    ``softcap``: eager attention with logit soft-capping (Gemma 2: ``cap · tanh(scores / cap)``, transformers'
    ``eager_attention_forward`` and LitGPT's ``do_softcapping``) also keeps the ``tanh`` output for its backward
    (``derivatives.yaml``: ``tanh`` saves its result; dividing and multiplying by a scalar save nothing): e more
    bytes per score.
    ``sinks``: gpt-oss's eager attention with a learned sink logit per head (transformers 5.25
    ``modeling_gpt_oss.eager_attention_forward``: the sink column concatenated to the scores, the row maximum
    subtracted, ``softmax(..., dtype=combined_logits.dtype)``, the sink column dropped, ``.to(value_states.dtype)``).
    Its softmax runs in the logits' own dtype, not an explicit fp32: the 16-bit scores promoted by the additive mask
    and the sinks, which are in the weights' dtype — fp32 under autocast over fp32 weights (``autocast_softmax``),
    else 16-bit.  It keeps the softmax output over s + 1 columns, the 16-bit copy the PV matmul keeps only when that
    output is fp32 (``.to`` of a 16-bit tensor returns the same storage), and the ``int64`` indices of the row
    maximum (``max.dim`` saves them for backward): 8 bytes a head.
    ``frozen_norms``: the norms' weights do not train (LoRA), see :func:`norm_saved_bytes_per_token`, as for
    ``norm_fp32_weight`` (Gemma, gpt-oss, OLMo 2: the weight multiplies the fp32 normalised tensor) and ``norm_python``
    (Cohere's fp32 Python LayerNorm).
    ``shared_norm``: one norm a block whose output attention and the MLP both read (Cohere's parallel block,
    ``ModelArch.block_norms`` 1): one norm's saves, and the 16-bit norm output kept once for the q/k/v and gate/up
    projections (one storage) — the MLP's copy is counted only where the QKV side keeps none (LoRA without q/k/v
    adapters).
    ``fused_kernels``: Triton kernels in place of the eager norms and SwiGLU.  Liger Kernel's RMSNorm
    (``LigerRMSNormFunction``: ``ctx.save_for_backward(X, W, RSTD)``) and Unsloth's (``Fast_RMS_Layernorm``: X and
    the fp32 inverse RMS) keep the 16-bit input and an fp32 statistic per token, as a compiled norm does; Liger's
    SwiGLU (``LigerSiLUMulFunction``: ``ctx.save_for_backward(a, b)``) keeps the gate and up projections and
    recomputes SiLU in backward, and ``down_proj`` keeps the product only to form its weight's (or its LoRA
    adapter's) gradient (``down_proj_keeps_input``); Unsloth's LoRA MLP (``LoRA_MLP`` in
    ``unsloth/kernels/fast_lora.py``) keeps the gate and up outputs and recomputes the product: 2e·f.
    ``gelu_python``: transformers' ``NewGELUActivation`` (``gelu_new``: GPT-2, GPT-J) is the Python expression
    ``0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3))))``; autograd keeps ``x`` (for ``pow``), the ``tanh``
    output, ``0.5 * x`` and ``1 + tanh`` (both operands of the last product, ``derivatives.yaml`` ``mul``), and the
    output projection keeps the result: 5e·f where a fused GELU keeps 2e·f.  Under autocast ``pow`` is one of the CUDA
    ops that autocast to float32 (``torch.amp`` docs), so it keeps an fp32 copy of ``x`` and everything after it up to
    the last product is fp32 by type promotion: fp32 ``x``, ``tanh`` output and ``1 + tanh`` (4 bytes each),
    ``0.5 * x`` and the projection's 16-bit cast of the result (e each) — 12 + 2e bytes per element.
    ``lora``: a LoRA job's frozen block (:class:`LoraSaves`): the QKV and MLP inputs, the down projection's input and
    the output projection's copy stay only for an adapted layer (or a 4-bit one) that reads them, each fp32 adapter
    keeps its own copy of its input, and a frozen SwiGLU keeps 3e·f (SiLU's input, its output and up's, for ``mul``),
    a GELU e·f.  Not with fused kernels, compile or a Python GELU (their own counts above).
    ``v_dim``, ``out_dim`` and ``copy_dim``: the widths of the V the attention keeps, of its output and of the
    output projection's copy of it where they differ from K's and Q's (multi-head latent attention, whose V is a view
    of ``kv_b_proj``'s output and whose output is every head's ``v_head_dim``: ``transformer._attention_widths``); by
    default ``kv_dim``, ``q_dim`` and ``out_dim``.
    ``attention_output_copy``: PyTorch's fused SDPA kernel keeps its own output
    ``(B, H, S, D)`` for backward, and the output projection keeps the
    contiguous ``(B, S, H·D)`` copy that ``transpose(1, 2).contiguous()`` (or
    ``reshape``) makes of it — a second e·q.  The caller says whether the
    projection keeps its input (autograd saves a matmul's input only for its
    weight's gradient: PyTorch ``derivatives.yaml``, ``mm``).
    """
    e = precision.compute_bytes
    tokens = seq_len * micro_batch
    fused = fused_kernels is not FusedKernels.NONE
    norms = (1 if shared_norm else 2) * norm_saved_bytes_per_token(
        hidden, norm, precision, compiled=norm_is_fused(norm, compiled=compiled, fused_kernels=fused_kernels),
        weight_trainable=not frozen_norms, fp32_weight=norm_fp32_weight, python=norm_python)
    v_dim = kv_dim if v_dim is None else v_dim
    out_dim = q_dim if out_dim is None else out_dim
    copy_dim = out_dim if copy_dim is None else copy_dim
    attn_linear = e * hidden + e * (q_dim + kv_dim + v_dim) + e * out_dim
    fp32_softmax = autocast_softmax and e == 2
    if flash_attention:
        core = 4.0 * heads  # fp32 log-sum-exp per head per token
        if attention_output_copy:
            attn_linear += e * copy_dim
    else:
        core = (4.0 + e if fp32_softmax else e) * heads * seq_len
        if sinks:  # the softmax covers the sink column too; the max's indices
            core += (4.0 if fp32_softmax else e) * heads + 8.0 * heads
        if softcap:  # the tanh output of the soft-cap
            core += e * heads * seq_len
        if dropout:  # the mask, and the dropout output (under autocast its 16-bit cast replaces the one above)
            core += heads * seq_len * (1 + (0 if fp32_softmax else e))
    intermediates = (2 if mlp == "swiglu" else 1) if compiled else (4 if mlp == "swiglu" else 2)
    if gelu_python and mlp == "gelu" and not compiled:
        intermediates = (12 + 2 * e) / e if precision.mixed else 5
    if fused and mlp == "swiglu" and not compiled:
        keeps_product = fused_kernels is FusedKernels.LIGER and down_proj_keeps_input
        intermediates = 3 if keeps_product else 2
    mlp_bytes = e * hidden + intermediates * e * ffn_hidden
    qkv_input = mlp_input = e * hidden
    lora_counts = lora is not None and not compiled and not fused and not gelu_python
    if lora_counts:
        own = lora.own_bytes(e)
        qkv_input = (e * hidden if lora.shares_input(lora.qkv) else 0.0) + lora.qkv * own * hidden
        mlp_input = (e * hidden if lora.shares_input(lora.gate_up) else 0.0) + lora.gate_up * own * hidden
        attn_linear += qkv_input - e * hidden + lora.latent_bytes(e)
        if lora.o and own:  # o_proj's lora_A keeps its own copy; the 16-bit one only a 4-bit o_proj keeps
            attn_linear += own * copy_dim - (e * copy_dim if attention_output_copy and not lora.base_keeps_inputs else 0.0)
        product = (e if lora.shares_input(int(lora.down)) else 0.0) + (own if lora.down else 0.0)
        mlp_bytes = mlp_input + ((3 if mlp == "swiglu" else 1) * e + product) * ffn_hidden
        mlp_bytes += lora.adapted * lora.rank * lora.adapter_out_bytes + lora.qkv_out_bytes
    if shared_norm:  # the MLP's 16-bit input is the QKV's, kept once
        shared = e * hidden if (not lora_counts
                                or (lora.shares_input(lora.qkv) and lora.shares_input(lora.gate_up))) else 0.0
        mlp_input -= shared
        mlp_bytes -= shared
    masks = 2.0 * hidden if dropout else 0.0  # 1-byte masks after attention and after the MLP
    if checkpointing is Checkpointing.SELECTIVE:
        core = 4.0 * heads if flash_attention else 0.0  # attention core recomputed (Korthikanti Sec. 4.2)
    # Outside the tensor-parallel regions (Korthikanti et al. 2022, Sec. 4.2.1): the norms, the inputs of the QKV
    # and first MLP projections (the norms' outputs, full width h) and the dropout masks — 10·sbh for a GPT block,
    # replicated on every tensor-parallel rank unless sequence parallelism shards them; the rest lies inside the
    # column/row-parallel pairs and divides by the tensor-parallel degree.
    replicated = norms + qkv_input + mlp_input + masks
    total = norms + attn_linear + core + mlp_bytes + masks
    if split is not None:
        split.append((tokens * replicated, tokens * (total - replicated)))
    return tokens * total


def selective_saved_bytes_per_token(*, linears: list[tuple[int, bool]], hidden: int, heads: int, q_dim: int,
                                    seq_len: int, e: float, flash_attention: bool,
                                    selective: SelectiveRecompute) -> tuple[float, float]:  # fmt: skip
    """(replicated, tensor-parallel sharded) bytes per token a block keeps under PyTorch selective checkpointing
    (``torch.utils.checkpoint.create_selective_checkpoint_contexts``: ops the policy marks MUST_SAVE keep their
    outputs, everything else is recomputed in backward from the block's input, which the checkpoint keeps).

    ``linears``: the block's matmuls in the order they run, as (output width, replicated) — replicated for the
    output and down projections, full width after tensor parallelism's reduction (a LoRA adapter's two matmuls follow
    its layer's).  ``matmul-outputs`` (trainplan run, estimate/trace/checkpointing.py) keeps every output;
    ``alternate-matmuls`` (torchtitan's op mode: "Save output of all ops in save list, except every second mm", the
    count restarting in each block) keeps the 1st, 3rd, 5th ….  Both keep the attention kernel's output and its fp32
    log-sum-exp per head (without a fused kernel: the scores matmul's output, e·a·s, and the value matmul's, e·q)."""
    kept = linears if selective is SelectiveRecompute.MATMUL_OUTPUTS else linears[0::2]
    attention = e * q_dim + (4.0 * heads if flash_attention else e * heads * seq_len)
    replicated = e * hidden + sum(e * w for w, full in kept if full)
    return replicated, attention + sum(e * w for w, full in kept if not full)


def checkpointed_activation_bytes(
    *, layers: int, layer_bytes: float, seq_len: int, micro_batch: int, hidden: int, precision: Precision,
    checkpointed: int | None = None, uncheckpointed_bytes: float = 0.0,
) -> float:
    """Full activation checkpointing: each block's input is kept, one block is recomputed at a time (Chen et al. 2016).

    On a share of the blocks only (``checkpointed`` of ``layers``; knobs.checkpoint_fraction): those keep their input,
    the others all they save (``uncheckpointed_bytes``: the total of every block kept whole, of which they take their
    share), and one block is rebuilt while its backward runs."""
    ckpt = layers if checkpointed is None else checkpointed
    kept_whole = uncheckpointed_bytes * (layers - ckpt) / layers if layers else 0.0
    return ckpt * seq_len * micro_batch * hidden * precision.compute_bytes + kept_whole + (layer_bytes if ckpt else 0.0)


def checkpointed_blocks(blocks: int, fraction: float) -> int:
    """Blocks that full checkpointing wraps when it wraps ``fraction`` of them: ⌊blocks × fraction⌋, spread as
    :func:`is_checkpointed_block` picks them."""
    return math.floor(blocks * fraction + 1e-9)


def is_checkpointed_block(index: int, fraction: float) -> bool:
    """Whether block ``index`` (from 0) is checkpointed when ``fraction`` of the blocks are: the blocks where
    ⌊(i + 1)·f⌋ steps up, spread evenly; for f = 1/N every N-th block counting from 1, as torchtitan's layer-level
    selective checkpointing wraps them (``_apply_layer_sac``: ``_layer_sac_count % ac_freq == 0``)."""
    return math.floor((index + 1) * fraction + 1e-9) > math.floor(index * fraction + 1e-9)


def logits_bytes(*, seq_len: int, micro_batch: int, vocab: int, precision: Precision, hidden: int = 0,
                 loss: LossImpl = LossImpl.FULL, chunks: int = 1, compiled: bool = False,
                 upcast: bool = True) -> float:  # fmt: skip
    """Output logits and the loss around the start of backward, by how the loss is computed.

    * ``full`` (Hugging Face ``ForCausalLMLoss``, torchtune's ``CrossEntropyLoss``
      over ``output(h).float()``, plain ``F.cross_entropy`` over ``logits.float()``):
      the fp32 log-softmax output is saved, and at the start of backward
      ``nll_loss_backward`` writes a dense fp32 gradient that
      ``_log_softmax_backward_data(grad_output, output, …)`` turns into a third
      fp32 tensor while both are alive (PyTorch ``derivatives.yaml``): 4 + 4 + 4
      bytes per logit, whatever the compute dtype (by then the 16-bit logits
      and their fp32 up-cast are no longer referenced: Hugging Face Trainer and
      torchtune drop them before backward; at the end of the forward pass the
      16-bit logits, the up-cast and the saves are 2 + 4 + 4 < 12).
    * ``chunked`` (torchtune ``CEWithChunkedOutputLoss``, LitGPT
      ``chunked_cross_entropy``): the up-cast exists for one chunk at a time;
      each chunk's log-softmax is still saved: 2 + 4 + 4/chunks (fp32: 4 + 4 + 4/chunks).
    * ``fused`` (flash-attn ``CrossEntropyLoss`` in llm-foundry, Liger's cross
      entropy): one kernel over the 16-bit logits writes the gradient in place;
      only the logits stay (plus an fp32 log-sum-exp per token).
    * ``fused-linear`` (Liger ``FusedLinearCrossEntropy``): projection and loss
      run chunk by chunk and the gradient of the hidden states is formed in the
      forward pass; no logits stay, one hidden-state gradient does.
    * compiled (``torch.compile`` over the loss, as torchtune compiles its
      chunked loss): the up-cast, log-softmax and NLL fuse into one kernel that
      keeps the 16-bit logits and an fp32 log-sum-exp per token, recomputing the
      softmax in backward (min-cut rematerialisation); an fp32 chunk exists only
      transiently: e + 4/chunks per logit.
    * no up-cast (``upcast=False``: LitGPT's ``chunked_cross_entropy`` and Lightning's demo loss call
      ``cross_entropy`` / ``nll_loss`` on the logits as they are) in pure 16-bit precision, where no autocast
      turns the loss to fp32: every tensor of the loss has the logits' dtype.  Full: the saved log-softmax
      output, nll's gradient and the logits' gradient, 3e per logit (the caller has returned the logits).
      Chunked (LitGPT keeps its list of logit chunks through backward): the chunks, their saved log-softmax
      outputs — replaced one by one by the chunks' gradients as backward runs — and one chunk's two
      gradients: e·(2 + 2/chunks).  Under autocast (mixed precision) ``cross_entropy`` runs in fp32 either way
      (``torch.amp`` docs, "CUDA Ops that can autocast to float32"), so the flag changes nothing there.
    """
    tokens = seq_len * micro_batch
    e = precision.compute_bytes
    if not upcast and e == 2 and not precision.mixed and not compiled:
        if loss is LossImpl.FULL:
            return tokens * vocab * 3.0 * e
        if loss is LossImpl.CHUNKED:
            return tokens * vocab * e * (2 + 2 / max(1, chunks))
    if compiled and loss in (LossImpl.FULL, LossImpl.CHUNKED):
        return tokens * (vocab * (e + 4 / max(1, chunks)) + 4)
    if loss is LossImpl.FUSED_LINEAR:
        return tokens * (hidden * e + 4)
    if loss is LossImpl.FUSED:
        return tokens * (vocab * e + 4)
    if loss is LossImpl.CHUNKED:
        return tokens * vocab * (e + 4 + 4 / max(1, chunks))
    return tokens * vocab * 12.0


def dequantized_weight_bytes(largest_linear_params: float) -> float:
    """bitsandbytes 4-bit linear layers dequantise their weight to 16 bits for each matmul
    (``bnb.matmul_4bit`` → ``dequantize_4bit`` on multi-token inputs): one 16-bit copy of the largest
    quantised matrix is live at a time."""
    return 2.0 * largest_linear_params


# ----------------------------------------------------------------------------- temporaries


def frozen_weight_cast_bytes(frozen_matmul_params: float, *, blocks: int, head_params: float,
                             checkpointing: Checkpointing) -> float:
    """16-bit casts of fp32 frozen weights that matmuls keep for backward under autocast.

    Autocast caches the cast of a weight only when it is a leaf that requires grad
    (``aten/src/ATen/autocast_mode.cpp``, ``cached_cast``: ``arg.requires_grad() && arg.is_leaf()``), so a
    frozen fp32 weight (a LoRA base under a ``*-mixed`` precision plugin) is cast again at each use; the
    matmul keeps that 16-bit copy to form its input's gradient (PyTorch ``derivatives.yaml``, ``mm``: the
    input's gradient is ``grad.mm(mat2.t())``).  Every block's copies live from its forward to its backward
    — 2 bytes per frozen matmul weight, plus the output head's; with full checkpointing only the block being
    recomputed holds them.  Measured with saved-tensor hooks under CPU autocast in
    ``tests/estimate/test_activations.py``.
    """
    block = frozen_matmul_params / max(1, blocks) if checkpointing is Checkpointing.FULL else frozen_matmul_params
    return 2.0 * (block + head_params)


def autocast_weight_copy_bytes(matmul_params: float, precision: Precision, strategy: Strategy, trainable_fp32: bool) -> float:
    """Low-precision copies of fp32 weights that autocast keeps alive from forward to backward.

    Only PyTorch AMP over fp32 weights (single / DDP, mixed precision) makes
    them; DeepSpeed and FSDP already hold 16-bit working weights.
    """
    if strategy.engine is Engine.TORCH and precision.mixed and trainable_fp32:
        return 2.0 * matmul_params
    return 0.0


def sharding_buffer_bytes(strategy: Strategy, *, largest_block_params: float, world_size: int,
                          compute_bytes: float = 2.0, trainable_fraction: float = 1.0,
                          reduce_bytes: float | None = None, xla: bool = False) -> float:  # fmt: skip
    """Communication buffers and gathered weights of a sharded strategy, allocated at the step's peak.

    DeepSpeed ZeRO-1/2: one reduce bucket and one all-gather bucket (sizes in
    the config trainplan renders, 16-bit elements).  ZeRO-3: the prefetch bucket, the live
    gathered parameters (at most two blocks, capped by
    ``stage3_max_live_parameters``) and the reduce bucket.

    FSDP, as FSDP2 (``fully_shard``) holds them — torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py and
    _fsdp_collectives.py, torch 2.13 — with B the largest block's parameters in the dtype it computes in
    (``compute_bytes``: the MixedPrecisionPolicy ``param_dtype``, else the parameters' own):

    * forward (implicit prefetching): the running block's flat all-gather output, kept in ``all_gather_state``
      until the next block's copy-out; the next block's, prefetched; the running block's unsharded parameters
      copied out of it — 3 B;
    * backward: the running block's unsharded parameters, the next block's prefetched all-gather output, the
      running block's unsharded gradients (its trainable part, in ``compute_bytes``) and the previous block's
      reduce-scatter input (``reduce_bytes``: the policy's ``reduce_dtype``), which ``reduce_scatter_states`` holds
      until this block's own reduce (``reduce_scatter_max_input_buffers`` = 1) — 2 B + trainable × (2 + reduce).

    The larger of the two is what is allocated; the forward side of the step's peak carries it.  SHARD_GRAD_OP
    keeps its parameters unsharded in the model states, so only the gradient side is here.  FSDP's CPU offload
    gathers the same units after copying each shard to the device (FSDP1 ``FlatParamHandle.pre_unshard``,
    FSDP2 ``FSDPParam`` offload).  On a TPU (``xla``) FSDP is torch_xla's, whose buffers XLA's compiler assigns: the
    gathered block, the prefetched one and one block's gradients, 3 B, as trainplan counted FSDP before FSDP2's
    lifetimes were read.
    """
    if world_size <= 1 and not strategy.offloads_optimizer:
        return 0.0
    if strategy.engine is Engine.DEEPSPEED:
        if strategy.zero_stage >= ZeroStage.STAGE_3:
            live = min(DEEPSPEED_MAX_LIVE_PARAMS, 2 * largest_block_params)
            return 2.0 * (DEEPSPEED_PREFETCH_BUCKET_ELEMS + live + DEEPSPEED_REDUCE_BUCKET_ELEMS)
        return 2.0 * (DEEPSPEED_REDUCE_BUCKET_ELEMS + DEEPSPEED_ALLGATHER_BUCKET_ELEMS)
    if strategy.engine is Engine.FSDP and xla:
        return compute_bytes * largest_block_params * (3 if strategy.shards_parameters else 1)
    if strategy.engine is Engine.FSDP:
        _, gradients, full_shard = _fsdp_block_bytes(largest_block_params, compute_bytes, trainable_fraction, reduce_bytes)
        return full_shard if strategy.shards_parameters else gradients
    return 0.0


def _fsdp_block_bytes(block_params: float, compute_bytes: float, trainable_fraction: float,
                      reduce_bytes: float | None) -> tuple[float, float, float]:  # fmt: skip
    """One block in the dtype it computes in; its gradient side in backward (its trainable part's unsharded gradients
    in ``compute_bytes`` and the previous block's held reduce-scatter input in ``reduce_bytes``); and what full-shard
    FSDP2 holds allocated at the larger of forward (3 blocks) and backward (2 blocks + the gradient side)."""
    reduce = compute_bytes if reduce_bytes is None else reduce_bytes
    block = compute_bytes * block_params
    gradients = block_params * trainable_fraction * (compute_bytes + reduce)
    return block, gradients, max(3 * block, 2 * block + gradients)


def fsdp_stream_pool_bytes(strategy: Strategy, *, largest_block_params: float, world_size: int,
                           compute_bytes: float = 2.0, trainable_fraction: float = 1.0,
                           reduce_bytes: float | None = None) -> tuple[float, float]:  # fmt: skip
    """FSDP2's all-gather stream pool: (its size, the part of it idle at the forward-side peak).

    The flat all-gather outputs are allocated on FSDP2's all-gather copy-in stream (``foreach_all_gather``
    allocates them under ``all_gather_copy_in_stream``), and PyTorch's CUDA caching allocator keeps a freed block
    for the stream that allocated it (c10/cuda/CUDACachingAllocator.cpp: blocks are pooled by stream; CUDA
    semantics docs, "Memory management"), so the default stream never reuses them.  Forward leaves that pool
    holding two blocks' outputs, 2 B.  Reserved buffers are then the default stream's largest need (the running
    block's parameters, plus in backward its gradients and the held reduce-scatter input) plus that pool; what is
    idle is that less the buffers :func:`sharding_buffer_bytes` counts as allocated — at the optimizer step, the
    whole pool.  A CUDA device only: CPUs and TPUs have no such pools."""
    if strategy.engine is not Engine.FSDP or not strategy.shards_parameters:
        return 0.0, 0.0
    if world_size <= 1 and not strategy.offloads_optimizer:
        return 0.0, 0.0
    block, gradients, allocated = _fsdp_block_bytes(largest_block_params, compute_bytes, trainable_fraction, reduce_bytes)
    pool = 2 * block
    return pool, max(0.0, block + gradients + pool - allocated)


def optimizer_foreach_temporary_bytes(trainable_params: float, optimizer: Optimizer,
                                      precision: Precision = Precision.BF16) -> float:  # fmt: skip
    """Temporaries of a multi-tensor (foreach) optimizer step in plain PyTorch: one buffer per parameter, in the
    optimizer state's dtype.

    ``torch.optim.AdamW`` (foreach, the CUDA default) computes the square root
    of the variance for all parameters at once (``_multi_tensor_adamw``:
    ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``, tensors of the
    state's dtype — fp32 beside fp32 weights, bf16 in pure bf16, where the states
    follow the weights); Lion its update direction.
    Sharding divides them with the optimizer state; DeepSpeed's fused Adam and
    CPU optimizers make none (the composer applies both rules).
    """
    if optimizer in (Optimizer.ADAMW, Optimizer.LION):
        return (2.0 if precision is Precision.BF16_PURE else 4.0) * trainable_params
    return 0.0


def muon_temporary_bytes(matrices: list[tuple[int, int, int]], adamw_params: float, precision: Precision, *,
                         foreach: bool) -> float:  # fmt: skip
    """Temporaries of a Muon step (:class:`~trainplan.estimate.trace.optimizers.MuonWithAdamW`): torch.optim.Muon
    steps one matrix at a time, then AdamW steps the rest, so the peak is the larger of the two.

    Per r × c matrix (m = min, n = max), torch/optim/_muon.py keeps at once, from the second Newton-Schulz step on:
    the Nesterov update ``grad.lerp(buf)`` in the gradient's dtype (e·mn, still referenced by the caller), the current
    and the next bf16 iterate (4mn) and the Gram matrix beside its polynomial (4m²); AdamW's foreach step keeps one
    state-sized buffer per parameter (:func:`optimizer_foreach_temporary_bytes`).  tests/estimate/test_muon.py
    checks this against the traced step."""
    e = 2.0 if precision is Precision.BF16_PURE else 4.0
    muon = 0.0
    for _, r, c in matrices:
        m, n = min(r, c), max(r, c)
        muon = max(muon, e * m * n + 4.0 * m * n + 4.0 * m * m)
    adamw = optimizer_foreach_temporary_bytes(adamw_params, Optimizer.ADAMW, precision) if foreach else 0.0
    return max(muon, adamw)


def ddp_bucket_bytes(strategy: Strategy, gradient_bytes: float, world_size: int) -> float:
    """DistributedDataParallel's all-reduce buckets: flat buffers the size of all gradients, allocated at
    construction and kept, since by default gradients are copies of the buckets (PyTorch DDP docs,
    ``gradient_as_bucket_view=False``: "setting it to True saves memory equal to the total gradients size")."""
    return gradient_bytes if strategy is Strategy.DDP and world_size > 1 else 0.0


def framework_overhead_bytes(*, cuda_context_gib: float, comm_buffers_gib: float, world_size: int) -> float:
    """CUDA context + cuBLAS workspace, plus NCCL buffers when there are peers."""
    return (cuda_context_gib + (comm_buffers_gib if world_size > 1 else 0.0)) * GIB


# ----------------------------------------------------------------------------- the step


def step_peak(
    *,
    states: ModelStates,
    activations: float,
    forward_temporaries: float,
    optimizer_temporaries: float,
    fixed_overhead: float,
    fragmentation: float,
    grads_live_in_forward: bool,
    expandable_fraction: float = 0.0,
    stream_pool: tuple[float, float] = (0.0, 0.0),
) -> MemoryBreakdown:
    """Peak of one step: the largest of the moments that can hold it.

    * End of forward / start of backward: weights + optimizer state +
      activations + forward temporaries (+ gradients when they outlive the
      step: gradient accumulation, or engines with persistent gradient buffers).
    * Optimizer step: weights + gradients + optimizer state + its temporaries.
    * End of backward, only where weights are dropped before the optimizer step
      (``states.unsharded_until_backward_end``: SHARD_GRAD_OP's unsharded parameters, resharded
      after backward): all weights + gradients + optimizer state, activations freed.

    During backward, gradients are allocated as activations are freed, so the
    sum of both is never reached.  The caching allocator reserves more than it
    hands out: a fraction of the peak (``fragmentation``), or with expandable
    segments ``expandable_fraction`` (both from estimate/allocator.py's simulation);
    the CUDA context and communicator buffers
    (``fixed_overhead``) lie outside it.  ``stream_pool``: another CUDA stream's cached blocks, (the pool, its
    part idle at the forward-side peak) (:func:`fsdp_stream_pool_bytes`) — at the optimizer step all of it is idle;
    reserved with or without expandable segments (each stream keeps its own).  The peak is reserved + context.
    """
    g_fwd = states.gradients if grads_live_in_forward else 0.0
    w_opt = states.weights - states.unsharded_until_backward_end
    fwd = states.weights + states.optimizer + g_fwd + activations + forward_temporaries
    opt = w_opt + states.optimizer + states.gradients + optimizer_temporaries
    bwd = states.weights + states.optimizer + states.gradients if states.unsharded_until_backward_end else 0.0
    weights = states.weights
    if fwd >= opt and fwd >= bwd:
        phase, grads, acts, temps = "forward", g_fwd, activations, forward_temporaries
    elif opt >= bwd:
        phase, grads, acts, temps, weights = "optimizer", states.gradients, 0.0, optimizer_temporaries, w_opt
    else:
        phase, grads, acts, temps = "backward", states.gradients, 0.0, 0.0
    top = max(fwd, opt, bwd)
    pool = stream_pool[1] if phase == "forward" else stream_pool[0]
    reserve = fragmentation * top + pool
    overhead = temps + fixed_overhead + reserve
    return MemoryBreakdown(
        weights=weights,
        gradients=grads,
        optimizer=states.optimizer,
        activations=acts,
        overhead=overhead,
        host=states.host,
        phase=phase,
        context=fixed_overhead,
        fragmentation=reserve,
        expandable_slack=min(reserve, expandable_fraction * top + pool),
        stream_pool=pool,
    )
