"""The caching-allocator simulation (estimate/allocator.py), checked on hand-worked sequences, and the reserved
figure of a traced estimate checked against the simulation of its own allocations."""

from __future__ import annotations

import pytest

from trainplan.estimate.allocator import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    replay_events,
    round_size,
    segment_size,
)

MiB = 1 << 20


def test_sizes_round_as_the_allocator_rounds() -> None:
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(4096) == SMALL_BUFFER and segment_size(MiB) == SMALL_BUFFER
    assert segment_size(MiB + 512) == LARGE_BUFFER and segment_size(9 * MiB) == LARGE_BUFFER
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(11 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_2_mib_segment() -> None:
    peaks = replay_events([(k, 100 * 1024) for k in range(20)])  # 20 × 100 KiB = 2000 KiB < 2 MiB
    assert peaks.reserved == SMALL_BUFFER and peaks.allocated == 20 * 100 * 1024
    assert replay_events([(k, 100 * 1024) for k in range(21)]).reserved == 2 * SMALL_BUFFER


def test_a_freed_block_that_is_too_small_forces_a_new_segment() -> None:
    # 6 + 6 MiB from one 20 MiB segment; the first freed leaves 6 MiB and 8 MiB holes; 12 MiB fits neither
    peaks = replay_events([(1, 6 * MiB), (2, 6 * MiB), (1, -6 * MiB), (3, 12 * MiB)])
    assert peaks.allocated == 18 * MiB and peaks.reserved == 20 * MiB + 12 * MiB


def test_neighbours_merge_so_a_larger_request_reuses_them() -> None:
    # free both 6 MiB blocks: they merge with the 8 MiB tail into the whole 20 MiB segment again
    peaks = replay_events([(1, 6 * MiB), (2, 6 * MiB), (1, -6 * MiB), (2, -6 * MiB), (3, 18 * MiB)])
    assert peaks.reserved == 20 * MiB


def test_best_fit_picks_the_smallest_hole() -> None:
    a = CachingAllocator()
    for key, size in ((1, 12 * MiB), (2, 12 * MiB), (3, 16 * MiB), (4, 12 * MiB)):
        a.malloc(key, size)
    a.free(1)  # a 12 MiB hole (its own segment)
    a.free(3)  # a 16 MiB hole
    a.malloc(5, 11 * MiB)  # fits both; best fit takes the 12 MiB one, whose 1 MiB rest is not split off
    assert a.live[5][3] == 12 * MiB and a.live[5][1] == a.live.get(5)[1]
    a.malloc(6, 16 * MiB)  # the 16 MiB hole is still there
    assert a.reserved == (12 + 12 + 16 + 12) * MiB


def test_expandable_segments_grow_instead_of_fragmenting() -> None:
    events = [(1, 6 * MiB), (2, 6 * MiB), (1, -6 * MiB), (3, 12 * MiB)]
    assert replay_events(events, expandable_segments=True).reserved == 24 * MiB
    # freed space at the end of the segment is reused by growing it
    tail = [(1, 6 * MiB), (2, 6 * MiB), (2, -6 * MiB), (3, 12 * MiB)]
    assert replay_events(tail, expandable_segments=True).reserved == 18 * MiB
    # (the default allocator fits it too: the freed 6 MiB merges with the segment's 8 MiB tail)
    assert replay_events(tail).reserved == 20 * MiB


def test_a_traced_estimate_reserves_what_the_simulation_of_its_own_step_reserves() -> None:
    pytest.importorskip("transformers")
    from trainplan.catalog import find_accelerator, get_catalog
    from trainplan.estimate.compose import compose
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.torchjob import trace_transformer_job
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    arch = {"layers": 4, "hidden": 512, "heads": 8, "ffn_hidden": 1408, "vocab": 8000, "max_seq_len": 512}
    job = parse_job({"kind": "transformer", "model": arch, "seq_len": 512, "micro_batch": 4, "steps": 1})
    profile = trace_transformer_job(job)
    sim = profile.memory.reserve_bytes
    assert sim is not None and 0.0 <= profile.memory.expandable_reserve_bytes <= sim
    cat = get_catalog()
    e = compose(job, profile, hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1), Strategy.SINGLE, cat)
    m = e.memory
    beyond = max(0.0, m.allocated - profile.memory.single_device_peak)
    assert beyond < 0.05 * m.allocated  # one device, no sharding buffers: the composed step is the traced one
    assert m.reserved - m.allocated == pytest.approx(sim + cat.assumption("allocator_fragmentation") * beyond, rel=1e-6)
    # sharding adds buffers the trace never saw: those get the default fraction, not the step's own reserve
    z2 = compose(job, profile, hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=2), Strategy.ZERO2, cat).memory
    assert z2.reserved - z2.allocated < sim + 0.1 * z2.allocated
