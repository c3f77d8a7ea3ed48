"""knobs.checkpoint_fraction: full activation checkpointing on a share of the blocks (torchtitan's former layer-level
option, Megatron-Core's ``recompute_method: block``).

The formulas are checked term by term against the same job with every block checkpointed and with none, and against
a trace of the real model, where ``torch.utils.checkpoint`` wraps the chosen blocks and autograd decides what stays."""

from __future__ import annotations

import pytest

from trainplan.catalog import get_catalog
from trainplan.cli.main import main
from trainplan.errors import SpecError
from trainplan.estimate.memory import checkpointed_blocks, is_checkpointed_block
from trainplan.estimate.parallel import stage_loads
from trainplan.estimate.stack import effective_knobs
from trainplan.estimate.transformer import block_activation_bytes, resolve_transformer, transformer_profile
from trainplan.spec import parse_job
from trainplan.strategies import Layout

CAT = get_catalog()
TINY = {"layers": 8, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 688, "vocab": 1000, "max_seq_len": 512}


def job(fraction: float | None, *, model: object = "llama-3-8b", ac: str = "full", **kw: object):
    data = {"kind": "transformer", "model": model, "method": "full", "seq_len": 4096, "micro_batch": 1,
            "global_batch": 8, "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": ac,
            "tokens": 1e9}  # fmt: skip
    if fraction is not None:
        data["knobs"] = {"checkpoint_fraction": fraction}
    data.update(kw)
    return parse_job(data)


def acts(j) -> float:  # noqa: ANN001
    return block_activation_bytes(j, resolve_transformer(j, CAT).arch, effective_knobs(j, CAT))


def test_the_blocks_chosen_are_torchtitans_every_nth() -> None:
    """For a share 1/N the wrapped blocks are torchtitan's layer-level ones: the N-th, 2N-th … counting from 1."""
    for n in (1, 2, 3, 4):
        assert [i for i in range(32) if is_checkpointed_block(i, 1 / n)] == [i for i in range(32) if (i + 1) % n == 0]
    assert checkpointed_blocks(32, 0.75) == sum(is_checkpointed_block(i, 0.75) for i in range(32)) == 24
    assert checkpointed_blocks(80, 0.1) == 8 and checkpointed_blocks(3, 0.2) == 0


def test_each_checkpointed_block_trades_its_activations_for_its_input() -> None:
    """Llama-3-8B (32 blocks): all blocks checkpointed is the default; each block left out of the share adds what a
    block keeps whole and gives back its s·b·h input, the one rebuilt block staying the same."""
    full, none = acts(job(None)), acts(job(None, ac="none"))
    assert acts(job(1.0)) == full
    arch = resolve_transformer(job(None), CAT).arch
    block_input = 4096 * arch.hidden * 2
    step = (none / 32) - block_input  # one block kept whole instead of checkpointed
    for f, k in ((0.75, 24), (0.5, 16), (0.25, 8)):
        assert acts(job(f)) == pytest.approx(full + (32 - k) * step, rel=1e-12)


def test_the_recompute_flops_scale_with_the_share() -> None:
    full = transformer_profile(job(None), CAT).flops
    half = transformer_profile(job(0.5), CAT).flops
    assert half.recompute == pytest.approx(full.recompute / 2, rel=1e-12)
    assert (half.forward, half.backward) == (full.forward, full.backward)
    assert half.split.bytes_backward < full.split.bytes_backward


def test_a_pipeline_stage_keeps_the_share_of_its_blocks_whole() -> None:
    """The split (estimate/parallel.py): per block, share × input + (1 − share) × the whole block — linear in the share."""
    loads = {f: stage_loads(transformer_profile(job(f, model="llama-3.1-70b"), CAT).split,
                            Layout(8, 4, tp=8, pp=4, sequence_parallel=True), 16)[0].activations
             for f in (1.0, 0.75, 0.5)}  # fmt: skip
    assert loads[0.75] > loads[1.0]
    assert loads[0.5] - loads[0.75] == pytest.approx(loads[0.75] - loads[1.0], rel=1e-9)


def test_the_trace_wraps_the_share_and_autograd_agrees() -> None:
    """A trace of a tiny Llama (real autograd, torch.utils.checkpoint on the chosen blocks): its recomputed FLOPs are the
    share of all blocks', its activations grow by the same amount for each block left whole, and the formulas' step
    per block is the trace's within 15% (the formulas' per-block count against autograd's, at this tiny width)."""
    from trainplan.estimate.torchjob import trace_transformer_job

    small = dict(model=TINY, seq_len=256, micro_batch=2, global_batch=2)
    traced = {f: trace_transformer_job(job(f, **small), CAT) for f in (1.0, 0.75, 0.5, 0.25)}
    assert traced[0.5].flops.recompute == pytest.approx(traced[1.0].flops.recompute / 2, rel=0.01)
    assert traced[0.25].flops.recompute == pytest.approx(traced[1.0].flops.recompute / 4, rel=0.01)
    steps = [traced[b].memory.activations - traced[a].memory.activations for a, b in ((0.75, 0.5), (0.5, 0.25))]
    assert steps[0] > 0 and steps[1] == pytest.approx(steps[0], rel=0.02)  # 2 blocks whole more, each time
    analytic = acts(job(0.25, **small)) - acts(job(0.5, **small))
    assert analytic == pytest.approx(steps[1], rel=0.15)


@pytest.mark.parametrize(("change", "message"), [
    ({"activation_checkpointing": "selective"}, "needs activation_checkpointing: full"),
    ({"method": "lora"}, "LoRA and QLoRA checkpoint every block or none"),
])  # fmt: skip
def test_a_share_without_full_checkpointing_of_full_training_is_refused(change: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        effective_knobs(job(0.5, **change), CAT)
    assert err.value.field == "knobs.checkpoint_fraction"


def test_the_cli_refuses_a_share_out_of_range_in_one_line(tmp_path, capsys) -> None:  # noqa: ANN001
    path = tmp_path / "job.yaml"
    path.write_text("kind: transformer\nmodel: llama-3-8b\nseq_len: 4096\nactivation_checkpointing: full\n"
                    "micro_batch: 1\ntokens: 1.0e9\nknobs:\n  checkpoint_fraction: 1.5\n")  # fmt: skip
    assert main(["estimate", str(path), "--gpu", "H100-80GB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "knobs.checkpoint_fraction" in err and "\n" not in err and "Traceback" not in err


def test_a_share_that_does_not_fit_is_told_to_checkpoint_every_block() -> None:
    """Llama-3-8B at 8K tokens, micro-batch 2, FSDP on 8 H100s: a quarter of the blocks checkpointed does not fit, every
    block does — and the fit hint says so."""
    from trainplan.catalog import find_accelerator
    from trainplan.estimate.compose import compose
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.planner.core import fit_hint
    from trainplan.strategies import Strategy

    quarter = job(0.25, seq_len=8192, micro_batch=2, global_batch=16)
    hw = hardware_for_gpu(find_accelerator("H100-80GB", CAT), CAT, gpus=8)
    assert not compose(quarter, transformer_profile(quarter, CAT), hw, Strategy.FSDP, CAT).fits
    every = job(None, seq_len=8192, micro_batch=2, global_batch=16)
    assert compose(every, transformer_profile(every, CAT), hw, Strategy.FSDP, CAT).fits
    assert "fits with activation checkpointing on every block (knobs.checkpoint_fraction: 1)" in fit_hint(quarter, hw, Strategy.FSDP, CAT)


def test_estimate_finds_the_fewest_blocks_to_checkpoint(tmp_path, capsys) -> None:  # noqa: ANN001
    """`estimate --max-micro-batch` under full checkpointing: the fewest checkpointed blocks that still fit outside the
    error band — one fewer does not — and the step time that saves (each whole block is not run again)."""
    import json

    from trainplan.catalog import find_accelerator
    from trainplan.estimate.compose import compose
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.planner.fit import least_checkpointing
    from trainplan.strategies import Strategy

    j = job(None, seq_len=8192, global_batch=16)
    hw = hardware_for_gpu(find_accelerator("H100-80GB", CAT), CAT, gpus=8)
    e = compose(j, transformer_profile(j, CAT), hw, Strategy.FSDP, CAT)
    fit = least_checkpointing(j, e, CAT)
    assert fit is not None and 0 < fit.checkpointed < fit.blocks == 32

    def at(k: int):  # noqa: ANN202
        jk = job(k / 32, seq_len=8192, global_batch=16)
        return compose(jk, transformer_profile(jk, CAT), hw, Strategy.FSDP, CAT)

    assert at(fit.checkpointed).fits and not at(fit.checkpointed).borderline
    assert not (at(fit.checkpointed - 1).fits and not at(fit.checkpointed - 1).borderline)
    assert fit.step_time_s == at(fit.checkpointed).step_time_s < e.step_time_s == fit.job_step_time_s
    assert least_checkpointing(job(None, ac="selective"), e, CAT) is None  # only under full checkpointing
    path = tmp_path / "job.yaml"
    path.write_text("kind: transformer\nmodel: llama-3-8b\nseq_len: 8192\nmicro_batch: 1\nglobal_batch: 16\n"
                    "activation_checkpointing: full\ntokens: 1.0e9\n")  # fmt: skip
    assert main(["estimate", str(path), "--gpu", "H100-80GB", "--gpus", "8", "--strategy", "fsdp", "--max-micro-batch",
                 "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoint_fit"]["fewest_checkpointed_blocks"] == fit.checkpointed


def test_where_no_checkpointing_fits_the_fewest_is_none_priced_as_none() -> None:
    """At 1K tokens Llama-3-8B fits 8 H100s under FSDP with no checkpointing at all: the search ends at 0 blocks, and
    prices that as the job without checkpointing (not as a share of 0, which is no knob value)."""
    from trainplan.catalog import find_accelerator
    from trainplan.estimate.compose import compose
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.planner.fit import least_checkpointing
    from trainplan.strategies import Strategy

    hw = hardware_for_gpu(find_accelerator("H100-80GB", CAT), CAT, gpus=8)
    full, none = job(None, seq_len=1024), job(None, ac="none", seq_len=1024)
    e_none = compose(none, transformer_profile(none, CAT), hw, Strategy.FSDP, CAT)
    assert e_none.fits and not e_none.borderline
    fit = least_checkpointing(full, compose(full, transformer_profile(full, CAT), hw, Strategy.FSDP, CAT), CAT)
    assert fit.checkpointed == 0 and fit.step_time_s == e_none.step_time_s
    assert fit.text.startswith("no checkpointing fits outside the error band (activation_checkpointing: none)")


def test_a_share_that_checkpoints_no_block_is_refused() -> None:
    """0.2 of a 3-block model wraps ⌊0.6⌋ = 0 blocks: refused in one line, not read as no checkpointing."""
    tiny = job(0.2, model={**TINY, "layers": 3}, seq_len=256)
    with pytest.raises(SpecError, match="checkpoints none of them") as err:
        transformer_profile(tiny, CAT)
    assert err.value.field == "knobs.checkpoint_fraction" and "\n" not in str(err.value)
