"""Tensor, sequence, pipeline, context and expert parallelism: what one device holds and what it waits for.

Pure functions over a :class:`ModelSplit` (the analytic profile's quantities, before any split) and a
:class:`~trainplan.strategies.Layout` (the degrees).  The composer (``compose.py``) applies them term by term;
no combination of degrees has a special case.  Sources:

* Parameters per rank — Shoeybi et al. 2019 ("Megatron-LM", Sec. 3): every linear layer of a block is split
  column- then row-wise over the ``tp`` ranks, the embedding and output layer over the vocabulary; Narayanan
  et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters", Sec. 2.2): ``pp`` stages of
  L/pp blocks, the first holding the embedding, the last the output layer (a copy of the embedding when tied).
  The most loaded rank is what Megatron-LM's ``theoretical_memory_usage.py`` reports
  (``num_parameters_on_most_loaded_model_shard``).
* Activations — Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
  Table 2): per block sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh/t·(34 + 5as/h) with sequence
  parallelism, 2sbh with full recomputation; the first pipeline stage keeps min(m, p) micro-batches in flight
  under 1F1B, times 1 + (p − 1)/(p·v) interleaved (Sec. 4.2.3; Megatron's ``compute_activation_memory``).
  Context parallelism divides the sequence each rank holds (Megatron Core context parallel docs; Liu et al.
  2023, "Ring Attention").
* Experts — Lepikhin et al. 2020 ("GShard"): expert parallelism places E/ep experts per rank; tokens reach
  them through two all-to-alls forward (dispatch, combine) and two backward.  Experts are not tensor-parallel, and
  the expert-parallel ranks are the innermost of the expert layers' own mapping (Megatron Core's MoE parallel
  folding, Liu et al. 2025, arXiv 2504.14960), so an expert group of up to a node's GPUs exchanges over NVLink
  whatever the attention's tensor-parallel degree.
* Communication per micro-batch — Korthikanti Sec. 4.2.2: tensor parallelism all-reduces (or, with sequence
  parallelism, reduce-scatters and all-gathers, the same bytes) the sbh activations twice per block forward and
  twice backward, twice more when full recomputation re-runs the forward; pipeline stages exchange one
  sbh/t activation (and its gradient) per micro-batch (scatter-gather, Narayanan Sec. 4.1); context
  parallelism circulates K and V around a ring of cp ranks, overlapped with attention (Ring Attention).
* The pipeline bubble — Narayanan Sec. 2.2: (p − 1)/m of the ideal time, (p − 1)/(v·m) interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainplan.estimate.comms import Links, collective_seconds
from trainplan.strategies import Layout, Strategy, ZeroStage


@dataclass(frozen=True)
class ModelSplit:
    """What model parallelism divides, for one micro-batch of an analytic transformer profile (nothing split)."""

    layers: int  # blocks a pipeline divides into stages
    extra_last_layers: int  # blocks the last stage adds (DeepSeek-V3's multi-token-prediction modules)
    moe_layers: int  # MoE blocks among ``layers``
    heads: int
    kv_heads: int
    seq_len: int
    tokens: int  # seq_len × micro_batch
    hidden: int
    kv_dim: int
    compute_bytes: float
    experts: int  # routed experts per MoE layer (0: dense)
    top_k: int
    # parameters
    block_params: float  # all blocks, routed experts excluded
    expert_params: float  # the routed experts of all MoE layers
    embedding_params: float
    head_params: float  # the output projection (the embedding's size when tied: the last stage keeps a copy)
    tied: bool
    # activations of one block for one micro-batch: outside / inside the tensor-parallel regions
    replicated: float
    sharded: float  # a dense block's
    moe_sharded: float  # an MoE block's (its shared experts in place of the dense MLP)
    expert_activations: float  # what one MoE layer's router and routed experts add
    block_input: float  # s·b·h·e: the checkpoint full recomputation keeps per block
    full_recompute: bool
    head_replicated: float  # the final norm and the output projection's input
    head_sharded: float  # the logits and the loss (vocabulary-parallel over tp)
    embedding_activations: float  # the first stage's input ids and embedding dropout mask
    # one layer's saves that Megatron's checkpointed modules (recompute_modules mlp / moe / shared_experts) rebuild
    # while that layer's backward runs (transformer.module_recompute_working)
    recompute_working: float = 0.0
    # blocks' worth of the pipeline split the embedding and the output layer take (knobs.pipeline_first_stage_less_layers /
    # pipeline_last_stage_less_layers; :func:`chunk_layers`)
    first_stage_less: int = 0
    last_stage_less: int = 0
    # the share of the blocks full recomputation checkpoints (knobs.checkpoint_fraction: Megatron-Core's
    # recompute_method "block" checkpoints the first recompute_num_layers blocks of each chunk, the same share per stage)
    recompute_share: float = 1.0


@dataclass(frozen=True)
class StageLoad:
    """One pipeline stage's rank: its parameters (dense and routed experts) and its activations at the peak."""

    name: str  # "first", "second", "last" or "only"
    dense_params: float  # on this rank (divided by tp)
    expert_params: float  # on this rank (divided by ep)
    activations: float  # bytes kept for backward at the stage's peak


def layout_error(split: ModelSplit, layout: Layout, strategy: Strategy) -> tuple[str, str] | None:
    """(field, message) when the layout does not go with the model or the strategy; None when it does."""
    if layout.tp > 1 and (split.heads % layout.tp or split.kv_heads % layout.tp):
        return "--tp", (f"tensor parallel degree {layout.tp} must divide the attention heads ({split.heads}) and key-value "
                        f"heads ({split.kv_heads}); allowed: {_divisors(_gcd(split.heads, split.kv_heads))}")
    if layout.pp > split.layers:
        return "--pp", f"pipeline parallel degree {layout.pp} exceeds the model's {split.layers} layers"
    if layout.pp * layout.vpp > split.layers:
        return "--vpp", f"pp × vpp = {layout.pp * layout.vpp} model chunks exceed the model's {split.layers} layers"
    per_chunk = (split.layers + split.first_stage_less + split.last_stage_less) // (layout.pp * layout.vpp)
    if layout.pp > 1 and max(split.first_stage_less, split.last_stage_less) > per_chunk:
        # torchtitan's own check (generate_llm_fqn_per_model_part: "input_weight exceeds minimum layers per stage")
        field = "first" if split.first_stage_less > per_chunk else "last"
        return f"knobs.pipeline_{field}_stage_less_layers", (
            f"the embedding and the output layer count as {split.first_stage_less} and {split.last_stage_less} blocks of "
            f"chunks of {per_chunk} (the {split.layers} blocks and their shares over pp × vpp = "
            f"{layout.pp * layout.vpp}); each must be at most that")
    if layout.cp > 1 and split.seq_len % (2 * layout.cp):
        # load-balanced causal context parallelism cuts the sequence in 2·cp chunks (Megatron Core CP docs)
        return "--cp", f"context parallel degree {layout.cp}: 2 × cp must divide seq_len {split.seq_len}"
    if layout.ep > 1 and split.experts == 0:
        return "--ep", "expert parallelism needs a mixture-of-experts model; this model is dense"
    if layout.ep > 1 and split.experts % layout.ep:
        return "--ep", f"expert parallel degree {layout.ep} must divide the {split.experts} experts; allowed: {_divisors(split.experts)}"
    if strategy.offloads_optimizer:
        return "--strategy", f"{strategy.value} offloads to the CPU; with tp/pp/cp/ep use ddp, zero1, zero2, zero3 or fsdp"
    if layout.pp > 1 and strategy.engine.value == "deepspeed" and strategy.zero_stage >= ZeroStage.STAGE_2:
        # DeepSpeed pipeline engine: "ZeRO stage 2 and 3 are not supported with pipeline parallelism" (its docs)
        return "--strategy", f"DeepSpeed runs pipeline parallelism with ZeRO-1 at most; use zero1, ddp or fsdp with --pp {layout.pp}"
    return None


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def chunk_layers(split: ModelSplit, layout: Layout) -> tuple[int, ...]:
    """Blocks in each of the pp·v model chunks, in pipeline order, as torchtitan cuts them
    (``distributed/pipeline_parallel.py`` ``generate_llm_fqn_per_model_part``, ``_generate_…`` in 0.3.0; equal on 7
    splits: ``tests/run/test_launch_torchtitan.py``): the embedding counts as
    ``first_stage_less`` blocks and the output layer as ``last_stage_less``, the L + first + last units are dealt out
    evenly with the remainder to the earliest chunks, and the first and last chunk give the embedding's and the output
    layer's share back.  With both at 0 (trainplan's own run, ``run/runtime/model_parallel.py`` ``chunk_bounds``) it
    is the even split with the remainder first; with 1 and 1 (torchtitan's defaults) Llama 3 405B's 126 blocks on 16
    stages come out 7, 8, …, 8, 7 — the split Meta states (Dubey et al. 2024, Sec. 3.3.2: "we reduce one Transformer
    layer each from the first and the last stages"), and Megatron-Core's ``account_for_embedding_in_pipeline_split``
    / ``account_for_loss_in_pipeline_split``.  A share larger than a chunk is refused first (:func:`layout_error`)."""
    return _chunk_layers(split.layers, split.first_stage_less, split.last_stage_less, layout.pp * layout.vpp)


@lru_cache(maxsize=4096)
def _chunk_layers(layers: int, first: int, last: int, chunks: int) -> tuple[int, ...]:
    if chunks == 1:
        return (layers,)
    base, extra = divmod(layers + first + last, chunks)
    sizes = [base + (1 if i < extra else 0) for i in range(chunks)]
    sizes[0] -= first
    sizes[-1] -= last
    return tuple(sizes)


def rank_layers(split: ModelSplit, layout: Layout) -> tuple[int, ...]:
    """Blocks on each pipeline rank: rank r holds chunks r, r + pp, … (the interleaved placement, Narayanan et al.
    2021, Sec. 2.2.2; torch.distributed.pipelining's loop style)."""
    return _rank_layers(split.layers, split.first_stage_less, split.last_stage_less, layout.pp, layout.vpp)


@lru_cache(maxsize=4096)
def _rank_layers(layers: int, first: int, last: int, pp: int, vpp: int) -> tuple[int, ...]:
    sizes = _chunk_layers(layers, first, last, pp * vpp)
    return tuple(sum(sizes[r::pp]) for r in range(pp))


def stage_layers(split: ModelSplit, layout: Layout) -> int:
    """Blocks on the busiest pipeline rank (:func:`chunk_layers`): the slowest stage sets the pace."""
    return max(rank_layers(split, layout))


def rank_flops_share(split: ModelSplit, layout: Layout) -> float:
    """How many ranks a micro-batch's FLOPs are divided over, as the slowest rank sees it: its tensor and sequence
    shard (tp·cp) of its stage, the fullest stage holding :func:`stage_layers` of the L blocks."""
    return layout.tp * layout.cp * split.layers / stage_layers(split, layout)


def in_flight_microbatches(layout: Layout, micro_steps: int, rank: int = 0) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at once, in units of all its blocks: under 1F1B
    min(m, p − rank) (its warm-up forwards and the one in hand: Narayanan et al. 2021, Sec. 2.2.1); interleaved, its
    warm-up of (p − rank − 1)·2 + (v − 1)·p chunk forwards plus one (Megatron-Core ``schedules.py``
    ``forward_backward_pipelining_with_interleaving``, at most m·v), over its v chunks — for rank 0 that is
    p·(1 + (p − 1)/(p·v)), Korthikanti et al. 2022's interleaving factor (Sec. 4.2.3)."""
    p, v = layout.pp, layout.vpp
    if p == 1:
        return 1.0
    if v > 1:
        return min((p - rank - 1) * 2 + (v - 1) * p + 1, micro_steps * v) / v
    return float(min(micro_steps, p - rank))


def block_activation_bytes(split: ModelSplit, layout: Layout, *, moe: bool) -> float:
    """One block's activations for one micro-batch on one rank: the sharded part over tp, the replicated part over
    tp only with sequence parallelism, everything over cp (each rank holds s/cp tokens)."""
    tp, cp = layout.tp, layout.cp
    seq_tp = tp if layout.sequence_parallel else 1
    acts = split.replicated / seq_tp + (split.moe_sharded if moe else split.sharded) / tp
    if moe:
        # the routed tokens a rank handles: its own (sequence-sharded under SP), top_k each, whatever ep is
        acts += split.expert_activations / seq_tp
    return acts / cp


def stage_loads(split: ModelSplit, layout: Layout, micro_steps: int) -> tuple[StageLoad, ...]:
    """The candidates for the most loaded rank (one when pp = 1): the first pipeline rank (the embedding, the most
    micro-batches in flight), the second (the most in flight among ranks of full chunks when the first gives blocks to
    the embedding; every later middle rank holds as many blocks or fewer, and fewer in flight) and the last (the
    output layer and the loss)."""
    tp, pp, cp, ep = layout.tp, layout.pp, layout.cp, layout.ep
    seq_tp = tp if layout.sequence_parallel else 1
    moe_share = split.moe_layers / split.layers if split.layers else 0.0
    dense_block = split.block_params / (split.layers + split.extra_last_layers)
    expert_block = split.expert_params / (split.moe_layers + _mtp_moe(split)) if split.moe_layers else 0.0
    dense_act = block_activation_bytes(split, layout, moe=False)
    moe_act = block_activation_bytes(split, layout, moe=True)
    layer_act = max(dense_act, moe_act) if split.moe_layers else dense_act
    checkpoint = split.block_input / seq_tp / cp  # what full recomputation keeps of each block
    whole = (1 - moe_share) * dense_act + moe_share * moe_act  # a block that keeps all its activations
    share = _recomputed(split)
    per_block = share * checkpoint + (1 - share) * whole
    head = (split.head_replicated / seq_tp + split.head_sharded / tp) / cp
    embed = split.embedding_activations / seq_tp / cp  # sequence-parallel: scattered over tp as it leaves the embedding
    # the block full recomputation rebuilds; or a checkpointed module's saves, divided over the sequence shards only
    # (the routed experts' are; a dense MLP's are tensor-parallel too: an upper bound under tp > 1)
    working = layer_act if share else split.recompute_working / seq_tp / cp
    last_extra = split.extra_last_layers  # the multi-token-prediction modules sit after the last stage's blocks
    per_rank = rank_layers(split, layout)
    extra_acts = last_extra * (share * checkpoint + (1 - share) * moe_act)

    def load(name: str, rank: int) -> StageLoad:
        first, last = rank == 0, rank == pp - 1
        layers = per_rank[rank]
        in_flight = in_flight_microbatches(layout, micro_steps, rank)
        dense = layers * dense_block + (split.embedding_params if first else 0.0)
        if last and (not first or not split.tied):
            dense += split.head_params
        acts = in_flight * (layers * per_block + (embed if first else 0.0)) + working + (head if last else 0.0)
        moe_layers = layers * moe_share
        if last:
            dense += last_extra * dense_block
            moe_layers += _mtp_moe(split)
            acts += extra_acts
        return StageLoad(name, dense / tp, moe_layers * expert_block / ep, acts)

    if pp == 1:
        return (load("only", 0),)
    if pp == 2:
        return load("first", 0), load("last", 1)
    return load("first", 0), load("second", 1), load("last", pp - 1)


def _mtp_moe(split: ModelSplit) -> float:
    return float(split.extra_last_layers) if split.moe_layers else 0.0


# ----------------------------------------------------------------------------- communication


@dataclass(frozen=True)
class ParallelComm:
    """Seconds of model-parallel communication for one micro-batch on one stage."""

    tensor: float  # tp all-reduces (or reduce-scatter + all-gather pairs), on the critical path
    context: float  # cp ring exchange of K and V, before overlap with attention
    expert: float  # ep all-to-alls, on the critical path
    pipeline: float  # the stage's send of its activation and receive of its gradient


def dp_group(layout: Layout) -> tuple[int, int]:
    """(ranks of one data-parallel group per node, nodes it spans).  Ranks are ordered tp, cp, dp, pp from the
    innermost (Megatron Core's default order ``tp-cp-ep-dp-pp``; torchtitan's mesh likewise puts tp innermost), so a
    group has gpus_per_node / (tp·cp) ranks in a node when tp·cp fills less than one node, else one."""
    inner = layout.tp * layout.cp
    per_node = max(1, layout.gpus_per_node // inner) if inner < layout.gpus_per_node else 1
    per_node = min(per_node, layout.data_parallel)
    return per_node, max(1, layout.data_parallel // per_node)


def _group_seconds(bytes_: float, factor: float, ranks: int, stride: int, layout: Layout, links: Links) -> float:
    """A ring collective over ``ranks`` ranks spaced ``stride`` apart in the rank order: over NVLink while the
    group fits in the scale-up domain (a node, or an NVL72 rack), else across nodes with each rank's share
    (1/gpus_per_node) of the node's network."""
    if ranks <= 1 or bytes_ <= 0:
        return 0.0
    g = layout.gpus_per_node
    if ranks * stride <= layout.domain:
        return collective_seconds(bytes_, factor, Layout(gpus_per_node=ranks), links)
    in_node = max(1, g // stride) if stride < g else 1
    nodes = max(1, ranks // in_node)
    share = Links(links.intra_gb_s, (links.inter_node_gb_s or 0.0) * in_node / g or None)
    return collective_seconds(bytes_, factor, Layout(gpus_per_node=in_node, nodes=nodes), share)


def all_to_all_seconds(bytes_: float, ranks: int, layout: Layout, links: Links) -> float:
    """An all-to-all of ``bytes_`` per rank among ``ranks`` consecutive ranks: (n − 1)/n of it leaves the rank (NCCL's
    all-to-all moves each rank's shards directly), over NVLink inside the scale-up domain, else over the rank's share
    of the node's network."""
    if ranks <= 1:
        return 0.0
    return p2p_seconds(bytes_ * (ranks - 1) / ranks, ranks <= layout.domain, layout, links)


def p2p_seconds(bytes_: float, within_node: bool, layout: Layout, links: Links) -> float:
    """One rank sending ``bytes_`` to one other: over NVLink inside a node, else over its share of the node's NICs."""
    if bytes_ <= 0:
        return 0.0
    if within_node:
        if not links.intra_gb_s:
            raise ValueError("no intra-node bandwidth for a model-parallel layout inside a node")
        return bytes_ / (links.intra_gb_s * 1e9)
    if not links.inter_node_gb_s:
        raise ValueError("no network bandwidth for a model-parallel layout across nodes")
    return bytes_ / (links.inter_node_gb_s / layout.gpus_per_node * 1e9)


def _recomputed(split: ModelSplit) -> float:
    """The share of the blocks whose forward (and its collectives) full recomputation runs again."""
    return split.recompute_share if split.full_recompute else 0.0


def parallel_comm(split: ModelSplit, layout: Layout, links: Links) -> ParallelComm:
    """Model-parallel communication of one micro-batch on one pipeline stage (volumes in the module docstring)."""
    tp, cp, pp, ep = layout.tp, layout.cp, layout.pp, layout.ep
    e = split.compute_bytes
    per_stage = stage_layers(split, layout)
    act = split.tokens / cp * split.hidden * e  # one sbh activation of this rank's tokens
    tensor = 0.0
    if tp > 1:
        collectives = 4 + 2 * _recomputed(split)
        tensor = per_stage * collectives * _group_seconds(act, 2, tp, 1, layout, links)
    context = 0.0
    if cp > 1:
        kv = 2 * split.tokens / cp * split.kv_dim / tp * e  # this rank's K and V chunk
        passes = 3 + _recomputed(split)  # forward K,V; backward K,V and dK,dV; recompute
        context = per_stage * passes * (cp - 1) * p2p_seconds(kv, tp * cp <= layout.domain, layout, links)
    expert = 0.0
    if ep > 1 and split.moe_layers:
        routed = split.tokens / cp / (tp if layout.sequence_parallel else 1) * split.top_k * split.hidden * e
        calls = 4 + 2 * _recomputed(split)
        expert = split.moe_layers * per_stage / split.layers * calls * all_to_all_seconds(routed, ep, layout, links)
    pipeline = 0.0
    if pp > 1:
        # a stage that fills whole NVLink domains has its neighbour in another; each tp rank sends 1/tp (scatter-gather)
        within = layout.world_size // pp < layout.domain
        pipeline = 2 * layout.vpp * p2p_seconds(act / tp, within, layout, links)
    return ParallelComm(tensor=tensor, context=context, expert=expert, pipeline=pipeline)


def bubble_fraction(layout: Layout, micro_steps: int) -> float:
    """Idle time of the pipeline as a fraction of the ideal time: (p − 1)/(v·m) (Narayanan et al. 2021, Sec. 2.2)."""
    if layout.pp == 1:
        return 0.0
    return (layout.pp - 1) / (layout.vpp * max(1, micro_steps))
