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
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.spec import Checkpointing


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one micro-batch on one device."""

    forward: float  # executed
    backward: float  # executed
    recompute: float
    causal_skipped: float = 0.0  # attention FLOPs (forward + backward) a fused causal kernel does not execute

    @property
    def model(self) -> float:
        """FLOPs that count toward MFU: the conventional count (full attention, no recomputation)."""
        return self.forward + self.backward + self.causal_skipped

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
    causal_fused_attention: bool = False,
) -> StepFlops:
    """Forward, backward and recomputation FLOPs of one micro-batch of ``tokens``.

    ``trainable_matmul_params`` get a weight gradient (backward 2× forward);
    the frozen rest only the input gradient (1× forward).  Adapters (LoRA) add
    their own 6 FLOPs per parameter per token.
    """
    mm = matmul_flops_forward(matmul_params, tokens)
    attn = attention_flops_forward(layers=layers, seq_len=seq_len, attn_dim=attn_dim, tokens=tokens)
    skipped = 0.0
    if causal_fused_attention:
        # A fused causal kernel skips the blocks above the diagonal: it executes half the
        # attention FLOPs (Dao 2023, "FlashAttention-2", Sec. 3.1.1).  MFU keeps the
        # conventional full count (PaLM App. B) through `causal_skipped`.
        attn = attn / 2
        skipped = 3 * attn
    adapters = matmul_flops_forward(adapter_params, tokens)
    frozen_mm = matmul_flops_forward(matmul_params - trainable_matmul_params, tokens)
    forward = mm + attn + adapters
    backward = 2.0 * (mm - frozen_mm) + frozen_mm + 2.0 * attn + 2.0 * adapters
    if checkpointing is Checkpointing.FULL:
        recompute = forward - matmul_flops_forward(lm_head_params, tokens)
    elif checkpointing is Checkpointing.SELECTIVE:
        recompute = attn
    else:
        recompute = 0.0
    return StepFlops(forward=forward, backward=backward, recompute=recompute, causal_skipped=skipped)
