"""knobs.moe_fused_activation: routed experts whose activation is one fused or compiled function that applies the
routing weight itself (Megatron-Core's WeightedSwiGLUFunction, NeMo AutoModel's torch.compile'd quick_geglu_deepep /
swiglu_oai_deepep) keep its input, the fp32 weight and down_proj's input — not eager autograd's intermediates, nor
down_proj's output for a routing-weight product after the experts (transformers' count)."""

from __future__ import annotations

import pytest

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import (
    block_activation_bytes,
    fused_expert_saved_bytes,
    resolve_transformer,
    routed_expert_bytes,
)
from trainplan.spec import parse_job

CAT = get_catalog()


def job(model: str = "gpt-oss-20b", **kw: object):
    data = {"kind": "transformer", "model": model, "seq_len": 4096, "micro_batch": 2, "steps": 1,
            "precision": "bf16-pure", "activation_checkpointing": "none"}  # fmt: skip
    data.update(kw)
    return parse_job(data)


def test_a_compiled_expert_activation_keeps_its_input_and_the_routing_weight() -> None:
    """Real autograd on CPU: gpt-oss-style experts (biased gate/up and down projections, per-expert matmuls) with the
    clamped gated activation and the fp32 routing weight in one ``torch.compile``d function, the down bias scaled by the
    same weight (as AutoModel's ``_apply_bias``).  Saved-tensor hooks, counted once per storage and without the
    parameters, give exactly ``fused_expert_saved_bytes`` per routed token; the same function run eagerly keeps more."""
    torch = pytest.importorskip("torch")

    def activation(x, probs, alpha: float = 1.702, limit: float = 7.0):
        gate, up = x[..., ::2].float(), x[..., 1::2].float()
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        return (gate * torch.sigmoid(alpha * gate) * (up + 1.0) * probs).to(x.dtype)

    counts, h, f = [5, 0, 7, 4], 24, 40
    n = sum(counts)
    bf16 = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(len(counts), h, 2 * f, generator=gen).to(bf16).requires_grad_()
    b1 = torch.randn(len(counts), 2 * f, generator=gen).to(bf16).requires_grad_()
    w2 = torch.randn(len(counts), f, h, generator=gen).to(bf16).requires_grad_()
    b2 = torch.randn(len(counts), h, generator=gen).to(bf16).requires_grad_()
    params = {t.untyped_storage().data_ptr() for t in (w1, b1, w2, b2)}

    def saved_bytes(fn) -> int:
        x = torch.randn(n, h, generator=gen).to(bf16).requires_grad_()  # the gathered (permuted) routed tokens
        probs = torch.rand(n, 1, generator=gen, requires_grad=True)  # fp32 routing weights
        storages: dict[int, int] = {}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in params:
                storages[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            xs, ps = x.split(counts), probs.split(counts)
            up = torch.cat([xi @ w1[i] + b1[i] for i, xi in enumerate(xs)])
            act = fn(up, probs).split(counts)
            out = torch.cat([a @ w2[i] + b2[i] * ps[i] for i, a in enumerate(act)]).to(bf16)
        out.float().sum().backward()
        assert x.grad is not None and probs.grad is not None and w1.grad is not None
        return sum(storages.values())

    compiled = saved_bytes(torch.compile(activation, fullgraph=True))
    assert compiled == n * fused_expert_saved_bytes(2, h, f)
    assert saved_bytes(activation) > compiled  # eager autograd keeps the clamps' inputs, the fp32 casts …


def test_the_knob_counts_the_fused_experts_and_is_refused_where_it_cannot_hold() -> None:
    plain = job()
    arch = resolve_transformer(plain, CAT).arch
    fused = job(knobs={"moe_fused_activation": True})
    assert effective_knobs(fused, CAT).moe_fused_activation and not effective_knobs(plain, CAT).moe_fused_activation
    tokens, m = 4096 * 2, arch.moe
    per_routed = fused_expert_saved_bytes(2, arch.hidden, m.expert_ffn_hidden) + 24
    assert routed_expert_bytes(fused, arch, fused_activation=True) == tokens * (m.top_k * (per_routed + 12)
                                                                                 + 4 * m.experts + 4)
    # gpt-oss's clamped SwiGLU run eagerly (transformers) keeps 2e·h + 7e·f + 44 a routed token, its top-k-then-softmax
    # router nothing per expert; fused, e·h + 3e·f + 4 plus the index vectors and a softmax-over-experts router
    h, f = arch.hidden, m.expert_ffn_hidden
    assert routed_expert_bytes(plain, arch) == tokens * m.top_k * (2 * 2 * h + 7 * 2 * f + 44)
    assert routed_expert_bytes(plain, arch) > 1.9 * routed_expert_bytes(fused, arch, fused_activation=True)
    assert block_activation_bytes(fused, arch, effective_knobs(fused, CAT)) < block_activation_bytes(
        plain, arch, effective_knobs(plain, CAT))
    with_act = job(activation_checkpointing="selective", knobs={"moe_fused_activation": True,
                                                                "recompute_modules": ["moe_act"]})
    assert routed_expert_bytes(with_act, arch, fused_activation=True, act_recomputed=True) == tokens * (
        m.top_k * (2 * arch.hidden + 2 * 2 * m.expert_ffn_hidden + 4 + 24 + 12) + 4 * m.experts + 4)
    refused = [
        (job("llama-7b", knobs={"moe_fused_activation": True}), "dense"),
        (job(method="lora", lora={"rank": 8}, knobs={"moe_fused_activation": True}), "full training"),
        (job(stack="torchtitan", knobs={"moe_fused_activation": True}), "moe_fp32_combine"),
    ]
    for bad, why in refused:
        with pytest.raises(SpecError, match=why) as err:
            resolve_transformer(bad, CAT)
        assert err.value.field == "knobs.moe_fused_activation"
    with pytest.raises(SpecError) as err:  # a traced model keeps what its own code keeps
        effective_knobs(parse_job({"kind": "torch", "model": "tests.torch_models:mlp", "inputs": [{"shape": [8]}],
                                   "micro_batch": 1, "steps": 1, "knobs": {"moe_fused_activation": True}}), CAT)
    assert err.value.field == "knobs.moe_fused_activation"
    # set false explicitly on a dense model: a statement that holds, not refused
    assert resolve_transformer(job("llama-7b", knobs={"moe_fused_activation": False}), CAT).arch.moe is None
