"""The device the job runs on, CPU or CUDA, and what a CUDA job changes in a trace on the fake CPU device.

Tracing always runs on the fake **CPU** device: a CPU-only build of PyTorch
cannot run a training step on fake CUDA tensors (``.to("cuda")``, autograd
metadata and SDPA fail or abort), and a trace must not depend on whether the
planning machine has a GPU.  For a CUDA job the trace applies what differs on
CUDA and matters for memory: the caching allocator's 512-byte rounding
(:func:`step_timeline`), fused attention (:class:`FusedAttentionAsOnCuda`),
host-side 0-dim optimizer ``step`` tensors, and the multi-tensor (``foreach``)
optimizers PyTorch uses by default there
(:func:`~trainplan.estimate.trace.optimizers.default_foreach`).  Other
differences (CPU vs CUDA autocast op lists, kernel workspaces) are listed in
``docs/trace.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from trainplan.estimate.trace.errors import TraceError
from trainplan.estimate.trace.memory import CUDA_ALLOCATION_GRANULARITY_BYTES, StorageTimeline
from trainplan.estimate.trace.workspace import cpu_convolution_workspace, cpu_rnn_saved_workspace

__all__ = ["CUDA_NOTE", "FusedAttentionAsOnCuda", "function_modes", "step_timeline", "target_kind"]

CUDA_NOTE = "traced on the fake CPU device with CUDA allocator rounding, foreach optimizers and fused attention"


def target_kind(device: str) -> str:
    """``"cuda"`` or ``"cpu"`` for a device string (empty: ``"cuda"``); :class:`TraceError` for any other."""
    kind = torch.device(device).type if device else "cuda"
    if kind not in ("cuda", "cpu"):
        raise TraceError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return kind


def step_timeline(*, on_cuda: bool) -> StorageTimeline:
    """A timeline that sizes storages as the target's allocator does.

    CUDA: every block rounded up to 512 bytes.  CPU: exact sizes, plus the
    workspace oneDNN convolutions hold inside the kernel and the workspace
    oneDNN's LSTM keeps for backward (``workspace.cpu_rnn_saved_workspace``).
    """
    if on_cuda:
        return StorageTimeline(granularity_bytes=CUDA_ALLOCATION_GRANULARITY_BYTES)
    return StorageTimeline(granularity_bytes=1, workspace=cpu_convolution_workspace,
                           saved_workspace=cpu_rnn_saved_workspace)  # fmt: skip


def function_modes(*, on_cuda: bool) -> list[TorchFunctionMode]:
    """New torch-function modes for the target, entered around the forward pass and each recomputation."""
    return [FusedAttentionAsOnCuda()] if on_cuda else []


class FusedAttentionAsOnCuda(TorchFunctionMode):
    """Run ``F.scaled_dot_product_attention`` as a fused kernel, as CUDA does.

    On CUDA, SDPA picks FlashAttention (or memory-efficient attention when a
    mask is given, or for fp32), which keeps only the output and a
    ``(B, H, S)`` fp32 log-sum-exp for backward — also with dropout.  On CPU,
    dropout or some masks make PyTorch fall back to the math path, which
    materializes ``(B, H, S, S)`` attention weights.  For a CUDA target the
    trace therefore calls the fused CPU flash-attention operator, whose outputs
    and saved tensors have the same sizes as the CUDA kernels'.  Under autocast
    the inputs are cast first, as SDPA's autocast rule does.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return _fused_sdpa(*args, **kwargs)


def _fused_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
    # Grouped-query attention: the fused kernels read the shared K/V heads in place
    # (the fake operator accepts fewer K/V heads and gives K/V-shaped gradients).
    if attn_mask is not None and attn_mask.dtype != query.dtype and attn_mask.dtype is not torch.bool:
        attn_mask = attn_mask.to(query.dtype)
    out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out
