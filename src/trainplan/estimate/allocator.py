"""A simulation of PyTorch's CUDA caching allocator: how much it *reserves* for a sequence of allocations.

``torch.cuda.max_memory_allocated`` counts live blocks; ``max_memory_reserved``
(and nvidia-smi, less the CUDA context) counts the segments the allocator got
from the driver and keeps.  The difference is fragmentation: freed blocks that
the next request cannot use.  This module replays allocation and free events
through the allocator's rules, as c10/cuda/CUDACachingAllocator.cpp states them:

* sizes are rounded up to 512 bytes (``kMinBlockSize``);
* requests of at most 1 MiB (``kSmallSize``) come from the small pool, whose
  segments are 2 MiB (``kSmallBuffer``); larger requests come from the large
  pool: below 10 MiB (``kMinLargeAlloc``) a fresh segment is 20 MiB
  (``kLargeBuffer``), from 10 MiB up the request rounded to 2 MiB (``kRoundLarge``);
* a request takes the smallest free block of its pool that fits (best fit),
  splitting it when the rest is at least 512 bytes (small pool) or more than
  1 MiB (large pool);
* a freed block merges with free neighbours of the same segment; segments are
  never returned to the driver (no ``empty_cache``, no out-of-memory retry);
* with ``expandable_segments:True`` each pool is one segment whose end grows by
  2 MiB pages as needed: a request that fits no free block extends the segment
  (reusing a free block at its end), so fragmentation across segments vanishes.

The simulation is single-stream (one training step runs on one stream) and keeps
the allocator's pool separation and its split rules; it does not model
``max_split_size_mb``, garbage-collection thresholds or the per-stream pools of
CUDA graphs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20
PAGE = 2 << 20  # expandable segments map physical memory in 2 MiB pages


def round_size(size: int) -> int:
    """The block size the allocator hands out for a request of ``size`` bytes."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """Bytes the allocator asks the driver for when no cached block fits a (rounded) request."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _should_split(rest: int, small: bool) -> bool:
    return rest >= MIN_BLOCK if small else rest > SMALL_SIZE


@dataclass
class _Pool:
    """Free blocks of one pool as (size, segment, offset), sorted for best fit."""

    small: bool
    free: list[tuple[int, int, int]] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)  # segment -> its size


@dataclass(frozen=True)
class AllocatorPeaks:
    """What a replay found: the peaks of live (allocated) and kept (reserved) bytes."""

    allocated: int
    reserved: int

    @property
    def fragmentation(self) -> float:
        """Reserved beyond allocated, as a fraction of allocated."""
        return self.reserved / self.allocated - 1.0 if self.allocated else 0.0


class CachingAllocator:
    """Replays ``malloc``/``free`` of keyed blocks and tracks allocated and reserved bytes."""

    def __init__(self, *, expandable_segments: bool = False) -> None:
        self.expandable = expandable_segments
        self.pools = {True: _Pool(small=True), False: _Pool(small=False)}
        self.live: dict[int, tuple[bool, int, int, int]] = {}  # key -> (small, segment, offset, size)
        self.free_at: dict[tuple[int, int], int] = {}  # (segment, offset) of a free block -> its size
        self.free_ending: dict[tuple[int, int], int] = {}  # (segment, end) of a free block -> its offset
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self._segments = 0

    # -------------------------------------------------------------- free-block index
    def _add_free(self, pool: _Pool, seg: int, off: int, size: int) -> None:
        bisect.insort(pool.free, (size, seg, off))
        self.free_at[(seg, off)] = size
        self.free_ending[(seg, off + size)] = off

    def _remove_free(self, pool: _Pool, seg: int, off: int, size: int) -> None:
        i = bisect.bisect_left(pool.free, (size, seg, off))
        pool.free.pop(i)
        del self.free_at[(seg, off)]
        del self.free_ending[(seg, off + size)]

    def _best_fit(self, pool: _Pool, size: int) -> tuple[int, int, int] | None:
        i = bisect.bisect_left(pool.free, (size, -1, -1))
        if i == len(pool.free):
            return None
        bsize, seg, off = pool.free[i]
        self._remove_free(pool, seg, off, bsize)
        return bsize, seg, off

    # -------------------------------------------------------------- segments
    def _new_segment(self, pool: _Pool, size: int) -> tuple[int, int, int]:
        seg = self._segments
        self._segments += 1
        pool.ends[seg] = size
        self.reserved += size
        return size, seg, 0

    def _grow(self, pool: _Pool, size: int) -> tuple[int, int, int]:
        """Expandable segments: extend the pool's one segment (reusing a free block at its end)."""
        if not pool.ends:
            return self._new_segment(pool, -(-size // PAGE) * PAGE)
        seg = next(iter(pool.ends))
        end = pool.ends[seg]
        tail_off = self.free_ending.get((seg, end))
        have = end - tail_off if tail_off is not None else 0
        if tail_off is not None:
            self._remove_free(pool, seg, tail_off, have)
        grow = -(-(size - have) // PAGE) * PAGE
        pool.ends[seg] = end + grow
        self.reserved += grow
        return have + grow, seg, (tail_off if tail_off is not None else end)

    # -------------------------------------------------------------- malloc / free
    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        block = self._best_fit(pool, size)
        if block is None:
            block = self._grow(pool, size) if self.expandable else self._new_segment(pool, segment_size(size))
        bsize, seg, off = block
        rest = bsize - size
        if _should_split(rest, small):
            self._add_free(pool, seg, off + size, rest)
        else:
            size = bsize
        self.live[key] = (small, seg, off, size)
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, key: int) -> None:
        small, seg, off, size = self.live.pop(key)
        pool = self.pools[small]
        self.allocated -= size
        start, total = off, size
        after = self.free_at.get((seg, off + size))
        if after is not None:  # merge with the free block that follows
            self._remove_free(pool, seg, off + size, after)
            total += after
        before = self.free_ending.get((seg, off))
        if before is not None:  # and with the one that precedes
            self._remove_free(pool, seg, before, off - before)
            start, total = before, total + (off - before)
        self._add_free(pool, seg, start, total)

    def peaks(self) -> AllocatorPeaks:
        return AllocatorPeaks(self.peak_allocated, self.peak_reserved)


def replay_events(events: Iterable[tuple[int, int]], *, expandable_segments: bool = False) -> AllocatorPeaks:
    """Replay (key, ±bytes) events — positive allocates ``key``, negative frees it — and return the peaks."""
    alloc = CachingAllocator(expandable_segments=expandable_segments)
    for key, delta in events:
        if delta > 0:
            if key in alloc.live:  # a key re-used after its free was not seen: free it first
                alloc.free(key)
            alloc.malloc(key, delta)
        elif delta < 0 and key in alloc.live:
            alloc.free(key)
    return alloc.peaks()
