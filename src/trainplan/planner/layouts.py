"""Search the tensor / pipeline / context / expert parallel layouts of one hardware option.

The search follows the practice of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", Sec. 3, takeaways #1–#2): model parallelism costs communication, so use as little
of it as memory allows — tensor parallelism up to the size of the NVLink domain (a node), pipeline stages to
scale beyond it, data parallelism for the rest.  For every tensor-parallel degree that divides the heads and fits
in a node (and context / expert degrees where the job calls for them) it finds the fewest pipeline stages that
fit by a memory-only check, then estimates that layout and the one with twice the stages fully — plain and
interleaved, with the two data-parallel shardings that run under pipelines (Megatron's distributed optimizer,
``zero1``, and torchtitan's ``fsdp``).
``tests/planner/test_layouts.py`` checks the choice against a brute-force search on small clusters.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

from trainplan.catalog import Catalog
from trainplan.errors import SpecError
from trainplan.estimate.compat import global_batch_of, micro_steps_of
from trainplan.estimate.compose import memory_rejection, step_memory
from trainplan.estimate.hardware import Hardware
from trainplan.estimate.memory import GIB, model_state_bytes
from trainplan.estimate.parallel import ModelSplit, layout_error, stage_loads
from trainplan.estimate.profile import StepProfile
from trainplan.estimate.result import Estimate
from trainplan.spec import TransformerJob
from trainplan.strategies import Strategy
from trainplan.frozen import evolve

POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SHARDINGS = (Strategy.ZERO1, Strategy.FSDP)
# context parallelism is searched from this sequence length on (Llama 3 trains 8K tokens without it and turns it on
# for its 128K stage: Dubey et al. 2024, Sec. 3.3.2 / Table 4)
CP_FROM_SEQ_LEN = 16384


def tensor_degrees(split: ModelSplit, domain: int) -> tuple[int, ...]:
    """Tensor-parallel degrees inside one NVLink domain (a node, or a GB200 NVL72 rack) that divide the heads and
    key-value heads."""
    return tuple(t for t in POWERS if t <= domain and domain % t == 0
                 and split.heads % t == 0 and split.kv_heads % t == 0)  # fmt: skip


def context_degrees(split: ModelSplit) -> tuple[int, ...]:
    if split.seq_len < CP_FROM_SEQ_LEN:
        return (1,)
    return tuple(c for c in POWERS if split.seq_len % (2 * c) == 0 and split.seq_len // c >= CP_FROM_SEQ_LEN // 4)


def expert_degrees(split: ModelSplit, domain: int) -> tuple[int, ...]:
    """No expert parallelism, and the widest that divides the experts inside one NVLink domain's ranks."""
    if not split.experts:
        return (1,)
    wide = max((e for e in POWERS if e <= domain and split.experts % e == 0), default=1)
    return tuple(sorted({1, wide}))


def _batch_ok(job: TransformerJob, hw: Hardware) -> bool:
    dp = hw.layout.data_parallel
    return global_batch_of(job, hw) % (job.micro_batch * dp) == 0


def _fits(job: TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy, catalog: Catalog) -> bool:
    mem = step_memory(job, profile, hw, strategy, catalog, micro_steps=micro_steps_of(job, hw))
    return memory_rejection(mem, hw, catalog, profile.source) is None


def states_floor(job: TransformerJob, profile: StepProfile, world_size: int) -> float:
    """Bytes some rank holds under any layout and either sharding of ``world_size`` devices: the model's weights,
    gradients and optimizer state, each held at least once over all ranks (tensor, pipeline and expert parallel
    divide them, ZeRO-1 / FSDP shard them — none drops any: Rajbhandari et al. 2020, Fig. 1), are all resident at the
    optimizer step, so the average rank — and the most loaded one above it — holds at least their total / world size.
    Above the capacity, no layout of these devices can fit and none needs a look."""
    p = profile.params
    totals = []
    for strategy in SHARDINGS:
        st = model_state_bytes(trainable_params=p.trainable, frozen_bytes=0.0, precision=job.precision, optimizer=job.optimizer,
                               strategy=strategy, world_size=1, state_elems_per_param=p.shaped_state_elems)  # fmt: skip
        totals.append(st.weights + st.gradients + st.optimizer)
    return min(totals) / world_size


def _with_layout(hw: Hardware, **degrees: int | bool) -> Hardware | None:
    """``hw`` with these degrees, or None where they do not go together (``Layout``'s own validation)."""
    try:
        layout = hw.layout.split(**degrees)
    except SpecError:
        return None
    return evolve(hw, layout=layout)


def layouts_for(job: TransformerJob, profile: StepProfile, hw: Hardware, catalog: Catalog) -> Iterator[tuple[Hardware, Strategy]]:
    """(hardware with a layout, sharding) pairs worth a full estimate on ``hw``; nothing for a job whose profile
    cannot be split (``profile.split`` is None) or hardware of one GPU."""
    split = profile.split
    base = hw.layout
    if split is None or hw.accelerator is None or hw.accelerator.kind != "gpu" or base.world_size < 2:
        return
    capacity = hw.accelerator.memory_gib * GIB
    if states_floor(job, profile, base.world_size) > capacity:
        return
    degrees = itertools.product(tensor_degrees(split, base.domain), context_degrees(split),
                                expert_degrees(split, base.domain))  # fmt: skip
    for tp, cp, ep in degrees:
        fewest: list[int] = []  # the fewest stages that fit; and, when that is 1, the fewest pipeline that fits
        for pp in POWERS:
            if pp > split.layers or tp * pp * cp > base.world_size:
                break
            cand = _with_layout(hw, tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=tp > 1)
            if cand is None or not cand.layout.model_parallel or not _batch_ok(job, cand) \
                    or layout_error(split, cand.layout, Strategy.FSDP):  # fmt: skip
                continue
            m = micro_steps_of(job, cand)
            if m >= pp and not split.first_stage_less and stage_loads(split, cand.layout, m)[0].activations > capacity:
                # with m ≥ p micro-batches the first stage holds L/p blocks × p in flight: more stages
                # do not shrink its activations (Korthikanti Sec. 4.2.3), so none of them fits either (when the
                # embedding takes blocks from the first stage, L/p − 1 blocks × p do shrink: no shortcut then)
                break
            # at pp = 1 FSDP holds the least; under a pipeline FSDP keeps the stage's parameters gathered and its
            # gradients unsharded (estimate/compose.py parallel_step_memory), and ZeRO-1 mostly holds less: tried first
            if any(_fits(job, profile, cand, s, catalog) for s in (SHARDINGS if pp > 1 else (Strategy.FSDP,))):
                fewest.append(pp)
                if pp > 1:
                    break
        # the fewest stages that fit, and twice as many: under a pipeline schedule the data-parallel
        # collectives run once per step instead of once per micro-batch, which can beat the memory minimum
        for pp in sorted({n for f in fewest for n in (f, 2 * f)}):
            for vpp in ((1, 2) if pp > 1 and split.layers >= 2 * pp else (1,)):
                cand = _with_layout(hw, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sequence_parallel=tp > 1)
                if cand is None or pp > split.layers or not _batch_ok(job, cand):
                    continue
                for strategy in SHARDINGS:
                    if layout_error(split, cand.layout, strategy) is None:
                        yield cand, strategy


def search_layouts(job: TransformerJob, profile: StepProfile, hardware: Iterator[Hardware], catalog: Catalog,
                   estimate: Callable[[Hardware, Strategy], Estimate]) -> Iterator[Estimate]:  # fmt: skip
    """Estimates of the layouts worth showing on each of ``hardware`` (:func:`layouts_for`)."""
    for hw in hardware:
        for cand, strategy in layouts_for(job, profile, hw, catalog):
            yield estimate(cand, strategy)


def keep_useful(data_parallel: list[Estimate], layouts: list[Estimate]) -> list[Estimate]:
    """The layout estimates worth listing beside the data-parallel ones.

    On the same hardware (instance and node count: the same price per hour, so cost follows time) a layout that
    fits but is no faster than the fastest data-parallel strategy that fits adds nothing, and is dropped; a layout
    that does not fit is kept only where nothing fits on that hardware (it then says why, with the others).
    """
    fastest: dict[str, float] = {}
    for e in data_parallel:
        if e.fits:
            label = e.hardware.label
            fastest[label] = min(fastest.get(label, float("inf")), e.step_time_s)
    fitting_hw = set(fastest) | {e.hardware.label for e in layouts if e.fits}
    out = []
    for e in layouts:
        label = e.hardware.label
        if e.fits and e.step_time_s < fastest.get(label, float("inf")):
            out.append(e)
        elif not e.fits and label not in fitting_hw:
            out.append(e)
    return out
