"""Activation terms of the analytic formula that follow a library's code path (memory.py docstrings name them).

Each test checks the formula against what PyTorch autograd really keeps, on real (small) CPU tensors where
that is possible: the tensors a forward pass saves are seen through ``torch.autograd.graph.saved_tensors_hooks``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainplan.estimate.memory import layer_activation_bytes, logits_bytes, norm_saved_bytes_per_token
from trainplan.spec import Precision


def _saved_bytes(fn, *inputs: torch.Tensor, exclude: tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes of the distinct storages autograd saves while ``fn(*inputs)`` runs (parameters excluded)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def _llama_rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # the operations of Hugging Face LlamaRMSNorm.forward / torchtune RMSNorm.forward, in order
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("trainable", [True, False])
def test_rmsnorm_keeps_an_fp32_copy_under_pure_bf16(trainable: bool) -> None:
    tokens, hidden = 64, 256
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(hidden, dtype=torch.bfloat16, requires_grad=trainable)
    saved = _saved_bytes(_llama_rmsnorm, x, w, exclude=(w,))
    expected = tokens * norm_saved_bytes_per_token(hidden, "rmsnorm", Precision.BF16_PURE, weight_trainable=trainable)
    assert saved == expected
    # the old formula (16-bit input and two fp32 statistics) was short by the fp32 copy
    assert expected > tokens * (hidden * 2 + 8)


def test_full_cross_entropy_peaks_at_twelve_bytes_per_logit_at_the_start_of_backward() -> None:
    tokens, vocab = 128, 4096
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,))
    loss = F.cross_entropy(logits.float(), target)
    live: list[int] = []

    def hook(grad_inputs: tuple[torch.Tensor, ...], grad_outputs: tuple[torch.Tensor, ...]) -> None:
        # runs right after log-softmax's backward, while its saved output and both gradients are alive
        live.extend(g.untyped_storage().nbytes() for g in (*grad_inputs, *grad_outputs))

    node = loss.grad_fn.next_functions[0][0]  # NllLossBackward -> LogSoftmaxBackward
    assert "LogSoftmax" in type(node).__name__
    saved_output = node._saved_result.untyped_storage().nbytes()
    node.register_hook(hook)
    loss.backward()
    # the saved fp32 log-softmax output, nll_loss's fp32 gradient and the fp32 gradient of the logits
    assert saved_output + sum(live) == tokens * vocab * 12
    assert logits_bytes(seq_len=tokens, micro_batch=1, vocab=vocab, precision=Precision.BF16) == tokens * vocab * 12
    assert logits_bytes(seq_len=tokens, micro_batch=1, vocab=vocab, precision=Precision.BF16_PURE) == tokens * vocab * 12


def _eager_attention_fp32_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    # the softmax in fp32 and a 16-bit copy for the PV matmul: what CUDA autocast does to BERT's eager attention
    # (softmax "autocasts to float32") and what Hugging Face's eager_attention_forward writes out explicitly
    # (softmax(..., dtype=torch.float32).to(query.dtype)).  CPU autocast keeps softmax in 16 bits, so the
    # policy is spelled out here rather than taken from torch.autocast("cpu").
    w = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1, dtype=torch.float32).to(q.dtype)
    return F.dropout(w, p=p, training=p > 0) @ v


@pytest.mark.parametrize("dropout", [False, True])
def test_eager_attention_with_an_fp32_softmax(dropout: bool) -> None:
    b, heads, s, d = 1, 2, 32, 16
    q, k, v = (torch.randn(b, heads, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    saved = _saved_bytes(_eager_attention_fp32_softmax, q, k, v, 0.1 if dropout else 0.0, exclude=(q, k, v))
    kw = dict(seq_len=s, micro_batch=b, hidden=heads * d, heads=heads, q_dim=heads * d, kv_dim=heads * d,
              ffn_hidden=4 * heads * d, mlp="gelu", norm="layernorm", precision=Precision.BF16, dropout=dropout,
              autocast_softmax=True)  # fmt: skip
    scores, tokens = b * heads * s * s, b * s
    # the formula's attention core: the eager layer minus the fused one, plus the fused kernel's fp32 log-sum-exp
    core = (layer_activation_bytes(**kw, flash_attention=False) - layer_activation_bytes(**kw, flash_attention=True)
            + tokens * 4 * heads)  # fmt: skip
    assert core == scores * (7 if dropout else 6)  # fp32 softmax + 16-bit copy (+ 1-byte CUDA dropout mask)
    # on CPU dropout's mask has the input's dtype (2 bytes here) where CUDA's fused dropout keeps 1 byte
    cpu_mask_extra = scores if dropout else 0
    assert saved - cpu_mask_extra == core
    # without the fp32 softmax (Megatron's fused kernel, Korthikanti's count) the core is 2 (+1 + 2) bytes per score
    fused = {**kw, "autocast_softmax": False}
    assert (layer_activation_bytes(**fused, flash_attention=False) - layer_activation_bytes(**fused, flash_attention=True)
            + tokens * 4 * heads) == scores * (5 if dropout else 2)  # fmt: skip


def test_the_projection_keeps_a_contiguous_copy_of_the_sdpa_output_when_it_trains() -> None:
    b, heads, s, d = 1, 2, 32, 16
    q, k, v = (torch.randn(b, heads, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def saved_with(o_proj: torch.Tensor) -> int:
        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # Hugging Face LlamaAttention (sdpa) / torchtune MultiHeadAttention: SDPA, a contiguous (B, S, H*D) copy
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.linear(out.transpose(1, 2).contiguous().reshape(b, s, heads * d), o_proj)

        return _saved_bytes(attention, q, k, v, exclude=(q, k, v, o_proj))

    w = torch.randn(heads * d, heads * d, dtype=torch.bfloat16)
    extra = saved_with(w.clone().requires_grad_(True)) - saved_with(w)
    kw = dict(seq_len=s, micro_batch=b, hidden=heads * d, heads=heads, q_dim=heads * d, kv_dim=heads * d,
              ffn_hidden=4 * heads * d, mlp="gelu", norm="layernorm", precision=Precision.BF16_PURE,
              flash_attention=True)  # fmt: skip
    copy = layer_activation_bytes(**kw, attention_output_copy=True) - layer_activation_bytes(**kw)
    assert extra == copy == b * s * heads * d * 2  # one 16-bit (B, S, H*D) tensor, only when the projection trains


def test_autocast_keeps_a_16bit_cast_of_each_frozen_fp32_weight_for_backward() -> None:
    """A *-mixed precision plugin leaves a LoRA base in fp32; autocast caches casts only for weights that require
    grad, so each frozen weight is cast at its use and the matmul saves that copy (memory.frozen_weight_cast_bytes)."""
    from trainplan.estimate.memory import frozen_weight_cast_bytes
    from trainplan.spec import Checkpointing

    hidden, blocks, tokens = 64, 3, 16
    frozen = [torch.randn(hidden, hidden) for _ in range(blocks)]  # fp32, requires_grad=False
    x = torch.randn(tokens, hidden, requires_grad=True)
    casts: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype is torch.bfloat16 and tuple(t.shape) == (hidden, hidden):
            casts.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        h = x
        for w in frozen:
            h = F.linear(h, w)
        h.float().sum().backward()
    assert len(casts) == blocks  # one saved copy per frozen weight: none is cached and shared
    assert sum(casts) == frozen_weight_cast_bytes(blocks * hidden * hidden, blocks=blocks, head_params=0,
                                                  checkpointing=Checkpointing.NONE)  # fmt: skip
    # a weight that trains is cached instead: its two uses save the same 16-bit storage
    w = torch.randn(hidden, hidden, requires_grad=True)
    ptrs: set[int] = set()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: ptrs.add(t.untyped_storage().data_ptr()) or t, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16):  # fmt: skip
        F.linear(F.linear(x, w), w).float().sum().backward()
    assert len(ptrs) == 3  # x's cast, the first output, and ONE cast of w
    # with full checkpointing only the recomputed block holds its casts (and the head's stay)
    assert frozen_weight_cast_bytes(blocks * hidden * hidden, blocks=blocks, head_params=10,
                                    checkpointing=Checkpointing.FULL) == 2 * (hidden * hidden + 10)  # fmt: skip


def test_cross_entropy_without_an_upcast_keeps_everything_in_bf16() -> None:
    """LitGPT's chunked_cross_entropy and Lightning's demo loss call the loss on the logits as they are: in pure
    bf16 the saved log-softmax and both gradients are bf16 — 3 x 2 bytes per logit, not 12."""
    tokens, vocab = 128, 4096
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,))
    loss = F.cross_entropy(logits, target)
    live: list[int] = []
    node = loss.grad_fn.next_functions[0][0]
    assert "LogSoftmax" in type(node).__name__
    saved_output = node._saved_result.untyped_storage().nbytes()
    node.register_hook(lambda gi, go: live.extend(g.untyped_storage().nbytes() for g in (*gi, *go)))
    loss.backward()
    kw = dict(seq_len=tokens, micro_batch=1, vocab=vocab, precision=Precision.BF16_PURE, upcast=False)
    assert saved_output + sum(live) == logits_bytes(**kw) == tokens * vocab * 6
    # under autocast (mixed precision) the loss runs in fp32 whatever the code says: the flag changes nothing
    assert logits_bytes(**{**kw, "precision": Precision.BF16}) == tokens * vocab * 12
    # chunked (LitGPT keeps its chunk list): each chunk's saved log-softmax is bf16, as many bytes as the logits
    chunks = [torch.randn(32, vocab, dtype=torch.bfloat16, requires_grad=True) for _ in range(4)]
    saved = _saved_bytes(lambda *c: [F.cross_entropy(t, target[:32], reduction="none") for t in c], *chunks,
                         exclude=(*chunks, target))  # fmt: skip
    assert 0 <= saved - 4 * 32 * vocab * 2 < 64  # (+ nll_loss's scalar total weights)
    from trainplan.spec import LossImpl

    chunked = logits_bytes(**kw, loss=LossImpl.CHUNKED, chunks=4)
    assert chunked == tokens * vocab * 2 * (2 + 2 / 4)  # chunks + saved outputs, one chunk's two gradients


def test_fused_kernels_keep_the_norm_input_and_the_mlp_gate_and_up() -> None:
    from trainplan.spec import FusedKernels

    kw = dict(seq_len=128, micro_batch=1, hidden=256, heads=4, q_dim=256, kv_dim=256, ffn_hidden=1024, mlp="swiglu",
              norm="rmsnorm", precision=Precision.BF16_PURE, flash_attention=True)  # fmt: skip
    eager = layer_activation_bytes(**kw)
    liger = layer_activation_bytes(**kw, fused_kernels=FusedKernels.LIGER)
    unsloth = layer_activation_bytes(**kw, fused_kernels=FusedKernels.UNSLOTH)
    frozen_down = layer_activation_bytes(**kw, fused_kernels=FusedKernels.LIGER, down_proj_keeps_input=False)
    t, e, h, f = 128, 2, 256, 1024
    # norms: the fp32 up-cast and the 16-bit product become the 16-bit input (Liger saves X, W, RSTD)
    norm_saving = 2 * (norm_saved_bytes_per_token(h, "rmsnorm", Precision.BF16_PURE)
                       - norm_saved_bytes_per_token(h, "rmsnorm", Precision.BF16_PURE, compiled=True))  # fmt: skip
    assert eager - liger == t * (norm_saving + e * f)  # SwiGLU: gate, up and the product down_proj keeps (3 of 4)
    assert liger - frozen_down == t * e * f == liger - unsloth  # no product kept when down_proj does not train


def test_a_python_gelu_keeps_five_tensors_where_a_fused_one_keeps_two() -> None:
    """transformers' gelu_new (GPT-2, GPT-J) is eager Python: pow keeps x, tanh its output, the last product both
    operands, and the output projection its input (memory.layer_activation_bytes, gelu_python)."""
    import math

    tokens, hidden, ffn = 16, 32, 128
    w_out = torch.randn(hidden, ffn, requires_grad=True)

    def mlp(h: torch.Tensor) -> torch.Tensor:
        x = h * 1.0  # the fc output (not a leaf)
        y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return F.linear(y, w_out)

    h = torch.randn(tokens, ffn, requires_grad=True)
    saved = _saved_bytes(mlp, h, exclude=(w_out, h))
    assert saved == tokens * ffn * 4 * 5
    kw = dict(seq_len=tokens, micro_batch=1, hidden=hidden, heads=2, q_dim=hidden, kv_dim=hidden, ffn_hidden=ffn,
              mlp="gelu", norm="layernorm", precision=Precision.FP32, flash_attention=True)  # fmt: skip
    extra = layer_activation_bytes(**kw, gelu_python=True) - layer_activation_bytes(**kw)
    assert extra == tokens * ffn * 4 * 3  # five kept where the fused GELU's count has two (input, output)


def test_a_python_gelu_under_cuda_autocast_keeps_fp32_copies() -> None:
    """Under autocast ``pow`` is on the CUDA float32 list (torch.amp docs), so gelu_new's pow takes an fp32 copy of the
    16-bit fc output and type promotion keeps the rest fp32. Emulated on CPU by the same casts (CPU autocast's lists
    differ): pow keeps the fp32 x, tanh its fp32 output, the product 0.5·x (16-bit) and 1 + tanh (fp32), the output
    projection the 16-bit cast of the result — 12 + 2e bytes an element (memory.layer_activation_bytes; measured on an
    H200: docs/benchmarks.md, "GPU validation")."""
    import math

    tokens, hidden, ffn = 16, 32, 128
    w_out = torch.randn(hidden, ffn, dtype=torch.bfloat16, requires_grad=True)

    def mlp(h: torch.Tensor) -> torch.Tensor:
        x = h * 1.0  # the 16-bit fc output (not a leaf)
        y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x.float(), 3.0))))
        return F.linear(y.to(torch.bfloat16), w_out)  # autocast casts the fp32 result for the projection

    h = torch.randn(tokens, ffn, dtype=torch.bfloat16, requires_grad=True)
    assert _saved_bytes(mlp, h, exclude=(w_out, h)) == tokens * ffn * (12 + 2 * 2)
    kw = dict(seq_len=tokens, micro_batch=1, hidden=hidden, heads=2, q_dim=hidden, kv_dim=hidden, ffn_hidden=ffn,
              mlp="gelu", norm="layernorm", precision=Precision.BF16, flash_attention=True)  # fmt: skip
    extra = layer_activation_bytes(**kw, gelu_python=True) - layer_activation_bytes(**kw)
    assert extra == tokens * ffn * (12 + 2 * 2 - 2 * 2)  # against the fused GELU's input and output


@pytest.mark.parametrize(("family", "upcast"), [("llama", True), ("gpt2", False)])
def test_pure_bf16_eager_attention_keeps_what_the_family_code_casts(family: str, upcast: bool) -> None:
    """Without autocast, transformers' Llama-family ``eager_attention_forward`` still up-casts its softmax
    (``dtype=torch.float32``, then ``.to(query.dtype)``): the fp32 output and the 16-bit copy, 6 bytes a score in
    bf16; GPT-2's keeps the input's dtype, 2.  The estimate's ``autocast_softmax`` (transformer._fp32_scores) counts
    each."""
    from types import SimpleNamespace

    mod = pytest.importorskip(f"transformers.models.{family}.modeling_{family}")
    b, heads, s, d = 1, 2, 32, 16
    q, k, v = (torch.randn(b, heads, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    module = SimpleNamespace(num_key_value_groups=1, training=True)
    mask = torch.full((s, s), float("-inf"), dtype=torch.bfloat16).triu(1)[None, None]
    saved = _saved_bytes(lambda q, k, v: mod.eager_attention_forward(module, q, k, v, mask, scaling=d**-0.5)[0],
                         q, k, v, exclude=(q, k, v, mask))  # fmt: skip
    kw = dict(seq_len=s, micro_batch=b, hidden=heads * d, heads=heads, q_dim=heads * d, kv_dim=heads * d,
              ffn_hidden=4 * heads * d, mlp="gelu", norm="layernorm", precision=Precision.BF16_PURE)  # fmt: skip
    core = (layer_activation_bytes(**kw, flash_attention=False, autocast_softmax=upcast)
            - layer_activation_bytes(**kw, flash_attention=True) + b * s * 4 * heads)
    assert saved == core == b * heads * s * s * (6 if upcast else 2)


@pytest.mark.parametrize("fp32_weights", [False, True])
def test_gpt_oss_sink_attention_keeps_its_softmax_in_the_logits_dtype(fp32_weights: bool) -> None:
    """transformers' own gpt-oss ``eager_attention_forward`` (``_supports_sdpa = False``): the softmax over the scores
    and the sink column in the dtype the mask and the sinks give the logits, the row maximum's indices, and a 16-bit
    copy for the value matmul only when the softmax was fp32 — 16-bit weights (pure bf16, a 16-bit LoRA base) against
    fp32 weights under autocast."""
    from types import SimpleNamespace

    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    b, heads, s, d = 2, 4, 24, 8
    wdt = torch.float32 if fp32_weights else torch.bfloat16
    q, k, v = (torch.randn(b, heads, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    sinks = torch.zeros(heads, dtype=wdt, requires_grad=True)
    module = SimpleNamespace(num_key_value_groups=1, training=True, sinks=sinks)
    mask = torch.full((s, s), float("-inf"), dtype=wdt).triu(1)[None, None]

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fp32_weights):
            return gpt_oss.eager_attention_forward(module, q, k, v, mask, scaling=d**-0.5)[0]

    saved = _saved_bytes(attention, q, k, v, exclude=(q, k, v, mask, sinks))
    kw = dict(seq_len=s, micro_batch=b, hidden=heads * d, heads=heads, q_dim=heads * d, kv_dim=heads * d,
              ffn_hidden=4 * heads * d, mlp="gelu", norm="layernorm", autocast_softmax=fp32_weights)  # fmt: skip
    precision = Precision.BF16 if fp32_weights else Precision.BF16_PURE
    eager = layer_activation_bytes(**kw, precision=precision, flash_attention=False, sinks=True)
    fused = layer_activation_bytes(**kw, precision=precision, flash_attention=True)
    core = eager - fused + b * s * 4 * heads  # the fused kernel's log-sum-exp out, the eager core in
    assert saved == core
    scores = b * heads * s * (s + 1)
    assert saved == (4 * scores + 2 * b * heads * s * s if fp32_weights else 2 * scores) + 8 * b * heads * s


def test_gemma2_soft_capped_eager_attention_keeps_the_tanh_output_too() -> None:
    """transformers' own Gemma 2 ``eager_attention_forward`` (its only training path without the flash-attn package:
    ``_supports_sdpa = False``): the fp32 softmax and its 16-bit copy, plus the soft-cap's ``tanh`` output."""
    from types import SimpleNamespace

    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    b, heads, s, d = 1, 2, 32, 16
    q, k, v = (torch.randn(b, heads, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    module = SimpleNamespace(num_key_value_groups=1, training=True)
    mask = torch.full((s, s), float("-inf"), dtype=torch.bfloat16).triu(1)[None, None]

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softcap: float | None) -> torch.Tensor:
        return gemma2.eager_attention_forward(module, q, k, v, mask, scaling=d**-0.5, softcap=softcap)[0]

    kw = dict(seq_len=s, micro_batch=b, hidden=heads * d, heads=heads, q_dim=heads * d, kv_dim=heads * d,
              ffn_hidden=4 * heads * d, mlp="gelu", norm="layernorm", precision=Precision.BF16, autocast_softmax=True,
              flash_attention=False)  # fmt: skip
    scores = b * heads * s * s
    capped = _saved_bytes(attention, q, k, v, 50.0, exclude=(q, k, v, mask))
    plain = _saved_bytes(attention, q, k, v, None, exclude=(q, k, v, mask))
    assert plain == scores * 6 and capped == scores * 8  # fp32 softmax + 16-bit copy (+ the 16-bit tanh output)
    extra = layer_activation_bytes(**kw, softcap=True) - layer_activation_bytes(**kw)
    assert extra == capped - plain
