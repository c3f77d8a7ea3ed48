"""The largest micro-batch (and the longest sequence) that fits an option, keeping the global batch.

Memory grows with the micro-batch (activations, logits), so the largest fitting
micro-batch is found by bisection over re-composed estimates.  A profile from
the formulas is rebuilt for each candidate micro-batch; a traced profile is not
re-traced: its activations and FLOPs are scaled per sample (a trace of one
step is linear in the batch for every layer the tracer has seen — attention
is linear in the batch too; only the sequence length enters quadratically).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from trainplan.catalog import Catalog
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import Hardware
from trainplan.estimate.profile import ProfileSource, StepProfile
from trainplan.estimate.result import Estimate, Rejection, RejectKind
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import checkpointed_count, resolve_transformer, transformer_profile
from trainplan.spec import Checkpointing, TorchJob, TransformerJob
from trainplan.strategies import Strategy

MAX_MICRO_BATCH = 1 << 16  # search bound: beyond this a step is no longer "a micro-batch"
MAX_SEQ_LEN = 1 << 20  # one million tokens

Profiles = dict[tuple[int, int | None, int | None], StepProfile]  # (micro-batch, seq_len, global batch) → profile


@dataclass(frozen=True)
class MicroBatchFit:
    """What fits on one option: micro-batch, accumulation, and (transformers) the longest sequence."""

    micro_batch: int  # 0: not even micro-batch 1 fits
    grad_accumulation: int  # micro-steps per optimizer step that keep the global batch
    global_batch: int  # the global batch kept (or, without one in the job, micro-batch × data-parallel)
    longest_seq_len: int | None  # at micro-batch 1 (transformer jobs from the formulas); 0: none fits
    text: str

    def to_dict(self) -> dict[str, object]:
        return {
            "max_micro_batch": self.micro_batch,
            "grad_accumulation": self.grad_accumulation,
            "global_batch": self.global_batch,
            "longest_seq_len_at_micro_batch_1": self.longest_seq_len,
            "text": self.text,
        }


def _scaled(profile: StepProfile, factor: float) -> StepProfile:
    """A traced profile for ``factor`` × the traced micro-batch (activations and FLOPs per sample)."""
    f = profile.flops
    return replace(
        profile,
        flops=replace(f, forward=f.forward * factor, backward=f.backward * factor, recompute=f.recompute * factor,
                      causal_skipped=f.causal_skipped * factor),  # fmt: skip
        # glibc's heap keeps freed activations and temporaries (estimate/heap.py): it grows with them
        memory=replace(profile.memory, activations=profile.memory.activations * factor,
                       heap_retention_bytes=None if (kept := profile.memory.heap_retention_bytes) is None
                       else kept * factor),  # fmt: skip
        # the memory-bound operators move bytes per sample; their count and the optimizer's do not change
        eager=None if profile.eager is None else replace(profile.eager, memory_bytes=profile.eager.memory_bytes * factor,
                                                         conv_flops=profile.eager.conv_flops * factor,
                                                         rnn_flops=profile.eager.rnn_flops * factor),  # fmt: skip
    )


def _fits(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy, catalog: Catalog,
          *, micro_batch: int, seq_len: int | None = None, profiles: Profiles | None = None) -> bool:  # fmt: skip
    return _rejection(job, profile, hw, strategy, catalog, micro_batch=micro_batch, seq_len=seq_len,
                      profiles=profiles) is None  # fmt: skip


def _rejection(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy, catalog: Catalog,
               *, micro_batch: int, seq_len: int | None = None, profiles: Profiles | None = None) -> Rejection | None:  # fmt: skip
    """Why ``micro_batch`` (and ``seq_len``) does not fit; None when it does (a batch split is not a memory matter)."""
    keep = job.global_batch if job.global_batch and job.global_batch % (micro_batch * hw.layout.data_parallel) == 0 else None
    update: dict[str, object] = {"micro_batch": micro_batch, "global_batch": keep}
    if seq_len is not None:
        update["seq_len"] = seq_len
    j = job.model_copy(update=update)
    if profile.source is ProfileSource.ANALYTIC and isinstance(j, TransformerJob):
        # the profile is hardware-free: one per (micro-batch, sequence, global batch), shared by every option
        key = (micro_batch, seq_len, keep)
        p = profiles.get(key) if profiles is not None else None
        if p is None:
            p = transformer_profile(j, catalog)
            if profiles is not None:
                profiles[key] = p
    else:
        p = _scaled(profile, micro_batch / job.micro_batch)
    e = compose(j, p, hw, strategy, catalog)
    return None if e.rejection is None or e.rejection.kind is RejectKind.BATCH else e.rejection


def _largest(ok, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ok(n), ok monotone decreasing; lo - 1 when none."""
    if not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_micro_batch(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy,
                    catalog: Catalog, *, profiles: Profiles | None = None) -> MicroBatchFit:  # fmt: skip
    """The largest micro-batch that fits ``hw`` with ``strategy``, and the accumulation that keeps the global batch.

    With a ``global_batch`` in the job, the micro-batch must divide global_batch / data-parallel, so the
    largest fitting divisor is taken; without one, any micro-batch (global batch = micro-batch × data-parallel).
    ``profiles``: a memo of rebuilt profiles for this job, to share across the options of one plan.
    """
    dp = hw.layout.data_parallel
    per_rank = (job.global_batch // dp) if job.global_batch and job.global_batch % dp == 0 else None
    if job.global_batch and per_rank is None:
        text = f"global_batch {job.global_batch} does not divide over {dp} data-parallel ranks"
        return MicroBatchFit(0, 0, job.global_batch, None, text)

    def ok(m: int) -> bool:
        return _fits(job, profile, hw, strategy, catalog, micro_batch=m, profiles=profiles)

    if per_rank is not None:
        divisors = sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True)
        best = next((d for d in divisors if ok(d)), 0)
        accumulation = per_rank // best if best else 0
        global_batch = job.global_batch or 0
    else:
        best = _largest(ok, 1, MAX_MICRO_BATCH)
        best = max(best, 0)
        accumulation = 1 if best else 0
        global_batch = best * dp
    longest = None
    if isinstance(job, TransformerJob) and profile.source is ProfileSource.ANALYTIC:
        longest = max(0, _largest(lambda s: _fits(job, profile, hw, strategy, catalog, micro_batch=1, seq_len=s,
                                                  profiles=profiles), 1, MAX_SEQ_LEN))  # fmt: skip
    if best == 0:
        why = _rejection(job, profile, hw, strategy, catalog, micro_batch=1)
        text = "even micro-batch 1 does not fit" + (f" ({why.text})" if why else "") + (f"; at micro-batch 1 the longest sequence that fits is {longest}"
                                                    if longest else "")  # fmt: skip
    else:
        text = f"micro-batch up to {best} fits"
        if per_rank is not None:
            text += f", with {accumulation} accumulation step{'s' if accumulation > 1 else ''} for global_batch {global_batch}"
        if longest:
            text += f"; at micro-batch 1 sequences up to {longest} tokens fit"
    return MicroBatchFit(best, accumulation, global_batch, longest, text)


@dataclass(frozen=True)
class CheckpointFit:
    """Under full checkpointing: the fewest blocks checkpointed that still fit, and the step time that saves."""

    blocks: int  # the model's blocks
    checkpointed: int  # the fewest checkpointed that fit (the job's own count when none fewer does)
    step_time_s: float  # at that count
    job_step_time_s: float  # at the job's own count
    text: str

    def to_dict(self) -> dict[str, object]:
        return {"blocks": self.blocks, "fewest_checkpointed_blocks": self.checkpointed,
                "checkpoint_fraction": self.checkpointed / self.blocks, "step_time_s": self.step_time_s,
                "job_step_time_s": self.job_step_time_s, "text": self.text}  # fmt: skip


def _clear(e: Estimate) -> bool:
    return e.fits and not e.borderline


def least_checkpointing(job: TransformerJob, e: Estimate, catalog: Catalog) -> CheckpointFit | None:
    """The fewest blocks full checkpointing can wrap (knobs.checkpoint_fraction) with the option of ``e`` still fitting
    and not borderline (:attr:`Estimate.borderline`: a suggestion to spend memory leaves the estimator's measured error
    band free).  Each block left whole keeps its activations but is not run again in backward; memory grows as blocks
    are left whole, so the count is found by bisection over re-composed estimates.  None unless the job checkpoints
    fully (from the formulas) and ``e`` fits."""
    if job.activation_checkpointing is not Checkpointing.FULL or not e.fits:
        return None
    strategy = Strategy(e.strategy)
    current, blocks = checkpointed_count(resolve_transformer(job, catalog).arch, effective_knobs(job, catalog))

    @functools.cache
    def at(k: int) -> Estimate:  # each count composed once; the job's own count too, on the same (uncalibrated) basis
        knobs = job.knobs.model_copy(update={"checkpoint_fraction": None if k in (0, blocks) else k / blocks})
        # no block checkpointed is no checkpointing (a share of 0 is not a knob value)
        update = {"knobs": knobs} if k else {"knobs": knobs, "activation_checkpointing": Checkpointing.NONE}
        j = job if k == current else job.model_copy(update=update)
        return compose(j, transformer_profile(j, catalog), e.hardware, strategy, catalog)

    # the largest number of whole blocks that fits outside the error band (0 when only the job's own count does)
    whole = _largest(lambda n: _clear(at(current - n)), 0, current)
    fewest = current - max(whole, 0)
    best, own = at(fewest), at(current)
    if fewest == current:
        text = f"checkpointing fewer than {current} of the {blocks} blocks does not fit outside the estimator's error band"
    else:
        saved = 1 - best.step_time_s / own.step_time_s
        what = ("no checkpointing fits outside the error band (activation_checkpointing: none)" if fewest == 0 else
                f"checkpointing {fewest} of the {blocks} blocks fits outside the error band (knobs.checkpoint_fraction: "
                f"{fewest / blocks:.3g})")  # fmt: skip
        text = f"{what}; step {best.step_time_s:.3g} s instead of {own.step_time_s:.3g} s ({saved:.0%} less)"
    return CheckpointFit(blocks, fewest, best.step_time_s, own.step_time_s, text)


def micro_batch_fit(job: TorchJob | TransformerJob, e: Estimate, catalog: Catalog, *,
                    profile: StepProfile | None = None, trace: bool = False,
                    profiles: Profiles | None = None) -> MicroBatchFit:  # fmt: skip
    """:func:`max_micro_batch` for the option of estimate ``e`` (the job's profile made once, or reused;
    ``profiles``: a memo shared by the options of one plan of this job)."""
    from trainplan.planner.core import job_profile

    prof = profile or job_profile(job, catalog, trace=trace)
    return max_micro_batch(job, prof, e.hardware, Strategy(e.strategy), catalog, profiles=profiles)
