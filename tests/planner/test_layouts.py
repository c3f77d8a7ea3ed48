"""The layout search (planner/layouts.py) against a brute-force search on small clusters, and in `plan`."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.parallel import layout_error
from trainplan.estimate.transformer import transformer_profile
from trainplan.planner.core import plan_job
from trainplan.planner.layouts import layouts_for, states_floor
from trainplan.spec import parse_job
from trainplan.strategies import Layout, Strategy

CAT = get_catalog()


def job_for(model: str, **kw: object):
    data = {"kind": "transformer", "model": model, "method": "full", "seq_len": 4096, "micro_batch": 1,
            "global_batch": 64, "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": "selective",
            "tokens": 1e9}  # fmt: skip
    data.update(kw)
    return parse_job(data)


def brute_force(job, prof, hw):
    """Every valid layout and sharding on ``hw``, estimated."""
    base = hw.layout
    out = []
    for tp, pp, vpp, strategy in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2), (Strategy.ZERO1, Strategy.FSDP)):
        try:
            lay = Layout(base.gpus_per_node, base.nodes, tp=tp, pp=pp, vpp=vpp, sequence_parallel=tp > 1)
        except Exception:
            continue
        if not lay.model_parallel or layout_error(prof.split, lay, strategy):
            continue
        out.append(compose(job, prof, replace(hw, layout=lay), strategy, CAT))
    return out


@pytest.mark.parametrize(("model", "gpu", "nodes", "gb"), [
    ("llama-2-70b", "A100-80GB", 4, 64),
    ("llama-2-70b", "H100-80GB", 4, 128),
    ("llama-3-8b", "A100-40GB", 1, 32),
    ("llama-2-13b", "A100-40GB", 2, 64),
])  # fmt: skip
def test_search_finds_a_layout_within_5_percent_of_the_fastest(model: str, gpu: str, nodes: int, gb: int) -> None:
    job = job_for(model, global_batch=gb)
    prof = transformer_profile(job, CAT)
    hw = hardware_for_gpu(find_accelerator(gpu, CAT), CAT, gpus=8, nodes=nodes)
    every = brute_force(job, prof, hw)
    searched = [compose(job, prof, h, s, CAT) for h, s in layouts_for(job, prof, hw, CAT)]
    oracle = [e for e in every if e.fits]
    found = [e for e in searched if e.fits]
    assert oracle, "the brute force finds a fitting layout"
    assert found, "so must the search"
    best = min(e.step_time_s for e in oracle)
    assert min(e.step_time_s for e in found) <= 1.05 * best
    assert len(searched) < len(every)  # it prunes: fewer layouts estimated than the brute force's


@pytest.mark.parametrize(("model", "gpu", "gpus", "nodes"), [
    ("llama-2-70b", "A100-80GB", 8, 4),
    ("llama-2-70b", "A100-40GB", 8, 1),
    ("mixtral-8x7b", "H100-80GB", 8, 2),
    ("llama-3-8b", "A100-40GB", 4, 1),
])  # fmt: skip
def test_states_floor_is_below_every_layouts_peak(model: str, gpu: str, gpus: int, nodes: int) -> None:
    """The floor that lets the search skip hardware is a lower bound: no layout or sharding peaks under it."""
    job = job_for(model)
    prof = transformer_profile(job, CAT)
    hw = hardware_for_gpu(find_accelerator(gpu, CAT), CAT, gpus=gpus, nodes=nodes)
    every = brute_force(job, prof, hw)
    assert every
    floor = states_floor(job, prof, gpus * nodes)
    assert floor > 0
    assert min(e.memory.peak for e in every) >= floor


def test_hardware_under_the_floor_is_skipped_and_nothing_there_fits() -> None:
    job = job_for("llama-2-70b")
    prof = transformer_profile(job, CAT)
    hw = hardware_for_gpu(find_accelerator("A100-40GB", CAT), CAT, gpus=8, nodes=1)
    assert states_floor(job, prof, 8) > 40 * 2**30  # 70B × 16 bytes over 8 GPUs
    assert list(layouts_for(job, prof, hw, CAT)) == []
    assert not any(e.fits for e in brute_force(job, prof, hw))


def test_plan_offers_3d_layouts_where_data_parallel_alone_cannot_fit() -> None:
    """The issue's case: a 70B pretraining with Megatron's selective checkpointing (the attention core recomputed)
    on up to 1,024 GPUs, which no data-parallel strategy fits (activations of 8,192 tokens per GPU); tensor +
    pipeline parallel layouts do."""
    job = job_for("llama-2-70b", seq_len=4096, micro_batch=1, global_batch=1024, tokens=2e12,
                  constraints={"max_gpus": 1024}, knobs={"selective_recompute": "attention-core"})  # fmt: skip
    plan = plan_job(job, CAT)
    assert plan.options
    assert all(e.hardware.layout.model_parallel for e in plan.options[:5])
    assert max(e.devices for e in plan.options) > 512  # no silent cap at 64 nodes
    best = plan.fastest
    assert best is not None and best.hardware.layout.tp > 1 and best.fits


def test_plan_lists_a_layout_only_where_it_beats_data_parallel_on_the_same_hardware() -> None:
    """Same hardware, same price per hour: a tensor / pipeline layout no faster than the fastest data-parallel
    strategy that fits adds nothing and is not listed (the 7B reference fine-tune)."""
    job = job_for("llama-2-7b", seq_len=2048, micro_batch=4, global_batch=64, tokens=1e8)
    plan = plan_job(job, CAT, hints=False)
    by_hw: dict[str, float] = {}
    for e in plan.options:
        if not e.hardware.layout.model_parallel:
            by_hw[e.hardware.label] = min(by_hw.get(e.hardware.label, float("inf")), e.step_time_s)
    layouts = [e for e in plan.options if e.hardware.layout.model_parallel]
    assert layouts, "some layouts beat data parallelism somewhere"
    for e in layouts:
        assert e.step_time_s < by_hw.get(e.hardware.label, float("inf"))
    assert not any(e.hardware.layout.model_parallel for e in plan.rejected if e.hardware.label in by_hw)
