"""A simulation of glibc's ``malloc`` for the tensors of a CPU training process: how much stays *resident*.

PyTorch's CPU allocator takes every tensor's memory from the C library (``c10/core/impl/alloc_cpu.cpp``:
``posix_memalign`` with 64-byte alignment) and gives it back with ``free``; there is no caching allocator on
CPUs.  What a training process keeps resident beyond its live tensors is therefore glibc's heap.  The rules
replayed here are glibc's (``malloc/malloc.c``, 2.26 and later; the defaults are those of mallopt(3)):

* A request of ``n`` bytes is a chunk of ``(n + 8 + 15) & ~15`` bytes, at least 32 (``request2size``).
* A chunk comes from the best-fitting free chunk of the heap (the unsorted and size-ordered bins: the smallest
  free chunk that is large enough, split when the rest is at least 32 bytes), else from the *top* chunk at the
  end of the heap.  Only when the top is too small (``sysmalloc``) does the size matter: a chunk of at least
  the *mmap threshold* gets its own ``mmap`` (page-rounded), a smaller one extends the heap with ``brk`` by
  what is missing plus ``M_TOP_PAD`` (128 KiB).
* The mmap threshold starts at 128 KiB and is *dynamic*: freeing an mmapped chunk larger than the threshold
  (and at most 32 MiB, ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit) raises the threshold to that chunk's size and
  the trim threshold to twice that.  From then on, tensors up to that size live in the heap.
* ``posix_memalign(64)`` (``_int_memalign``) asks for the chunk plus 64 + 32 bytes, and frees the unaligned
  lead and the spare tail again.  Those small chunks go first to the thread cache (7 per size, up to 1,040-byte
  chunks), which keeps them marked in use: they never merge with their neighbours, so a freed tensor next to one
  cannot merge into the top.  Beyond the cache, chunks of up to 128 bytes go to the fastbins, merged when a large
  request or a large free consolidates them.
* A freed heap chunk merges with free neighbours and with the top.  A free of at least 64 KiB
  (``FASTBIN_CONSOLIDATION_THRESHOLD``) trims the heap when the top reaches the trim threshold, giving back all
  but ``M_TOP_PAD``.  Nothing else returns heap memory to the kernel: a freed chunk below the top stays
  resident.  A freed mmapped chunk is unmapped at once.

Resident memory is the mmapped chunks alive plus the heap up to the highest byte handed out since the heap
last shrank (pages the kernel has never been asked to fault in are not resident).  The simulation follows one
arena (the training loop's thread; ``MALLOC_ARENA_MAX=1`` changes nothing measurable here), starts from an empty
heap at glibc's default threshold, and assumes each tensor's memory is written, as a kernel's output is.
Whether the alignment fragments go to the thread cache or merge at once decides a lot: on glibc 2.36 (Debian 12)
the thread-cache reading tracks the real glibc on training-like loops, the merging one does not (a 3-step loop:
real 20-23 MiB, thread cache 26, merging 11).  ``tests/estimate/test_heap.py`` checks it against the real glibc
replaying the same sequences (``measure/glibc.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

SIZE_SZ = 8
ALIGN_MASK = 15
MIN_CHUNK = 32
PAGE = 4096
TOP_PAD = 128 << 10  # M_TOP_PAD
MMAP_THRESHOLD = 128 << 10  # M_MMAP_THRESHOLD, the initial value
MMAP_THRESHOLD_MAX = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX (64-bit)
CONSOLIDATION = 64 << 10  # FASTBIN_CONSOLIDATION_THRESHOLD: frees this large may trim the heap
LARGE_REQUEST = 1024  # MIN_LARGE_SIZE: requests from here on consolidate the fastbins
ALIGNMENT = 64  # c10's gAlignment
TCACHE_MAX_CHUNK = 1040  # the chunk of the largest request the thread cache keeps (1032 bytes)
TCACHE_COUNT = 7  # chunks per thread-cache bin
FASTBIN_MAX_CHUNK = 128  # DEFAULT_MXFAST on 64-bit


def chunk_size(nbytes: int) -> int:
    """The heap chunk glibc carves for a request of ``nbytes`` (``request2size``)."""
    return max(MIN_CHUNK, (nbytes + SIZE_SZ + ALIGN_MASK) & ~ALIGN_MASK)


def _page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True)
class HeapPeaks:
    """What a replay found: the peak of live bytes (what the program asked for) and of resident bytes."""

    live: int
    resident: int
    mmap_threshold: int  # the dynamic threshold at the end

    @property
    def retained(self) -> int:
        """Resident beyond live at their peaks: what glibc kept."""
        return max(0, self.resident - self.live)


class GlibcHeap:
    """Replays ``malloc``/``free`` of keyed blocks through the rules of the module docstring."""

    def __init__(self, *, mmap_threshold: int = MMAP_THRESHOLD, dynamic: bool = True, base: int = 0) -> None:
        self.threshold = mmap_threshold
        self.trim_threshold = mmap_threshold  # M_TRIM_THRESHOLD starts at 128 KiB too
        self.dynamic = dynamic
        self.free_sizes: list[tuple[int, int]] = []  # (size, address), for best fit
        self.free_at: dict[int, int] = {}  # address -> size
        self.free_ending: dict[int, int] = {}  # end address -> start address
        self.base = base  # where the heap's first chunk starts (its offset from 64-byte alignment matters)
        self.top = self.brk = base  # the top chunk is [top, brk)
        self.touched = base  # the highest heap address handed out since the heap last shrank
        self.mapped = 0  # bytes of live mmapped chunks
        self.live: dict[int, tuple[int, int, bool]] = {}  # key -> (address, size, mmapped)
        self.tcache: dict[int, int] = {}  # chunk size -> chunks the thread cache holds (never merged)
        self.fast: list[tuple[int, int]] = []  # fastbin chunks (merged at the next consolidation)
        self.requested = self.peak_requested = self.peak_resident = 0

    @property
    def resident(self) -> int:
        return self.touched - self.base + self.mapped

    # -------------------------------------------------------------- free chunks
    def _add_free(self, addr: int, size: int) -> None:
        bisect.insort(self.free_sizes, (size, addr))
        self.free_at[addr] = size
        self.free_ending[addr + size] = addr

    def _remove_free(self, addr: int, size: int) -> None:
        del self.free_sizes[bisect.bisect_left(self.free_sizes, (size, addr))]
        del self.free_at[addr]
        del self.free_ending[addr + size]

    # -------------------------------------------------------------- glibc's internals
    def _int_malloc(self, nb: int) -> tuple[int, int, bool]:
        """(address, size, mmapped) of a chunk of at least ``nb`` bytes."""
        if nb >= LARGE_REQUEST and self.fast:  # a large request consolidates the fastbins first
            self._consolidate()
        i = bisect.bisect_left(self.free_sizes, (nb, -1))
        if i < len(self.free_sizes):  # best fit among the free chunks
            size, addr = self.free_sizes[i]
            self._remove_free(addr, size)
            if size - nb >= MIN_CHUNK:
                self._add_free(addr + nb, size - nb)
                size = nb
            return addr, size, False
        if self.brk - self.top < nb + MIN_CHUNK:  # sysmalloc
            if nb >= self.threshold:  # a chunk of its own
                return -1, _page_up(nb + SIZE_SZ), True
            self.brk += _page_up(nb + TOP_PAD + MIN_CHUNK - (self.brk - self.top))  # extend the heap, plus the pad
        addr = self.top
        self.top += nb
        return addr, nb, False

    def _int_free(self, addr: int, size: int) -> None:
        """A heap chunk goes back: to the thread cache or a fastbin (still in use to its neighbours), else merged."""
        if size <= TCACHE_MAX_CHUNK and self.tcache.get(size, 0) < TCACHE_COUNT:
            self.tcache[size] = self.tcache.get(size, 0) + 1
            return
        if size <= FASTBIN_MAX_CHUNK:
            self.fast.append((addr, size))
            return
        self._merge_free(addr, size)

    def _merge_free(self, addr: int, size: int) -> None:
        after = self.free_at.get(addr + size)
        if after is not None:  # merge with the free chunk that follows
            self._remove_free(addr + size, after)
            size += after
        before = self.free_ending.get(addr)
        if before is not None:  # and with the one that precedes
            self._remove_free(before, addr - before)
            size += addr - before
            addr = before
        if addr + size == self.top:  # into the top chunk
            self.top = addr
            size = self.brk - self.top
        else:
            self._add_free(addr, size)
        if size >= CONSOLIDATION:
            if self.fast:
                self._consolidate()
            if self.brk - self.top >= self.trim_threshold:  # systrim: give back all but the pad
                extra = (self.brk - self.top - TOP_PAD - MIN_CHUNK - 1) // PAGE * PAGE
                if extra > 0:
                    self.brk -= extra
                    self.touched = min(self.touched, self.brk)

    def _consolidate(self) -> None:
        fast, self.fast = self.fast, []
        for addr, size in fast:
            self._merge_free(addr, size)

    # -------------------------------------------------------------- posix_memalign / free
    def malloc(self, key: int, nbytes: int) -> None:
        """``posix_memalign(&p, 64, nbytes)`` as ``c10::alloc_cpu`` calls it (``_int_memalign``: a chunk with room
        to align, its unaligned lead and its spare tail freed again)."""
        nb = chunk_size(nbytes)
        addr, size, mapped = self._int_malloc(nb + ALIGNMENT + MIN_CHUNK)
        if mapped:
            self.mapped += size
        else:
            if (addr + 2 * SIZE_SZ) % ALIGNMENT:
                aligned = ((addr + 2 * SIZE_SZ + ALIGNMENT - 1) // ALIGNMENT) * ALIGNMENT - 2 * SIZE_SZ
                if aligned - addr < MIN_CHUNK:
                    aligned += ALIGNMENT
                self._int_free(addr, aligned - addr)
                size -= aligned - addr
                addr = aligned
            if size > nb + MIN_CHUNK:
                self._int_free(addr + nb, size - nb)
                size = nb
            self.touched = max(self.touched, addr + size)
        self.live[key] = (addr, size, mapped)
        self.requested += nbytes
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_resident = max(self.peak_resident, self.resident)

    def free(self, key: int, nbytes: int) -> None:
        addr, size, mapped = self.live.pop(key)
        self.requested -= nbytes
        if mapped:
            self.mapped -= size
            if self.dynamic and self.threshold < size <= MMAP_THRESHOLD_MAX:
                self.threshold, self.trim_threshold = size, 2 * size
            return
        self._int_free(addr, size)

    def peaks(self) -> HeapPeaks:
        return HeapPeaks(self.peak_requested, self.peak_resident, self.threshold)


def replay_heap(events: Iterable[tuple[int, int]], *, mmap_threshold: int = MMAP_THRESHOLD,
                dynamic: bool = True) -> HeapPeaks:  # fmt: skip
    """Replay (key, ±bytes) events — positive allocates ``key``, negative frees it — and return the peaks."""
    heap = GlibcHeap(mmap_threshold=mmap_threshold, dynamic=dynamic)
    sizes: dict[int, int] = {}
    for key, delta in events:
        if delta > 0:
            if key in heap.live:  # a key re-used after its free was not seen: free it first
                heap.free(key, sizes[key])
            sizes[key] = delta
            heap.malloc(key, delta)
        elif delta < 0 and key in heap.live:
            heap.free(key, sizes.pop(key))
    return heap.peaks()
