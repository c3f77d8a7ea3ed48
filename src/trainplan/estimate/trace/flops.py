"""FLOPs of the traced step, with the formulas of ``torch.utils.flop_counter``, and its operators.

:class:`FlopTally` sums the FLOPs of every operator with ``FlopCounterMode``'s
formula table plus :data:`EXTRA_FLOP_FORMULAS`; the tracer reads its total at
phase boundaries (forward, backward) and while recomputing (see
:class:`~trainplan.estimate.trace.checkpointing.RecomputeProbe`).  It also counts
the operators dispatched (each costs an eager step its dispatch, whatever its
size) and the bytes the *memory-bound* ones read and write: every operator
without a FLOP formula that is not a view (a view moves no data), its tensor
inputs plus its tensor outputs.  ``prim`` operators (metadata queries such as
``prim.device``) run no kernel and are not counted.  The FLOPs of the operators
a CPU runs at a rate of their own (:data:`KERNEL_CLASSES`: convolutions, oneDNN's
fused recurrent layers) are booked apart too.  The CPU time model
(``estimate/cpu.py``) prices all of it.  A formula for an operator PyTorch does
not count goes into :data:`EXTRA_FLOP_FORMULAS` (or into PyTorch's own table
with ``torch.utils.flop_counter.register_flop_formula``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["EXTRA_FLOP_FORMULAS", "KERNEL_CLASSES", "FlopTally"]

_aten = torch.ops.aten


# FlopCounterMode has formulas for CUDA's fused attention ops but not for the CPU flash-attention op the fake CPU
# device dispatches to. Counted here as PyTorch's own SDPA formulas count (torch/utils/flop_counter.py,
# sdpa_flop_count / sdpa_backward_flop_count: full, non-causal attention): forward QKᵀ and PV, 2·b·h·s_q·s_k·(d_q +
# d_v); backward the recomputed scores, the two matmuls through PV and the two through QKᵀ (FlashAttention's
# backward, Dao et al. 2022, Alg. 4), 2·b·h·s_q·s_k·(3·d_q + 2·d_v) — with h the query heads, so grouped-query
# attention (fewer K/V heads, read in place) counts as the kernel runs it. PyTorch before 2.12 asserts equal heads in
# those formulas, which made every GQA model (Llama 3, Qwen, Mistral) untraceable there.
def _sdpa_dims(query_shape: Any, key_shape: Any, value_shape: Any) -> tuple[int, int, int, int, int, int]:
    b, h_q, s_q, d_q = query_shape
    b_k, h_kv, s_k, d_k = key_shape
    b_v, h_v, s_v, d_v = value_shape
    if not (b == b_k == b_v and h_kv == h_v and d_q == d_k and s_k == s_v and h_q % h_kv == 0):
        raise ValueError(f"attention shapes do not go together: q {tuple(query_shape)}, k {tuple(key_shape)}, "
                         f"v {tuple(value_shape)}")  # fmt: skip
    return b, h_q, s_q, s_k, d_q, d_v


def _cpu_flash_forward_flop(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    b, h, s_q, s_k, d_q, d_v = _sdpa_dims(query_shape, key_shape, value_shape)
    return 2 * b * h * s_q * s_k * (d_q + d_v)


def _cpu_flash_backward_flop(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    b, h, s_q, s_k, d_q, d_v = _sdpa_dims(query_shape, key_shape, value_shape)
    return 2 * b * h * s_q * s_k * (3 * d_q + 2 * d_v)


# nn.LSTM on CPU runs one oneDNN operator per layer and direction (aten.mkldnn_rnn_layer), which the table
# lacks: without a formula an LSTM traces at 0 FLOPs.  Per time step and sample the operator multiplies the
# input by W_ih (4H x I) and the hidden state by W_hh (4H x H): 2·(4H·I + 4H·H) FLOPs (the gates' element-wise
# arithmetic is not counted, as for every other operator); its backward computes the input, hidden-state and
# weight gradients: twice the forward, the convention of the table's matmul formulas.
def _mkldnn_rnn_forward_flop(input_shape: Any, w_ih_shape: Any, w_hh_shape: Any, *args: Any, out_shape: Any = None,
                             **kwargs: Any) -> int:  # fmt: skip
    steps_x_batch = math.prod(input_shape[:-1])
    return int(2 * steps_x_batch * (math.prod(w_ih_shape) + math.prod(w_hh_shape)))


def _mkldnn_rnn_backward_flop(input_shape: Any, w_ih_shape: Any, w_hh_shape: Any, *args: Any, out_shape: Any = None,
                              **kwargs: Any) -> int:  # fmt: skip
    return 2 * _mkldnn_rnn_forward_flop(input_shape, w_ih_shape, w_hh_shape)


# Grouped GEMM (torch._grouped_mm; transformers 5's mixture-of-experts layers run every expert in one call):
# mat_a (S, K) @ mat_b (E, K, N) with S rows split among E groups by `offs` -> (S, N): 2·S·K·N, however the
# rows are split (so the trace counts routed tokens, balanced or not).  Its weight gradient, (K, S) @ (S, N)
# grouped along S -> (E, K, N), is 2·K·S·N.  In both the contraction is the last dimension of mat_a.
def _grouped_mm_flop(a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    groups = b_shape[0] if len(b_shape) == 3 and len(out_shape) == 3 else 1
    if len(a_shape) == 2 and len(b_shape) == 2 and len(out_shape) == 3:
        groups = out_shape[0]
    return int(2 * math.prod(out_shape) // groups * a_shape[-1])


def _extra_flop_formulas() -> dict[Any, Callable[..., int]]:
    """Formulas for the operators (of this PyTorch build) that ``FlopCounterMode``'s table lacks."""
    formulas: dict[Any, Callable[..., int]] = {}
    if hasattr(_aten, "mkldnn_rnn_layer"):
        formulas[_aten.mkldnn_rnn_layer] = _mkldnn_rnn_forward_flop
    if hasattr(_aten, "mkldnn_rnn_layer_backward"):
        formulas[_aten.mkldnn_rnn_layer_backward] = _mkldnn_rnn_backward_flop
    if hasattr(_aten, "_grouped_mm"):
        formulas[_aten._grouped_mm] = _grouped_mm_flop
    if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
        formulas[_aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_forward_flop
    if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        formulas[_aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_flash_backward_flop
    return formulas


# Operators a CPU runs at a rate of its own (estimate/cpu.py), by class: convolutions (oneDNN's direct kernels) and
# oneDNN's fused recurrent layers (the gates' GEMMs one time step at a time, then their element-wise arithmetic).
_CLASSES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "conv": ("convolution", "_convolution", "convolution_backward", "_slow_conv2d_forward"),
    "rnn": ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"),
    # fused attention (PyTorch SDPA's kernels, as the fake CPU and a CUDA device dispatch them): priced at the
    # attention kernel's efficiency on GPUs (steptime.step_time with a KernelSplit)
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
                  "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
                  "_efficient_attention_backward"),
})
KERNEL_CLASSES: Mapping[Any, str] = MappingProxyType(
    {getattr(_aten, name): kind for kind, names in _CLASSES.items() for name in names if hasattr(_aten, name)}
)

# Operator overload packet -> FLOP formula (shapes in, FLOPs out); built once, read-only.
EXTRA_FLOP_FORMULAS: Mapping[Any, Callable[..., int]] = MappingProxyType(_extra_flop_formulas())


class FlopTally(TorchDispatchMode):
    """Sum the FLOPs of every operator with ``FlopCounterMode``'s own formulas.

    ``FlopCounterMode`` itself is not entered: its module tracker registers
    gradient hooks on module outputs that keep the tensors recomputed by
    activation checkpointing alive until the mode exits, which would inflate
    the memory this trace measures.  Its formula registry (``flop_registry``,
    PyTorch's ``register_flop_formula`` table plus :data:`EXTRA_FLOP_FORMULAS`)
    is used as is; it is read when the tally is made, so formulas registered
    with PyTorch later count in later traces.
    """

    def __init__(self) -> None:
        super().__init__()
        self.registry = FlopCounterMode(display=False, custom_mapping=dict(EXTRA_FLOP_FORMULAS)).flop_registry
        self.total = 0
        self.ops = 0  # operators dispatched
        self.memory_bytes = 0  # bytes read + written by the memory-bound operators
        self.class_flops = dict.fromkeys(_CLASSES, 0)  # FLOPs of each KERNEL_CLASSES class, part of ``total``

    def get_total_flops(self) -> int:
        return self.total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim":  # metadata queries (prim.device ...): no kernel runs
            return out
        self.ops += 1
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.total += flops
            kind = KERNEL_CLASSES.get(func._overloadpacket)
            if kind is not None:
                self.class_flops[kind] += flops
        elif not func.is_view:
            self.memory_bytes += _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        return out


def _tensor_bytes(tree: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))
