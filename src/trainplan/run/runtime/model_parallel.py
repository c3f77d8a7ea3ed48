"""Tensor (with sequence) parallelism and pipeline parallelism for Llama-family causal LMs, with PyTorch's own APIs.

* Tensor parallelism — ``torch.distributed.tensor.parallel.parallelize_module``: in every block the Q, K, V, gate
  and up projections are column-parallel and the attention output and down projections row-parallel (Shoeybi et
  al. 2019, Sec. 3), so each rank computes heads/tp heads and ffn/tp of the MLP.  With sequence parallelism the
  residual stream between them is sharded along the sequence: the norms run on s/tp tokens, the row-parallel
  outputs reduce-scatter and the column-parallel inputs all-gather (Korthikanti et al. 2022, Sec. 4.2.2); the
  embedding hands over a sequence-sharded output and the head gathers it back (as torchtitan's Llama plan does).
* Pipeline parallelism — ``torch.distributed.pipelining``: the blocks are cut into ``pp × vpp`` consecutive
  chunks, rank r holding chunks r, r + pp, … (the interleaved placement of Narayanan et al. 2021, Sec. 2.2.2);
  the first chunk owns the embedding, the last the final norm and the head; ``Schedule1F1B`` or
  ``ScheduleInterleaved1F1B`` run them.

Both run on CPU over gloo as on GPUs over NCCL (``tests/run/test_model_parallel.py`` checks each layout's loss and
gradients against one process on the same batch).  Only the Llama family (``LlamaForCausalLM`` and models
laid out like it: ``model.layers[i].self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``) is mapped; anything
else is refused in one line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainplan.errors import SpecError

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def check_llama(model: nn.Module) -> None:
    """Refuse a model whose modules are not laid out like ``LlamaForCausalLM``."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    ok = layers is not None and len(layers) > 0 and all(
        hasattr(layer, "self_attn") and hasattr(layer, "mlp")
        and all(hasattr(layer.self_attn, n) for n in ATTENTION) and all(hasattr(layer.mlp, n) for n in MLP)
        for layer in layers
    )  # fmt: skip
    if not ok or not hasattr(model, "lm_head") or not hasattr(inner, "embed_tokens"):
        raise SpecError(f"tensor and pipeline parallel runs map Llama-family models (q/k/v/o_proj, gate/up/down_proj); "
                        f"{type(model).__name__} is not one", field="model")  # fmt: skip


def apply_tensor_parallel(model: nn.Module, mesh: Any, *, sequence_parallel: bool) -> None:
    """Shard ``model`` over the one-dimensional tensor-parallel ``mesh`` in place (see the module docstring).

    The caller passes explicit ``position_ids`` under sequence parallelism: the model would otherwise derive them
    from its sequence-sharded embedding output.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    check_llama(model)
    tp = mesh.size()
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if heads % tp or kv_heads % tp:
        raise SpecError(f"tensor parallel degree {tp} must divide the {heads} attention heads and {kv_heads} key-value heads",
                        field="--tp")  # fmt: skip
    row = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
    for layer in model.model.layers:
        plan: dict[str, Any] = {f"self_attn.{n}": ColwiseParallel() for n in ATTENTION[:3]}
        plan.update({"self_attn.o_proj": row, "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                     "mlp.down_proj": row})  # fmt: skip
        if sequence_parallel:
            plan.update({
                "input_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })  # fmt: skip
        parallelize_module(layer, mesh, plan)
    if sequence_parallel:
        parallelize_module(model, mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })  # fmt: skip


class PipelineChunk(nn.Module):
    """Consecutive blocks of a Llama-family model: with the embedding when it is the first chunk, with the final
    norm and the head (returning logits) when it is the last."""

    def __init__(self, model: nn.Module, start: int, stop: int) -> None:
        super().__init__()
        inner = model.model
        n = len(inner.layers)
        self.first, self.last = start == 0, stop == n
        self.embed_tokens = inner.embed_tokens if self.first else None
        self.layers = nn.ModuleList(inner.layers[start:stop])
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if self.last else None
        self.lm_head = model.lm_head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rope = self.rotary_emb(h, position_ids=positions)
        for layer in self.layers:
            h = layer(h, position_embeddings=rope, position_ids=positions)
        if self.lm_head is not None:
            assert self.norm is not None
            h = self.lm_head(self.norm(h))
        return h


def chunk_bounds(layers: int, chunks: int) -> list[tuple[int, int]]:
    """Block ranges of ``chunks`` consecutive chunks, as equal as the layer count allows (earlier chunks take the
    remainder)."""
    if chunks > layers:
        raise SpecError(f"pp × vpp = {chunks} pipeline chunks exceed the model's {layers} layers", field="--pp")
    base, extra = divmod(layers, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def pipeline_chunks(model: nn.Module, *, pp_rank: int, pp: int, vpp: int = 1) -> list[tuple[int, PipelineChunk]]:
    """(stage index, chunk) pairs this pipeline rank runs: chunks r, r + pp, … of ``pp × vpp``."""
    check_llama(model)
    bounds = chunk_bounds(len(model.model.layers), pp * vpp)
    return [(i, PipelineChunk(model, *bounds[i])) for i in range(pp_rank, pp * vpp, pp)]


def pipeline_split(model: nn.Module, *, pp_rank: int, pp: int, vpp: int = 1) -> list[tuple[int, PipelineChunk]]:
    """This pipeline rank's chunks (:func:`pipeline_chunks`), with ``model`` pruned in place to what they hold: the
    blocks of other ranks become ``nn.Identity`` (so the kept ones keep their indices) and the embedding, final norm
    and head go where no chunk of this rank uses them.  Parameter names stay the whole model's, so each rank's state
    dict is its part of the whole model's (as torchtitan keeps its pipeline stages' names)."""
    if getattr(model.config, "tie_word_embeddings", False) and pp > 1:
        raise SpecError("a head tied to the embeddings cannot be cut between the first and last pipeline stage",
                        field="--pp")  # fmt: skip
    chunks = pipeline_chunks(model, pp_rank=pp_rank, pp=pp, vpp=vpp)
    kept = {id(layer) for _, chunk in chunks for layer in chunk.layers}
    inner = model.model
    for i, layer in enumerate(inner.layers):
        if id(layer) not in kept:
            inner.layers[i] = nn.Identity()
    if not any(chunk.first for _, chunk in chunks):
        inner.embed_tokens = None
    if not any(chunk.last for _, chunk in chunks):
        inner.norm = None
        model.lm_head = None
    return chunks


def pipeline_schedule(chunks: list[tuple[int, PipelineChunk]], *, pp: int, vpp: int, microbatches: int,
                      group: Any, device: torch.device, loss_fn: Any) -> Any:  # fmt: skip
    """The 1F1B schedule (``vpp`` = 1) or its interleaved variant over this rank's chunks."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    stages = [PipelineStage(chunk, index, pp * vpp, device, group=group) for index, chunk in chunks]
    if vpp == 1:
        return Schedule1F1B(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    return ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, as ``LlamaForCausalLM`` computes it (logits up-cast to fp32, shifted labels)."""
    return nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
