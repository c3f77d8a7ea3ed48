"""Memory a kernel holds inside itself: workspace models for :class:`~trainplan.estimate.trace.memory.StorageTimeline`.

A dispatch mode sees only what an operator returns.  Where a kernel allocates
and frees a large buffer before it returns, a workspace model (a
:data:`~trainplan.estimate.trace.memory.WorkspaceModel`) gives its size from
the operator's arguments and outputs, and the timeline books it as a
temporary that lives for that operator.  Each model here was measured with the
profiler; see ``docs/trace.md``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cpu_convolution_workspace", "cpu_rnn_saved_workspace", "mkldnn_lstm_workspace_bytes"]


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0


def _plain_layout(t: Any) -> bool:
    """True unless ``t`` is channels-last (oneDNN then needs no layout reorders)."""
    if not isinstance(t, torch.Tensor):
        return True
    if t.is_contiguous():
        return True
    if t.dim() == 4:
        return not t.is_contiguous(memory_format=torch.channels_last)
    if t.dim() == 5:
        return not t.is_contiguous(memory_format=torch.channels_last_3d)
    return True


# oneDNN's blocked layouts hold channels in blocks of 16 (``nChw16c``), and
# convolutions with at most 4 input channels (an image's first layer) read the
# plain input without a reorder.
_ONEDNN_CHANNEL_BLOCK = 16
_ONEDNN_PLAIN_INPUT_MAX_CHANNELS = 4


def _blocked_nbytes(t: Any) -> int:
    """Bytes of ``t`` reordered to oneDNN's blocked layout (channels padded to 16)."""
    if not isinstance(t, torch.Tensor) or t.dim() < 3:
        return _nbytes(t)
    c = int(t.shape[1])
    padded = -(-c // _ONEDNN_CHANNEL_BLOCK) * _ONEDNN_CHANNEL_BLOCK
    return _nbytes(t) // max(c, 1) * padded


def _im2col_fallback(x: Any) -> bool:
    """True when a CPU convolution in ``x``'s dtype has no oneDNN kernel on this CPU (see below)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return False
    if x.dtype is torch.bfloat16:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if x.dtype is torch.float16:
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def _im2col_workspace(packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Column buffers of PyTorch's im2col (``slow_conv2d``) CPU convolution."""
    if packet is torch.ops.aten.convolution:
        x, w, y = args[0], args[1], out
    else:
        x, w, y = args[1], args[2], args[0]  # convolution_backward(grad_output, input, weight, ...)
    n, c_in = int(x.shape[0]), int(x.shape[1])
    kh, kw = int(w.shape[-2]), int(w.shape[-1])
    columns = n * c_in * kh * kw * int(y.shape[-2]) * int(y.shape[-1]) * x.element_size()
    if packet is torch.ops.aten.convolution:
        return columns
    # backward fills the input-gradient columns, then (after freeing them) recomputes the input columns for
    # the weight gradient: one buffer at a time
    return columns


def cpu_convolution_workspace(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Bytes a oneDNN convolution on CPU holds beyond its outputs (NCHW tensors).

    oneDNN computes in a blocked layout, so PyTorch's ``mkldnn_convolution``
    reorders the plain input into a blocked copy, computes a blocked output and
    reorders it back to the plain output; the backward pass reorders
    ``grad_output`` and the input the same way and computes ``grad_input``
    blocked.  Measured with the profiler on torch 2.13 (see docs/trace.md):

    * forward: ``max(input_blocked + output_blocked - output, output_blocked)``,
      with no input copy for inputs of at most 4 channels;
    * backward: ``max(input_blocked, grad_output_blocked)``, plus
      ``input_blocked`` when ``grad_input`` is computed.

    Channels-last tensors need no reorders: 0.

    Where oneDNN has no kernel for the dtype (bf16 / fp16 on a CPU without
    AVX-512-BF16 / AVX-512-FP16 or AMX — ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``
    is false), PyTorch falls back to its im2col convolution (``_slow_conv2d_forward``
    / ``_slow_conv2d_backward``): a column buffer of N × C_in·kH·kW × H_out·W_out
    elements in forward, and in backward one at a time for the input gradient and
    then for the weight gradient (PyTorch aten/src/ATen/native/ConvolutionMM2d.cpp).
    """
    packet = getattr(func, "overloadpacket", None)
    if packet in (torch.ops.aten.convolution, torch.ops.aten.convolution_backward) and _im2col_fallback(args[0]):
        return _im2col_workspace(packet, args, kwargs, out)
    if packet is torch.ops.aten.convolution:
        x = args[0]
        if not _plain_layout(x):
            return 0
        x_b = 0 if x.dim() >= 3 and x.shape[1] <= _ONEDNN_PLAIN_INPUT_MAX_CHANNELS else _blocked_nbytes(x)
        out_b = _blocked_nbytes(out)
        return max(x_b + out_b - _nbytes(out), out_b)
    if packet is torch.ops.aten.convolution_backward:
        grad_out, x = args[0], args[1]
        if not _plain_layout(x):
            return 0
        mask = args[10] if len(args) > 10 else kwargs.get("output_mask", (True, True, True))
        x_b = _blocked_nbytes(x)
        return max(x_b, _blocked_nbytes(grad_out)) + (x_b if mask[0] else 0)
    return 0


# --------------------------------------------------------------------------- oneDNN LSTM (nn.LSTM on CPU)
#
# On CPU, nn.LSTM runs one oneDNN RNN primitive per layer and direction (``aten.mkldnn_rnn_layer``, PyTorch
# aten/src/ATen/native/mkldnn/RNN.cpp).  In training (``train=True``) the primitive's forward fills a
# *workspace* (``forward_training`` prop kind) that PyTorch returns as the operator's fourth output, a uint8
# tensor of ``workspace_desc().get_size()`` bytes, and autograd keeps it for ``mkldnn_rnn_layer_backward``.
# The operator's fake (meta) kernel returns it empty, so without a model a traced LSTM misses it entirely.
# Its size follows oneDNN's layout (src/cpu/rnn/rnn_utils.hpp ``init_conf`` leading dimensions and
# ``set_workspace_sizes``; src/cpu/rnn/rnn_utils.cpp ``set_offsets``, each part starting on a 4096-byte page),
# for one layer and one direction of T time steps, batch N, input I and hidden H, in fp32:
#
#   gates            T · N · ld(4H)                   (ws_gates; ld = get_good_ld)
#   h_t              T · N · ld(H)                    (ws_ht)
#   states           2 · (T+1) · N · ld(max(I, H))    (ws_states_layer; ws_states_iter aliases it)
#   c states         2 · (T+1) · N · H                (ws_states_iter_c)
#   diff states      2 × 2 · (T+1) · N · ld(max(I, H)) (ws_diff_states_layer, ws_diff_states_iter)
#   diff c states    2 · (T+1) · N · H                (ws_diff_states_iter_c)
#
# ``get_good_ld(d)`` rounds d up to 64 bytes and adds 64 bytes more when the result is a multiple of 256
# elements (4K-aliasing).  Checked against the real operator's workspace on torch 2.13 for five shapes
# (unidirectional and bidirectional, 1-2 layers, I from 17 to 512, H from 33 to 512): exact to the byte
# (tests/estimate/test_trace.py).  nn.GRU and nn.RNN do not use oneDNN in PyTorch (native cells), so they
# have no such workspace.

_RNN_FP32_BYTES = 4
_ONEDNN_PAGE = 4096


def _good_ld(dim: int, dtype_bytes: int = _RNN_FP32_BYTES) -> int:
    """oneDNN's ``rnn_utils::get_good_ld``: 64-byte aligned, and not a multiple of 256 elements."""
    per_line = 64 // dtype_bytes
    ld = -(-dim // per_line) * per_line
    return ld + per_line if ld % 256 == 0 else ld


def mkldnn_lstm_workspace_bytes(steps: int, batch: int, input_size: int, hidden: int) -> int:
    """Bytes of the workspace oneDNN's LSTM forward (training) keeps for backward: one layer, one direction, fp32."""
    f = _RNN_FP32_BYTES
    states_ld = _good_ld(max(input_size, hidden))
    states = 2 * (steps + 1) * batch * states_ld * f
    c_states = 2 * (steps + 1) * batch * hidden * f
    parts = (
        steps * batch * _good_ld(4 * hidden) * f,  # gates
        steps * batch * _good_ld(hidden) * f,  # h_t
        states,  # states (layer; iter aliases it)
        c_states,  # c states
        states,  # diff states, layer
        states,  # diff states, iter
        c_states,  # diff c states
    )
    return sum(-(-p // _ONEDNN_PAGE) * _ONEDNN_PAGE for p in parts)


def cpu_rnn_saved_workspace(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> tuple[Any, int] | None:
    """The output of a CPU RNN operator that stands for a workspace the fake kernel leaves empty, and its real size.

    ``aten.mkldnn_rnn_layer(input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size,
    num_layers, has_biases, bidirectional, batch_first, train)``: ``input`` is ``(T, N, I)`` (PyTorch transposes
    batch-first inputs before the call); the workspace is its fourth output, kept for backward when ``train``.
    None for every other operator.  The size is oneDNN's fp32 layout (above), checked for fp32 inputs only.
    """
    if getattr(func, "overloadpacket", None) is not getattr(torch.ops.aten, "mkldnn_rnn_layer", None):
        return None
    train = args[15] if len(args) > 15 else kwargs.get("train", True)
    if not train or not isinstance(out, (tuple, list)) or len(out) < 4:
        return None
    x, hidden = args[0], int(args[10] if len(args) > 10 else kwargs["hidden_size"])
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        return None
    steps, batch, input_size = (int(d) for d in x.shape)
    return out[3], mkldnn_lstm_workspace_bytes(steps, batch, input_size, hidden)
