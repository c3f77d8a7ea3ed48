"""Floating-point work of one training step.

* Matmul FLOPs: 2 per weight per token forward, twice that backward (gradient
  of the input and of the weight) — Kaplan et al. 2020, "Scaling Laws", Sec. 2.1
  (C ≈ 6N per token).
* Attention scores and weighted values: 4·s·d_attn per token per layer forward
  (QKᵀ and AV, 2 FLOPs per multiply-add, no causal discount) — Chowdhery et al.
  2022, "PaLM", App. B (12·L·H·Q·T per token for forward + backward);
  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", eq. 3.
* Frozen weights (LoRA) need only the input gradient: backward is 1× forward
  for them (Hu et al. 2021, "LoRA", Sec. 4.2: no gradients for frozen weights).
* Recomputation: full checkpointing re-runs each block's forward once;
  selective re-runs the attention core (Korthikanti et al. 2022, Sec. 5).
* A fused (FlashAttention) kernel recomputes the scores S = QKᵀ and P in its
  backward instead of storing them: its backward executes 2.5× its forward
  FLOPs (5 matmuls against 2; Dao et al. 2022, "FlashAttention", Sec. 3.1 and
  Alg. 4; the FLOP count of Dao-AILab/flash-attention
  benchmarks/benchmark_flash_attention.py, ``flops()``: bwd = 2.5 × fwd).
* Memory-bound work (``KernelSplit``): norms, residual adds, the MLP's
  activation and rotary embeddings do almost no FLOPs but move whole
  activations through HBM; their time is bytes / bandwidth, not FLOPs / peak
  (Ivanov et al. 2021, "Data Movement Is All You Need", MLSys: these operators
  take a large share of BERT training time at a tiny share of the FLOPs;
  Williams et al. 2009, "Roofline").
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.estimate.architecture import attention_inner_dim, kv_inner_dim
from trainplan.model import ModelArch
from trainplan.spec import Checkpointing, Precision


@dataclass(frozen=True)
class KernelSplit:
    """The parts of one micro-batch that do not run at matmul speed (analytic transformer profiles).

    The attention FLOPs are included in ``StepFlops``' forward / backward / recompute; the bytes are extra.
    """

    attention_forward: float  # FLOPs of the fused attention kernel in forward
    attention_backward: float  # in backward, with the kernel's own recomputation and any checkpoint recompute
    bytes_forward: float  # HBM bytes moved by memory-bound ops (norms, residual adds, MLP activation, rotary)
    bytes_backward: float  # in backward, with checkpoint recompute
    # precision fp8: FLOPs of the GEMMs that run on the FP8 tensor cores (in forward / backward, recompute included);
    # the casts that feed them are in the bytes above
    fp8_forward: float = 0.0
    fp8_backward: float = 0.0
    # autocast's weight casts (transformer.autocast_cast_bytes), full-checkpointing recompute included: separate kernels
    # in eager PyTorch on a GPU; XLA (TPU) fuses them into their consumers
    amp_forward: float = 0.0
    amp_backward: float = 0.0
    # matmuls of fp32 operands outside autocast (DeepSeek Sparse Attention's indexer scores under bf16-pure): the plain
    # fp32 units, in forward / in backward (a full-checkpointing recompute); in the FLOPs above, not in the bytes
    fp32_forward: float = 0.0
    fp32_backward: float = 0.0


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one micro-batch on one device."""

    forward: float  # executed
    backward: float  # executed
    recompute: float
    causal_skipped: float = 0.0  # attention FLOPs (forward + backward) a fused causal kernel does not execute
    kernel_recompute: float = 0.0  # FLOPs a fused attention kernel recomputes in its backward (in `backward`)
    split: KernelSplit | None = None  # what runs at attention-kernel or memory speed; None: all at one efficiency

    @property
    def model(self) -> float:
        """FLOPs that count toward MFU: the conventional count (full attention, no recomputation)."""
        return self.forward + self.backward - self.kernel_recompute + self.causal_skipped

    @property
    def hardware(self) -> float:
        """FLOPs the device executes (recomputation included)."""
        return self.forward + self.backward + self.recompute


def matmul_flops_forward(matmul_params: float, tokens: float) -> float:
    """2 FLOPs per weight per token (one multiply-add)."""
    return 2.0 * matmul_params * tokens


def attention_flops_forward(*, layers: int, seq_len: int, attn_dim: int, tokens: float) -> float:
    """QKᵀ and A·V: 2 × 2·s·d_attn per token per layer (PaLM App. B)."""
    return 4.0 * layers * seq_len * attn_dim * tokens


# Backward of a unary pointwise op reads its saved input and the output gradient and writes the input
# gradient: 3 activation-sized tensors against forward's 2 (read input, write output).
MEMORY_BOUND_BACKWARD_RATIO = 1.5
# FlashAttention's backward: dV = PᵀdO, dP = dO·Vᵀ, dS → dQ = dS·K, dK = dSᵀQ, plus S = QKᵀ recomputed:
# 5 matmuls of the forward's 2 (Dao et al. 2022, Alg. 4; flash-attention benchmark_flash_attention.py flops()).
FUSED_ATTENTION_BACKWARD_RATIO = 2.5


def memory_bound_bytes_per_token(arch: ModelArch, precision: Precision, *, seq_len: int = 0,
                                  eager_attention: bool = False, fp32_softmax: bool | None = None) -> float:  # fmt: skip
    """HBM bytes one block's memory-bound ops move per token in forward (one kernel per op: a lower bound).

    Under AMP the weights are fp32, so the embeddings and the residual stream are fp32 (an add of a 16-bit
    branch output to it promotes) and autocast runs layer_norm in fp32 (torch.amp autocast op reference:
    layer_norm is in the fp32 list); the next matmul casts its input to 16 bits.  Per block:
    two norms (read + write a residual row, + the cast when the dtypes differ); two residual adds (read the
    stream and the branch output, write the stream); the MLP activation (GELU: read + write the ffn row;
    SwiGLU: act(gate) read + write, then act·up read 2 write 1); rotary embeddings (read + write q and k), on the
    layers that apply them.
    Cohere's LayerNorm (``norm_python``; transformers 5.25 ``CohereLayerNorm``) runs as separate fp32 kernels: the
    mean (read 4), the centring (4 + 4), its square (4 + 4), the variance (4), the centring again (4 + 4), the product
    with rstd (4 + 4) and with the weight (4 + 4) — 48 bytes an element on an fp32 stream, plus the cast up (r + 4) and
    down (4 + r) on an r-byte one; its block has one norm (``block_norms`` 1: attention and the MLP read one output).
    Bias adds run in the matmul's epilogue (cuBLAS addmm) and move nothing extra.
    transformers' Python GELU (``gelu_new``, ``NewGELUActivation``: ``0.5 * x * (1 + tanh(c * (x + 0.044715 *
    pow(x, 3))))``) runs as eight elementwise kernels (pow, two scalar multiplies, the add, tanh, ``1 +``, ``0.5 * x``,
    the product): 18a bytes an element at one dtype of a bytes.  Under autocast ``pow`` is on torch.amp's CUDA
    float32 list, so x is cast to fp32 (a + 4) and type promotion keeps the rest fp32: pow, the scalar ops, tanh and
    ``1 +`` (8 each), the add of the 16-bit x (a + 8), ``0.5 * x`` (2a) and the product (a + 8): 68 + 5a.
    Eager attention (no fused kernel, ``eager_attention``) writes and reads the s × s scores of every head through
    separate kernels (transformers' ``eager_attention_forward``): the QKᵀ output (a), the scaling (2a), the causal
    mask (2a), softmax (2a; under autocast in fp32, torch.amp's float32 list: a + 4, then the cast back, 4 + a) and
    the read by the PV matmul (a): 8a, or 8a + 8 under autocast (``fp32_softmax``, default: mixed precision; also
    where the model's code up-casts it, transformer._fp32_scores); with dropout its output and mask add 2a + 1;
    Gemma 2's soft-cap (divide, ``tanh``, multiply) 6a; gpt-oss's sinks (transformers' ``modeling_gpt_oss``: the
    concatenation of the sink column, read + write; the row maximum, a read; its subtraction, read + write) 5a.
    """
    a = precision.compute_bytes
    r = 4 if precision.mixed else a
    h, f = arch.hidden, arch.ffn_hidden
    if arch.moe is not None:  # per token: top_k routed experts and the shared expert, averaged with dense layers
        moe_f = arch.moe.top_k * arch.moe.expert_ffn_hidden + arch.moe.shared_ffn_hidden
        f = (arch.dense_mlp_layers * f + arch.moe_layers * moe_f) / arch.layers
    norm = 2 * r * h + ((r + a) * h if r != a else 0)
    if arch.norm_python:  # Cohere's LayerNorm: nine fp32 kernels, and the casts in and out of a 16-bit stream
        norm = (48 + (2 * (r + 4) if r != 4 else 0)) * h
    residual = (2 * r + a) * h
    activation = (5 if arch.mlp == "swiglu" else 2) * a * f
    if arch.gelu_python and arch.mlp == "gelu":
        activation = (68 + 5 * a if precision.mixed else 18 * a) * f
    scores = 0.0
    if eager_attention and seq_len:
        fp32 = precision.mixed if fp32_softmax is None else fp32_softmax
        per_score = 8 * a + (8 if fp32 and a == 2 else 0) + (2 * a + 1 if arch.dropout > 0 else 0)
        if arch.attention_softcap is not None:  # cap · tanh(s / cap): three more kernels, each reading and writing
            per_score += 6 * a
        if arch.attention_sinks:  # cat, max, subtract
            per_score += 5 * a
        scores = per_score * arch.heads * seq_len
    rotary = 2 * a * (attention_inner_dim(arch) + kv_inner_dim(arch)) if arch.position == "rope" else 0
    if arch.nope_layers:  # SmolLM3's NoPE layers rotate nothing (modeling_smollm3.py: use_rope per layer); per block
        rotary *= (arch.layers - arch.nope_layers) / arch.layers
    return float(arch.block_norms * norm + 2 * residual + activation + rotary + scores)


def training_step_flops(
    *,
    tokens: float,
    matmul_params: float,
    trainable_matmul_params: float,
    adapter_params: float,
    layers: int,
    seq_len: int,
    attn_dim: int,
    checkpointing: Checkpointing,
    lm_head_params: float,
    recompute_share: float = 1.0,
    causal_fused_attention: bool = False,
    block_bytes_per_token: float = 0.0,
    fp8_matmul_params: float = 0.0,
    fp8_cast_bytes: tuple[float, float] = (0.0, 0.0),
    amp_cast_bytes: tuple[float, float] = (0.0, 0.0),
    selective_matmul_params: float | None = None,
    core_recomputed: bool = True,
    module_recompute_params: float = 0.0,
    forward_only: tuple[float, float] = (0.0, 0.0),
    fused_attention: bool | None = None,
) -> StepFlops:
    """Forward, backward and recomputation FLOPs of one micro-batch of ``tokens``.

    ``trainable_matmul_params`` get a weight gradient (backward 2× forward);
    the frozen rest only the input gradient (1× forward).  Adapters (LoRA) add
    their own 6 FLOPs per parameter per token.  With ``block_bytes_per_token``
    (``memory_bound_bytes_per_token``) the result carries a ``KernelSplit``:
    the fused attention kernel's FLOPs and the memory-bound ops' bytes, so the
    step time can price each at its own rate (steptime.py).  ``fp8_matmul_params``
    (precision fp8: the block linear weights) put their GEMMs — forward, both
    backward GEMMs, and the forward again under full checkpointing — on the FP8
    tensor cores; ``fp8_cast_bytes`` (forward, backward) are the casts feeding them, ``amp_cast_bytes``
    autocast's 16-bit weight copies (transformer.autocast_cast_bytes).  ``selective_matmul_params``: under a PyTorch
    selective-checkpointing policy (memory.selective_saved_bytes_per_token) the weights of the matmuls it recomputes
    (none when every matmul output is kept); the attention kernel's output is kept, the memory-bound ops are all
    recomputed.  ``None``: selective is Megatron-Core's (Korthikanti's attention core recomputed), its
    ``recompute_modules`` choosing: ``core_recomputed`` whether the core is among them, ``module_recompute_params``
    the weights of the checkpointed modules' matmuls (transformer.module_recomputed_params), run forward again.
    ``recompute_share``: full checkpointing on that share of the blocks only (knobs.checkpoint_fraction) runs that
    share of the blocks' forward again, with its memory-bound ops, fused attention, FP8 GEMMs and casts.
    ``forward_only``: (FLOPs, of them on the fp32 units) of work run without gradients — DeepSeek Sparse Attention's
    indexer (transformer.indexer_forward_flops) —: in forward, and again in a full-checkpointing recompute.
    ``fused_attention``: the attention runs a fused kernel (priced at its own rate, recomputing in its backward);
    by default where it is a causal one — a kernel given a mask (DeepSeek Sparse Attention's) is fused without
    skipping the blocks above the diagonal.
    """
    mm = matmul_flops_forward(matmul_params, tokens)
    attn = attention_flops_forward(layers=layers, seq_len=seq_len, attn_dim=attn_dim, tokens=tokens)
    skipped = kernel_recompute = 0.0
    attn_backward = 2.0 * attn
    kernel = causal_fused_attention if fused_attention is None else fused_attention
    if causal_fused_attention:
        # A fused causal kernel skips the blocks above the diagonal: it executes half the
        # attention FLOPs (Dao 2023, "FlashAttention-2", Sec. 3.1.1).  MFU keeps the
        # conventional full count (PaLM App. B) through `causal_skipped`.
        attn = attn / 2
        skipped = 3 * attn
    if kernel:
        attn_backward = FUSED_ATTENTION_BACKWARD_RATIO * attn
        kernel_recompute = attn_backward - 2.0 * attn
    adapters = matmul_flops_forward(adapter_params, tokens)
    frozen_mm = matmul_flops_forward(matmul_params - trainable_matmul_params, tokens)
    no_grad, no_grad_fp32 = forward_only
    forward = mm + attn + adapters + no_grad
    backward = 2.0 * (mm - frozen_mm) + frozen_mm + attn_backward + 2.0 * adapters
    # full checkpointing on a share of the blocks (knobs.checkpoint_fraction) recomputes that share of them
    full = recompute_share if checkpointing is Checkpointing.FULL else 0.0
    if checkpointing is Checkpointing.FULL:
        recompute = full * (forward - matmul_flops_forward(lm_head_params, tokens))
    elif checkpointing is Checkpointing.SELECTIVE:
        if selective_matmul_params is None:
            recompute = (attn if core_recomputed else 0.0) + matmul_flops_forward(module_recompute_params, tokens)
        else:
            recompute = matmul_flops_forward(selective_matmul_params, tokens)
    else:
        recompute = 0.0
    split = None
    if block_bytes_per_token > 0:
        fused = attn if kernel else 0.0
        bytes_fwd = block_bytes_per_token * layers * tokens
        bytes_bwd = MEMORY_BOUND_BACKWARD_RATIO * bytes_fwd
        pytorch_selective = checkpointing is Checkpointing.SELECTIVE and selective_matmul_params is not None
        bytes_bwd += bytes_fwd * (1.0 if pytorch_selective else full)
        recomputed_attn = fused * full if checkpointing is Checkpointing.FULL else fused if (
            checkpointing is Checkpointing.SELECTIVE and not pytorch_selective and core_recomputed) else 0.0
        fp8_fwd = matmul_flops_forward(fp8_matmul_params, tokens)
        fp8_bwd = 2.0 * fp8_fwd + fp8_fwd * full
        cast_f, cast_b = fp8_cast_bytes
        amp_f, amp_b = amp_cast_bytes
        cast_b += cast_f * full
        amp_b += amp_f * full
        split = KernelSplit(attention_forward=fused,
                            attention_backward=(attn_backward if fused else 0.0) + recomputed_attn,
                            bytes_forward=bytes_fwd + cast_f, bytes_backward=bytes_bwd + cast_b,
                            fp8_forward=fp8_fwd, fp8_backward=fp8_bwd, amp_forward=amp_f, amp_backward=amp_b,
                            fp32_forward=no_grad_fp32, fp32_backward=no_grad_fp32 * full)  # fmt: skip
    return StepFlops(forward=forward, backward=backward, recompute=recompute, causal_skipped=skipped,
                     kernel_recompute=kernel_recompute, split=split)  # fmt: skip
