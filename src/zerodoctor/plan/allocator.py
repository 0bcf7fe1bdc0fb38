"""A small simulator of PyTorch's CUDA caching allocator, to predict reserved-but-unallocated memory.

`torch.cuda.max_memory_reserved` (what an OOM message and nvidia-smi see, less the CUDA context) is larger
than `max_memory_allocated` because the allocator caches freed blocks, rounds requests and splits cached
blocks for smaller requests, so a later large request may find no free block big enough and take a new
segment from the device. How much depends on the order and sizes of a step's allocations, not on a constant.
`Allocator` replays a sequence of `Alloc` / `Free` events with the rules of `c10/cuda/CUDACachingAllocator.cpp`
(read at PyTorch main, commit 001074d2; the H100 runs it is checked against used torch 2.11; older copies of
the file have the same size, split and release rules, with a single `roundup_power2_divisions` setting; not
checked release by release), each rule cited by the C++ function it comes from:

* `round_size`: every request is rounded up to a multiple of kMinBlockSize (512 B); with
  `roundup_power2_divisions` a request is rounded to the next of N divisions between powers of two.
* `get_pool`: requests up to kSmallSize (1 MiB) use the small pool, larger ones the large pool; the pools
  never share blocks.
* `get_allocation_size`: a new segment is kSmallBuffer (2 MiB) for a small request, kLargeBuffer (20 MiB)
  for a request under kMinLargeAlloc (10 MiB), else the request rounded up to kRoundLarge (2 MiB).
* `get_free_block`: best fit -- the smallest cached free block of the same pool and stream that is at
  least as large (ties by address); a request under `max_split_size` never takes an oversize block
  (>= max_split_size), and an oversize request takes one only if it is less than kLargeBuffer larger.
* `should_split` / `alloc_found_block`: the found block is split when the remainder is >= kMinBlockSize
  (small pool, or any pool with expandable segments) or > kSmallSize (large pool, and only for requests
  under `max_split_size`); the remainder stays cached in the same segment.
* `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours, only inside its own
  segment (blocks of different `cudaMalloc` segments are never adjacent).
* `malloc` / `alloc_block` / `release_available_cached_blocks` / `release_cached_blocks`: when no cached
  block fits, a new segment is allocated; if the device refuses (here: reserved + segment > `capacity`), the
  allocator frees oversize cached blocks (only with `max_split_size`), then frees every cached block that is
  a whole segment (never split) and retries once (`num_alloc_retries`); only then is an OOM raised.
* `emptyCache` = `release_cached_blocks`: a segment with any block in use stays reserved.
* expandable segments (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; `ExpandableSegment`,
  `find_expandable_block`, `map_block`, `unmap_block`): one growing segment per pool and stream whose
  pages (2 MiB small pool, 20 MiB large pool) are mapped at the lowest free address that fits; blocks
  split down to kMinBlockSize; freeing the cache (or an OOM retry) unmaps every whole free page.

What is not modelled: several streams' event-deferred frees (`recordStream`, NCCL's side streams; a block
used on another stream is freed when its event completes, modelled here as freed at once), CUDA graph
private pools, `garbage_collection_threshold`, memory fractions. Pure Python, no torch import.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from zerodoctor.plan.inputs import PlanInputs, Training, ZeroSettings

# c10/cuda/CUDACachingAllocator.cpp, namespace constants
K_MIN_BLOCK_SIZE = 512
"""kMinBlockSize: all sizes are rounded to at least 512 bytes."""
K_SMALL_SIZE = 1 << 20
"""kSmallSize: largest "small" allocation is 1 MiB."""
K_SMALL_BUFFER = 2 << 20
"""kSmallBuffer: "small" allocations are packed in 2 MiB blocks (also the small pool's expandable page)."""
K_LARGE_BUFFER = 20 << 20
"""kLargeBuffer: "large" allocations may be packed in 20 MiB blocks (also the large pool's expandable page)."""
K_MIN_LARGE_ALLOC = 10 << 20
"""kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer."""
K_ROUND_LARGE = 2 << 20
"""kRoundLarge: round up large allocations to 2 MiB."""

_NO_LIMIT = 1 << 62
_ADDRESS_SPACE = 1 << 48
"""An expandable segment reserves address space for 1.125 x the device; any size far above it serves."""


# ---- events -------------------------------------------------------------------------------------------------


class Alloc(NamedTuple):
    """A tensor of `nbytes` is created and known as `id` until its `Free`."""

    id: int | str
    nbytes: int
    stream: int = 0


class Free(NamedTuple):
    """The tensor `id` is freed (its storage's last reference dropped)."""

    id: int | str


class EmptyCache(NamedTuple):
    """`torch.cuda.empty_cache()`: every cached block that is a whole segment goes back to the device."""


class Mark(NamedTuple):
    """A phase boundary: the peaks since the previous mark are recorded under `name` and reset
    (`torch.cuda.reset_peak_memory_stats`); with `empty_cache` the cache is emptied first."""

    name: str
    empty_cache: bool = False


Event = Alloc | Free | EmptyCache | Mark


@dataclass(frozen=True)
class AllocatorConfig:
    """`PYTORCH_CUDA_ALLOC_CONF` settings that change the rules, and the device memory the allocator may
    reserve (`capacity`: device total minus what lives outside the allocator; None = unlimited)."""

    expandable_segments: bool = False
    max_split_size: int | None = None
    roundup_power2_divisions: int = 0
    capacity: int | None = None


@dataclass(frozen=True)
class PhaseStats:
    """Peaks between two marks, as `max_memory_allocated` / `max_memory_reserved` report them."""

    name: str
    allocated_peak: int
    reserved_peak: int
    segments_peak: int
    alloc_retries: int
    floor_peak: int = 0
    """The reserved bytes this phase cannot do without: at every new segment, the reserved bytes once every
    cached whole segment is released (what `release_cached_blocks` + retry achieves when the device is full).
    With a capacity at or above it the phase runs, with retries; `reserved_peak` is what it takes when the
    device has room to spare (what `max_memory_reserved` reads on a roomy GPU)."""

    @property
    def gap(self) -> int:
        """Reserved peak minus allocated peak: what an OOM message calls "reserved but unallocated"."""
        return self.reserved_peak - self.allocated_peak

    @property
    def floor_gap(self) -> int:
        """The part of the gap that releasing the cache cannot recover (fragmentation inside segments in use)."""
        return max(self.floor_peak - self.allocated_peak, 0)


@dataclass(frozen=True)
class OutOfMemory:
    """The request that failed after the allocator freed its cache and retried."""

    event_index: int
    id: int | str
    requested: int
    allocated: int
    reserved: int


@dataclass(frozen=True)
class ReplayResult:
    allocated_peak: int
    reserved_peak: int
    segments: int
    segments_peak: int
    alloc_retries: int
    oom: OutOfMemory | None
    phases: tuple[PhaseStats, ...] = ()

    @property
    def gap(self) -> int:
        return self.reserved_peak - self.allocated_peak

    def phase(self, name: str) -> PhaseStats:
        return next(p for p in self.phases if p.name == name)


class SimulatedOOM(Exception):
    """The allocator could not serve a request even after releasing its cache."""

    def __init__(self, oom: OutOfMemory) -> None:
        super().__init__(f"simulated CUDA OOM for {oom.requested} bytes ({oom.id!r})")
        self.oom = oom


# ---- size rules ---------------------------------------------------------------------------------------------


def round_size(size: int, roundup_power2_divisions: int = 0) -> int:
    """`DeviceCachingAllocator::round_size`: at least kMinBlockSize, a multiple of it, or (with
    `roundup_power2_divisions` N > 1 and size > N x 512) the next of N equal divisions between powers of two
    (`roundup_power2_next_division`)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = roundup_power2_divisions
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the segment `cudaMalloc`ed for a (rounded) request no cached block serves."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


# ---- the simulator ------------------------------------------------------------------------------------------


class _Segment:
    __slots__ = ("base", "page", "expandable")

    def __init__(self, base: int, page: int, expandable: bool) -> None:
        self.base = base
        self.page = page
        self.expandable = expandable


class _Block:
    __slots__ = ("ptr", "size", "stream", "small", "allocated", "prev", "next", "mapped", "seg")

    def __init__(self, ptr: int, size: int, stream: int, small: bool, seg: _Segment) -> None:
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.mapped = True
        self.seg = seg

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.ptr)  # BlockComparatorSize: stream, size, address


class _Pool:
    """`BlockPool`: cached free blocks ordered by (stream, size, address); unmapped expandable ranges by
    (stream, address) (`BlockComparatorAddress`)."""

    __slots__ = ("small", "keys", "blocks", "unmapped")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}
        self.unmapped: dict[tuple[int, int], _Block] = {}

    def insert(self, b: _Block) -> None:
        k = b.key
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = b.key
        i = bisect.bisect_left(self.keys, k)
        del self.keys[i]
        del self.blocks[k]

    def insert_unmapped(self, b: _Block) -> None:
        self.unmapped[(b.stream, b.ptr)] = b

    def remove_unmapped(self, b: _Block) -> None:
        del self.unmapped[(b.stream, b.ptr)]


class Allocator:
    """The device caching allocator of one GPU (`DeviceCachingAllocator`), in bytes only."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = config or AllocatorConfig()
        self._max_split = self.config.max_split_size or _NO_LIMIT
        self._capacity = self.config.capacity if self.config.capacity is not None else _NO_LIMIT
        self._pools = {True: _Pool(True), False: _Pool(False)}
        self._live: dict[int | str, _Block] = {}
        self._next_ptr = 1 << 30
        self.allocated = 0
        self.reserved = 0
        self.segments = 0
        self.allocated_peak = 0
        self.reserved_peak = 0
        self.segments_peak = 0
        self.alloc_retries = 0
        self.floor_peak = 0

    # -- public API -------------------------------------------------------------------------------------------

    def malloc(self, id: int | str, nbytes: int, stream: int = 0) -> int:
        """`DeviceCachingAllocator::malloc`; returns the block size charged to `allocated`. Raises
        `SimulatedOOM` when the request fails after the retries."""
        if id in self._live:
            raise ValueError(f"allocation id {id!r} is already live")
        size = round_size(nbytes, self.config.roundup_power2_divisions)
        small = size <= K_SMALL_SIZE  # get_pool
        pool = self._pools[small]
        block = self._get_free_block(pool, size, stream)
        if block is None:
            block = (
                self._alloc_block(pool, size, stream)
                or (self._release_available_cached_blocks(pool, size, stream)
                    and self._alloc_block(pool, size, stream))
                or self._retry_after_release(pool, size, stream)
            )  # fmt: skip
        if block is None:
            raise SimulatedOOM(OutOfMemory(-1, id, nbytes, self.allocated, self.reserved))
        if self._should_split(block, size):
            block = self._split(pool, block, size)
        block.allocated = True
        self._live[id] = block
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        return block.size

    def free(self, id: int | str) -> None:
        """`DeviceCachingAllocator::free` -> `free_block`: merge with free neighbours, cache the block."""
        block = self._live.pop(id)
        block.allocated = False
        self.allocated -= block.size
        pool = self._pools[block.small]
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)

    def empty_cache(self) -> None:
        """`emptyCache` -> `release_cached_blocks`."""
        self._release_cached_blocks()

    def reset_peaks(self) -> None:
        """`resetPeakStats`: peak = current."""
        self.allocated_peak = self.allocated
        self.reserved_peak = self.reserved
        self.segments_peak = self.segments
        self.floor_peak = self.reserved - self._releasable()

    def live_bytes(self, id: int | str) -> int:
        return self._live[id].size

    # -- rules ------------------------------------------------------------------------------------------------

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """`get_free_block`: the smallest cached block >= size on this stream (best fit)."""
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        b = pool.blocks[keys[i]]
        if b.seg.expandable:
            # An expandable block counts the unmapped space after it as its size for the best fit.
            def exp_size(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            j = i + 1
            while j < len(keys) and keys[j][0] == stream:
                nb = pool.blocks[keys[j]]
                if not (b.seg.expandable and exp_size(nb) < exp_size(b)):
                    break
                b, j = nb, j + 1
        if size < self._max_split and b.size >= self._max_split:
            return None  # do not return an oversized block for a large request
        if size >= self._max_split and b.size >= size + K_LARGE_BUFFER:
            return None  # oversize blocks are rounded up only within kLargeBuffer
        pool.remove(b)
        return b

    def _should_split(self, block: _Block, size: int) -> bool:
        """`should_split`."""
        remaining = block.size - size
        if block.small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _split(self, pool: _Pool, block: _Block, size: int) -> _Block:
        """`alloc_found_block` with split_remainder: the front `size` bytes are the new block."""
        front = _Block(block.ptr, size, block.stream, block.small, block.seg)
        front.prev = block.prev
        if front.prev is not None:
            front.prev.next = front
        front.next = block
        block.prev = front
        block.ptr += size
        block.size -= size
        pool.insert(block)
        return front

    def _try_merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> int:
        """`try_merge_blocks`: absorb a free neighbour of the same segment (and mapping state)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _releasable(self) -> int:
        """Bytes `release_cached_blocks` would return now: cached whole segments, and the whole free pages
        of expandable segments."""
        total = 0
        for pool in self._pools.values():
            for b in pool.blocks.values():
                if b.seg.expandable:
                    page = b.seg.page
                    first = -(-(b.ptr - b.seg.base) // page)
                    last = (b.ptr + b.size - b.seg.base) // page
                    total += max(last - first, 0) * page
                elif b.prev is None and b.next is None:
                    total += b.size
        return total

    def _note_reserved(self) -> None:
        floor = self.reserved - self._releasable()
        if floor > self.floor_peak:
            self.floor_peak = floor
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
        if self.segments > self.segments_peak:
            self.segments_peak = self.segments

    def _alloc_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """`alloc_block`: a new `cudaMalloc` segment of `get_allocation_size`, or expandable pages."""
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        seg_size = allocation_size(size)
        if self.reserved + seg_size > self._capacity:
            return None
        seg = _Segment(self._next_ptr, seg_size, False)
        self._next_ptr += seg_size
        self.reserved += seg_size
        self.segments += 1
        self._note_reserved()
        return _Block(seg.base, seg_size, stream, pool.small, seg)

    def _retry_after_release(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """Free all non-split cached blocks and retry (`release_cached_blocks` + `alloc_block(isRetry)`)."""
        self._release_cached_blocks()
        self.alloc_retries += 1
        return self._alloc_block(pool, size, stream)

    def _release_available_cached_blocks(self, pool: _Pool, size: int, stream: int) -> bool:
        """`release_available_cached_blocks`: with max_split_size, free oversize cached blocks -- the smallest
        one that covers the request, else the largest ones until their sum does."""
        if self._max_split == _NO_LIMIT:
            return False
        want = max(size, self._max_split)
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, want, -1))
        if i < len(keys) and keys[i][0] == stream:
            self._release_block(pool, pool.blocks[keys[i]])
            return True
        released = 0
        i -= 1
        while released < want and i >= 0 and keys[i][0] == stream and keys[i][1] >= self._max_split:
            b = pool.blocks[keys[i]]
            released += b.size
            self._release_block(pool, b)
            i -= 1
        return released >= want

    def _release_block(self, pool: _Pool, b: _Block) -> None:
        """`release_block`: `cudaFree` of a whole cached segment."""
        pool.remove(b)
        self.reserved -= b.size
        self.segments -= 1

    def _release_cached_blocks(self) -> None:
        """`release_cached_blocks` -> `release_blocks`: free every cached block that is a whole segment;
        with expandable segments unmap every whole free page."""
        for pool in self._pools.values():
            to_unmap = []
            for k in list(pool.keys):
                b = pool.blocks[k]
                if b.seg.expandable:
                    to_unmap.append(b)
                elif not b.is_split:
                    self._release_block(pool, b)
            for b in to_unmap:
                self._unmap_block(pool, b)

    # -- expandable segments -------------------------------------------------------------------------------

    def _new_expandable_segment(self, pool: _Pool, stream: int) -> _Block:
        """`find_expandable_block` when no segment has room: a new segment, all of it unmapped."""
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        seg = _Segment(self._next_ptr, page, True)
        self._next_ptr += _ADDRESS_SPACE
        self.segments += 1
        self._note_reserved()
        b = _Block(seg.base, _ADDRESS_SPACE, stream, pool.small, seg)
        b.mapped = False
        pool.insert_unmapped(b)
        return b

    def _find_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block:
        """`find_expandable_block`: the lowest address (free, then unmapped) with `size` bytes of room."""

        for (s, _), c in sorted(pool.unmapped.items()):
            if s != stream:
                continue
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, x = 0, c
            while room < size and not x.allocated:
                room += x.size
                if x.next is None:
                    break
                x = x.next
            if room >= size:
                return c
        return self._new_expandable_segment(pool, stream)

    def _map_block(self, pool: _Pool, b: _Block, size: int) -> bool:
        """`map_block`: back the first `size` bytes of an unmapped block with whole pages."""
        page = b.seg.page
        first = (b.ptr - b.seg.base) // page
        last = -(-(b.ptr + size - b.seg.base) // page)
        mapped = (last - first) * page
        if self.reserved + mapped > self._capacity:
            return False
        pool.remove_unmapped(b)
        b.mapped = True
        if mapped < b.size:
            rest = _Block(b.ptr + mapped, b.size - mapped, b.stream, b.small, b.seg)
            rest.mapped = False
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            pool.insert_unmapped(rest)
            b.size = mapped
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert(b)
        self.reserved += mapped
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """`try_allocate_expandable_block`."""
        c = self._find_expandable_block(pool, size, stream)
        if not c.mapped and not self._map_block(pool, c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next  # invariant: free -> unmapped; map_block merges c into the newly mapped block
            assert nxt is not None
            if not self._map_block(pool, nxt, min(size - c.size, nxt.size)):
                self._note_reserved()
                return None
            c = nxt
        pool.remove(c)
        self._note_reserved()
        return c

    def _unmap_block(self, pool: _Pool, b: _Block) -> None:
        """`unmap_block`: return the whole free pages inside a free block to the device."""
        page = b.seg.page
        first = -(-(b.ptr - b.seg.base) // page)
        last = (b.ptr + b.size - b.seg.base) // page
        if first >= last:
            return
        pool.remove(b)
        start = b.seg.base + first * page
        end = b.seg.base + last * page
        if start > b.ptr:
            before = _Block(b.ptr, start - b.ptr, b.stream, b.small, b.seg)
            before.prev, before.next = b.prev, b
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        if b.ptr + b.size > end:
            after = _Block(end, b.ptr + b.size - end, b.stream, b.small, b.seg)
            after.prev, after.next = b, b.next
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.ptr, b.size, b.mapped = start, end - start, False
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert_unmapped(b)
        self.reserved -= end - start
        if b.prev is None and b.next is None:  # release_expandable_segment
            pool.remove_unmapped(b)
            self.segments -= 1


def replay(events: list[Event] | tuple[Event, ...], config: AllocatorConfig | None = None) -> ReplayResult:
    """Replay `events` on a fresh allocator: the overall peaks, the peaks between `Mark`s, the segments at
    the end, how often an allocation needed the cache released and retried, and the first OOM (the replay
    stops there)."""
    a = Allocator(config)
    phases: list[PhaseStats] = []
    retries_at_mark = 0
    overall_alloc = overall_res = overall_seg = 0
    oom: OutOfMemory | None = None
    for i, ev in enumerate(events):
        if isinstance(ev, Alloc):
            try:
                a.malloc(ev.id, ev.nbytes, ev.stream)
            except SimulatedOOM as e:
                oom = OutOfMemory(i, e.oom.id, e.oom.requested, e.oom.allocated, e.oom.reserved)
                break
        elif isinstance(ev, Free):
            a.free(ev.id)
        elif isinstance(ev, Mark):
            phases.append(
                PhaseStats(
                    ev.name,
                    a.allocated_peak,
                    a.reserved_peak,
                    a.segments_peak,
                    a.alloc_retries - retries_at_mark,
                    max(a.floor_peak, a.allocated_peak),
                )
            )
            retries_at_mark = a.alloc_retries
            overall_alloc = max(overall_alloc, a.allocated_peak)
            overall_res = max(overall_res, a.reserved_peak)
            overall_seg = max(overall_seg, a.segments_peak)
            if ev.empty_cache:
                a.empty_cache()
            a.reset_peaks()
        else:
            a.empty_cache()
    return ReplayResult(
        allocated_peak=max(overall_alloc, a.allocated_peak),
        reserved_peak=max(overall_res, a.reserved_peak),
        segments=a.segments,
        segments_peak=max(overall_seg, a.segments_peak),
        alloc_retries=a.alloc_retries,
        oom=oom,
        phases=tuple(phases),
    )


def least_capacity(
    events: list[Event] | tuple[Event, ...],
    config: AllocatorConfig | None = None,
    *,
    resolution: int = 64 << 20,
) -> int:
    """The least `capacity` (bytes the allocator may reserve) at which `events` replay without an OOM, by
    bisection between the allocated peak and the unconstrained reserved peak, to `resolution` bytes. Each
    probe is a full replay with the release-and-retry rules: use it to check `PhaseStats.floor_peak`."""
    base = dataclasses.replace(config or AllocatorConfig(), capacity=None)
    free_run = replay(events, base)
    lo, hi = free_run.allocated_peak, free_run.reserved_peak
    if replay(events, dataclasses.replace(base, capacity=lo)).oom is None:
        return lo
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        if replay(events, dataclasses.replace(base, capacity=mid)).oom is None:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass
class Trace:
    """Builds an event list with ids handed out in order: `t = Trace(); x = t.alloc(n); t.free(x)`."""

    events: list[Event] = field(default_factory=list)
    _n: int = 0

    def alloc(self, nbytes: int) -> int:
        self._n += 1
        self.events.append(Alloc(self._n, int(nbytes)))
        return self._n

    def free(self, *ids: int) -> None:
        for i in ids:
            self.events.append(Free(i))

    def mark(self, name: str, *, empty_cache: bool = False) -> None:
        self.events.append(Mark(name, empty_cache))


# ==============================================================================================================
# A training run's allocation sequence, derived from the planner's items
# ==============================================================================================================


@dataclass(frozen=True)
class StepShape:
    """What one rank allocates on its GPU, in elements and bytes, for `training_events`.

    Shapes: T = micro_batch x seq tokens, hidden h, intermediate i, q/kv projection widths, vocab V, `d` bytes
    of the model dtype. `layer_linears`: each decoder-layer Linear's parameter count (weight + bias) in forward
    order (q, k, v, o, gate, up, down); `layer_small`: the layer's other parameters (norms, biases' share).
    `stage` and the offload flags select DeepSpeed's code path; `keep_layers` is how many decoder layers' gathered
    parameters ZeRO-3 keeps for reuse at the end of the forward pass (the planner's working set / one layer);
    `resident` are the GPU model states in creation order (name, bytes), `sub_groups` the trainable partition's
    ZeRO-3 sub-groups (or the ZeRO-1/2 partition) in elements; `optimizer_state_bytes` per trainable element
    (8 for Adam), allocated lazily at the first step on the GPU when the optimizer is not offloaded.
    """

    tokens: int
    batch: int
    seq: int
    hidden: int
    inter: int
    q_dim: int
    kv_dim: int
    heads: int
    vocab: int
    layers: int
    d: int
    loss_fp32: bool
    checkpointing: bool
    layer_linears: tuple[int, ...]
    embed_numel: int
    head_numel: int
    stage: int
    world: int
    offload_param: bool
    offload_optimizer: bool
    full_grads: bool
    keep_layers: int
    reduce_bucket: int
    load: tuple[tuple[str, int], ...]
    sub_groups: tuple[int, ...]
    param_numels: tuple[int, ...]
    optimizer_state_bytes: int
    adamw_temporary: bool
    loss_shift: str = "none"  # activations.LOSS_SHIFTS: how this transformers release shifts the fp32 logits
    fused_ce_rows: int = 0  # Liger's fused linear cross-entropy: rows per chunk (0: transformers' loss on the logits)
    fused_ce_weight_copy: bool = False  # liger_kernel >= 0.6.2: a V x h product and its fp32 copy per chunk
    cut_ce: bool = False  # Apple's Cut Cross-Entropy in place of lm_head and the loss (plan/cce.py)
    liger_norm: bool = False  # LigerRMSNorm in place of the HF norm (`_rmsnorm_forward`)
    liger_swiglu: bool = False  # LigerSiLUMulFunction in place of SiLU and the product (`_layer_forward`)


class _Builder:
    """Emits events with named live tensors; `a` allocates, `f` frees (unknown names are ignored)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.live: dict[str, int] = {}
        self._n = 0

    def a(self, name: str, nbytes: int, stream: int = 0) -> None:
        if nbytes <= 0:
            return
        if name in self.live:
            self.f(name)
        self._n += 1
        self.live[name] = self._n
        self.events.append(Alloc(self._n, int(nbytes), stream))

    def f(self, *names: str) -> None:
        for name in names:
            i = self.live.pop(name, None)
            if i is not None:
                self.events.append(Free(i))

    def rename(self, old: str, new: str) -> None:
        """`new` is now the name of `old`'s block (an in-place result: the block stays, its owner changes)."""
        i = self.live.pop(old, None)
        if i is not None:
            self.f(new)
            self.live[new] = i

    def mark(self, name: str, *, empty_cache: bool) -> None:
        self.events.append(Mark(name, empty_cache))


def _rmsnorm_forward(b: _Builder, s: StepShape, p: str, *, grad: bool) -> None:
    """`LlamaRMSNorm.forward`: x.to(fp32), pow(2).mean, rsqrt, x * rsqrt, .to(bf16), weight * x, in the order
    recorded on the CPU (benchmarks/plan_allocator.py --record). With grad the fp32 copy, rsqrt, bf16 normalised
    tensor and the output are kept (plan/activations.py); the input stays the caller's. Under Liger
    (`LigerRMSNormFunction`, liger_kernel v0.6.2 ops/rms_norm.py `rms_norm_forward`): the output Y in the model dtype
    and a fp32 RSTD per row, the only new blocks; X (the caller's), W and RSTD are saved."""
    th = s.tokens * s.hidden
    if s.liger_norm:
        b.a(f"{p}out", s.d * th)
        b.a(f"{p}rs", 4 * s.tokens)
        if not grad:
            b.f(f"{p}rs")
        return
    b.a(f"{p}x32", 4 * th)
    b.a(f"{p}pow", 4 * th)
    b.a(f"{p}var", 4 * s.tokens)
    b.f(f"{p}pow")
    b.a(f"{p}rs", 4 * s.tokens)
    b.f(f"{p}var")
    b.a(f"{p}xm", 4 * th)
    if not grad:
        b.f(f"{p}x32", f"{p}rs")
    b.a(f"{p}xb", s.d * th)
    b.a(f"{p}out", s.d * th)
    if not grad:
        b.f(f"{p}xb")
    b.f(f"{p}xm")


def _rmsnorm_backward(b: _Builder, s: StepShape, p: str, gout: str, gin: str) -> None:
    """Gradient of the norm as recorded on the CPU: `weight * x` (the input's gradient and the weight's
    unreduced one), `.to(bf16)` back to fp32, `x * rsqrt`, then `pow`/`mean`/`rsqrt` in fp32, and the cast back
    to the model dtype. Under Liger (`rms_norm_backward`, in_place=True for the Llama-style norms): the input's
    gradient is written into the incoming one (`dX = dY`) and the weight's is reduced from a fp32 sm_count x h buffer
    (under 3 MiB, left out)."""
    th = s.tokens * s.hidden
    b.f(f"{p}out")  # freed by its consumer's backward before this one runs
    if s.liger_norm:
        b.rename(gout, gin)
        b.f(f"{p}rs")
        return
    b.a(f"{p}gxb", s.d * th)
    b.a(f"{p}gw", s.d * th)
    b.f(f"{p}gw", gout, f"{p}xb")
    b.a(f"{p}g1", 4 * th)
    b.f(f"{p}gxb")
    b.a(f"{p}g2", 4 * th)
    b.a(f"{p}g3", 4 * th)
    b.f(f"{p}g2", f"{p}g1")
    for k in range(4, 8):
        b.a(f"{p}g{k}", 4 * th)
    b.f(f"{p}g6", f"{p}g5", f"{p}g4", f"{p}x32", f"{p}rs", f"{p}g7")
    b.a(gin, s.d * th)
    b.f(f"{p}g3")


MAIN_STREAM, ALLGATHER_STREAM, REDUCE_STREAM = 0, 1, 2
"""The CUDA streams DeepSpeed ZeRO-3 allocates on: the default stream, the parameter coordinator's
`__allgather_stream` (partitioned_param_coordinator.py `__all_gather_params`) and stage 3's
`reduce_and_partition_stream` (stage3.py `__reduce_and_partition_ipg_grads`). The allocator never hands a
block cached on one stream to a request on another (`get_free_block`)."""
ALLOCATOR_STREAMS_USED = (MAIN_STREAM, ALLGATHER_STREAM, REDUCE_STREAM)


def _gather(b: _Builder, s: StepShape, name: str, numel: int) -> None:
    """ZeRO-3 fetch of one module's parameters on the all-gather stream. With more than one rank:
    `all_gather_coalesced` gathers into one flat buffer (with offload_param the host partitions are first
    copied to the GPU, `torch.cat([p.ds_tensor.to(device) ...])`, and freed after the gather). With one rank
    there is no gather (`_no_gather_coalesced` -> `NoGatherHandle`): the parameter is `ds_tensor.to(device)`,
    a copy only when the partition lives on the host (offload_param)."""
    if s.stage != 3 or name in b.live or numel <= 0:
        return
    if s.world == 1:
        if s.offload_param:
            b.a(name, numel * s.d, ALLGATHER_STREAM)
        return
    if s.offload_param:
        b.a(f"stage:{name}", -(-numel // s.world) * s.d, ALLGATHER_STREAM)
    b.a(name, numel * s.d, ALLGATHER_STREAM)
    b.f(f"stage:{name}")


def _weight_grad(b: _Builder, s: StepShape, numel: int, st: dict[str, list[int]], *, given: bool = False) -> None:
    """A parameter's full-size gradient: written by autograd, copied into the IPG bucket's buffer by
    DeepSpeed's hook and freed (stage3.py `reduce_ready_partitions_and_remove_grads` ->
    `__add_grad_to_ipg_bucket`; stage_1_and_2.py likewise). ZeRO-3 reduces the bucket first when this
    gradient would overflow it. `given`: the gradient exists already (live as "wgrad")."""
    if not s.full_grads or numel <= 0:
        return
    if not given:
        b.a("wgrad", numel * s.d)
    if s.stage == 3 and sum(st["bucket"]) + numel > s.reduce_bucket:
        _flush(b, s, st)
    b.f("wgrad")
    st["bucket"].append(numel)


NORM_CHUNK = 250_000_000
"""Elements per fp64 chunk of `_constant_buffered_norm2` (stage3.py, buffer_size=250000000)."""


def _flush(b: _Builder, s: StepShape, st: dict[str, list[int]]) -> None:
    """ZeRO-3 `__reduce_and_partition_ipg_grads`, on the reduce stream: `reduce_scatter_coalesced` concatenates
    the bucket's gradients (padded per rank) into a new flat tensor unless the bucket is one tensor divisible
    by the world size (comm/coalesced_collectives.py); `partition_grads` with offload_optimizer copies each
    gradient partition back to the GPU (`grad_buffer.to(device)`), takes its norm in fp64 chunks
    (`_constant_buffered_norm2`) and casts it to fp32 before the host copy (`_offload_grad_partition_at_boundary`;
    0.15: the same norm in `partition_grads`)."""
    grads = st["bucket"]
    if s.stage != 3 or not grads:
        grads.clear()
        return
    parts = [-(-n // s.world) for n in grads]
    if len(grads) > 1 or grads[0] % s.world:
        b.a("rs_flat", sum(parts) * s.world * s.d, REDUCE_STREAM)
    if s.offload_optimizer:
        for n in dict.fromkeys(parts):  # alloc/free pairs: distinct sizes suffice (see _optimizer_step)
            b.a("gpart16", n * s.d, REDUCE_STREAM)
            # _constant_buffered_norm2: the partition cast to get_norm_dtype() (fp64) in 250M-element chunks
            b.a("gnorm64", min(n, NORM_CHUNK) * 8, REDUCE_STREAM)
            b.f("gnorm64")
            b.a("gpart32", n * 4, REDUCE_STREAM)
            b.f("gpart16", "gpart32")
    b.f("rs_flat")
    grads.clear()


def _layer_forward(b: _Builder, s: StepShape, i: int, *, grad: bool) -> None:
    """One Llama-style decoder layer (transformers 5.23 `LlamaDecoderLayer`, sdpa) from its input `h{i}` to
    `h{i+1}`; with grad the tensors plan/activations.py lists as saved stay alive under `L{i}:` names."""
    p = f"L{i}:"
    t, d = s.tokens, s.d
    _rmsnorm_forward(b, s, p + "n1", grad=grad)
    q, k, v, o, gate, up, down = (s.layer_linears + (0,) * 7)[:7]
    for name, width, numel in (("q", s.q_dim, q), ("k", s.kv_dim, k), ("v", s.kv_dim, v)):
        _gather(b, s, f"W{i}{name}", numel)
        b.a(p + name, d * t * width)
    if not grad:
        b.f(p + "n1out")
    for name, width in (("q", s.q_dim), ("k", s.kv_dim)):  # apply_rotary_pos_emb: q*cos + rotate_half(q)*sin
        b.a(p + name + "c", d * t * width)
        b.a(p + name + "neg", d * t * width // 2)
        b.a(p + name + "rh", d * t * width)
        b.f(p + name + "neg")
        b.a(p + name + "s", d * t * width)
        b.f(p + name + "rh")
        b.a(p + name + "e", d * t * width)
        b.f(p + name + "c", p + name + "s", p + name)
    b.a(p + "att", d * t * s.q_dim)
    b.a(p + "lse", 4 * s.batch * s.heads * s.seq)
    if not grad:
        b.f(p + "qe", p + "ke", p + "v", p + "lse")
    _gather(b, s, f"W{i}o", o)
    b.a(p + "op", d * t * s.hidden)
    if not grad:
        b.f(p + "att")
    b.a(f"h{i}r", d * t * s.hidden)  # residual + attention output
    b.f(p + "op")
    if not s.checkpointing:
        b.f(f"h{i}")  # the add keeps nothing; a checkpointed layer keeps its input until its backward
    _rmsnorm_forward(b, s, p + "n2", grad=grad)
    # down_proj(act_fn(gate_proj(x)) * up_proj(x)): Python evaluates gate, its SiLU, then up, then the product;
    # LigerSwiGLUMLP: down_proj(LigerSiLUMulFunction.apply(gate_proj(x), up_proj(x))), one output block `c` and no
    # SiLU tensor (liger_kernel v0.6.2 ops/swiglu.py swiglu_forward)
    _gather(b, s, f"W{i}gate", gate)
    b.a(p + "gate", d * t * s.inter)
    if not s.liger_swiglu:
        b.a(p + "silu", d * t * s.inter)
        if not grad:
            b.f(p + "gate")
    _gather(b, s, f"W{i}up", up)
    b.a(p + "up", d * t * s.inter)
    b.a(p + "prod", d * t * s.inter)
    if not grad:
        b.f(p + "gate", p + "silu", p + "up", p + "n2out")
    _gather(b, s, f"W{i}down", down)
    b.a(p + "down", d * t * s.hidden)
    if not grad:
        b.f(p + "prod")
    b.a(f"h{i + 1}", d * t * s.hidden)
    b.f(p + "down", f"h{i}r")
    if not grad:
        b.f(p + "n2x32", p + "n2rs", p + "n2xb")


def _release_layer(b: _Builder, i: int) -> None:
    b.f(*(f"W{i}{n}" for n in ("q", "k", "v", "o", "gate", "up", "down")))


def _layer_backward(b: _Builder, s: StepShape, i: int, st: dict[str, list[int]]) -> None:
    """Gradients of one decoder layer, from `g{i+1}` to `g{i}`, freeing its saved tensors as autograd does."""
    p = f"L{i}:"
    t, d = s.tokens, s.d
    q, k, v, o, gate, up, down = (s.layer_linears + (0,) * 7)[:7]
    b.f(f"h{i + 1}")  # a recomputed output nobody keeps
    # MLP backward in the order recorded on the CPU (benchmarks/plan_allocator.py --record): down_proj's weight
    # gradient, then its input gradient; the product's two gradients (up's first), its saved inputs freed; up_proj,
    # then SiLU, then gate_proj
    _weight_grad(b, s, down, st)
    b.a(p + "gprod", d * t * s.inter)
    b.f(p + "prod")
    if s.liger_swiglu:  # swiglu_backward writes the gate's and up's gradients into their saved outputs, in place
        b.rename(p + "up", p + "gup")
        b.rename(p + "gate", p + "ggate")
        b.f(p + "gprod")
    else:
        b.a(p + "gup", d * t * s.inter)
        b.a(p + "gsilu", d * t * s.inter)
        b.f(p + "silu", p + "up", p + "gprod")
    _weight_grad(b, s, up, st)
    b.a(p + "gn2a", d * t * s.hidden)
    b.f(p + "gup")
    if not s.liger_swiglu:
        b.a(p + "ggate", d * t * s.inter)
        b.f(p + "gate", p + "gsilu")
    _weight_grad(b, s, gate, st)
    b.a(p + "gn2b", d * t * s.hidden)
    b.f(p + "ggate")
    b.a(p + "gn2", d * t * s.hidden)
    b.f(p + "gn2a", p + "gn2b")
    _rmsnorm_backward(b, s, p + "n2", p + "gn2", p + "gh1n")
    b.a(p + "gh1", d * t * s.hidden)  # residual: incoming grad + norm grad
    b.f(p + "gh1n", f"g{i + 1}")
    b.a(p + "gatt", d * t * s.q_dim)  # o_proj backward
    _weight_grad(b, s, o, st)
    b.f(p + "att")
    b.a(p + "gq", d * t * s.q_dim)  # sdpa backward
    b.a(p + "gk", d * t * s.kv_dim)
    b.a(p + "gv", d * t * s.kv_dim)
    b.f(p + "gatt", p + "lse", p + "qe", p + "ke", p + "v")
    for name, width in (("q", s.q_dim), ("k", s.kv_dim)):  # rotary backward
        b.a(p + "g" + name + "r", d * t * width)
        b.a(p + "g" + name + "t", d * t * width)
        b.f(p + "g" + name + "t", p + "g" + name)
    b.a(p + "gn1", d * t * s.hidden)
    for name, numel in (("qr", q), ("kr", k), ("v", v)):
        b.a(p + "gn1p", d * t * s.hidden)
        _weight_grad(b, s, numel, st)
        b.f(p + "gn1p", p + "g" + name)
    _rmsnorm_backward(b, s, p + "n1", p + "gn1", p + "gh0n")
    b.a(f"g{i}", d * t * s.hidden)
    b.f(p + "gh0n", p + "gh1")


def _kept_per_layer(s: StepShape) -> int:
    """Bytes one decoder layer leaves alive from its forward to its backward (its input when checkpointed,
    else its saved tensors), measured on a scratch builder."""
    if s.checkpointing:
        return s.d * s.tokens * s.hidden
    scratch = _Builder()
    scratch.a("h0", s.d * s.tokens * s.hidden)
    _layer_forward(scratch, dataclasses.replace(s, stage=0), 0, grad=True)
    sizes = {ev.id: ev.nbytes for ev in scratch.events if isinstance(ev, Alloc)}
    return sum(sizes[i] for name, i in scratch.live.items() if name != "h1")


def _forward_backward(b: _Builder, s: StepShape, simulated_layers: int) -> None:
    """Embedding, the decoder layers (checkpointed or not), final norm, lm_head, transformers'
    `ForCausalLMLoss` and the backward pass, with ZeRO-3 fetches and releases and the gradient hooks.
    Only `simulated_layers` decoder layers are replayed op by op; what the others keep alive between their
    forward and backward is one block allocated before the first layer (every layer repeats the same
    pattern, so the cache looks the same after a few of them)."""
    t, d = s.tokens, s.d
    st: dict[str, list[int]] = {"bucket": []}
    layers = max(min(simulated_layers, s.layers), 1)
    keep = min(s.keep_layers, layers)
    b.a("ids", 8 * t)
    _gather(b, s, "Wembed", s.embed_numel)
    b.a("h0", d * t * s.hidden)
    b.f("Wembed")
    b.a("other_layers", (s.layers - layers) * _kept_per_layer(s))
    for i in range(layers):
        _layer_forward(b, s, i, grad=not s.checkpointing)
        if i < layers - keep:
            _release_layer(b, i)
    _rmsnorm_forward(b, s, "F:n", grad=True)
    b.f(f"h{layers}")
    head = "Wembed" if not s.head_numel else "Whead"
    _gather(b, s, head, s.head_numel or s.embed_numel)
    if s.fused_ce_rows:
        _fused_linear_ce(b, s, head, layers, st)
    elif s.cut_ce:
        _cut_ce(b, s, layers, st)
    else:
        _logits_loss(b, s, head, layers, st)
    for i in reversed(range(layers)):
        if s.checkpointing:  # non-reentrant checkpoint: recompute the layer with grad from its kept input
            _layer_forward(b, s, i, grad=True)
        _layer_backward(b, s, i, st)
        _release_layer(b, i)
        b.f(f"h{i}")
    if s.full_grads:  # embedding backward: a dense V x h gradient
        _gather(b, s, "Wembed", s.embed_numel)
        _weight_grad(b, s, s.embed_numel, st)
        b.f("Wembed")
    # ZeRO-3: the fused loss (Liger's or CCE's) reads the head weight in the model's own forward, so the weight is an
    # external parameter of the whole model, gathered again by its pre-backward hook and released by its post-backward
    b.f("g0", "ids", "other_layers", *((head,) if s.fused_ce_rows or s.cut_ce else ()))
    _flush(b, s, st)


def _logits_loss(b: _Builder, s: StepShape, head: str, layers: int, st: dict[str, list[int]]) -> None:
    """lm_head, transformers' `ForCausalLMLoss` on the logits, their backward and the final norm's backward."""
    t, d, tv = s.tokens, s.d, s.tokens * s.vocab
    b.a("logits", d * tv)
    if s.loss_fp32:  # ForCausalLMLoss: logits.float(), then cross_entropy = log_softmax + nll_loss
        b.a("logits32", 4 * tv)
    old = s.loss_fp32 and s.loss_shift != "none"  # transformers < 4.49: logits[..., :-1, :].contiguous()
    if old and s.loss_shift == "model_forward":  # <= 4.45: `self.lm_head(...).float()` drops the 16-bit logits
        b.f("logits")
    if old and s.batch > 1:  # one sequence's slice is contiguous already; several sequences' is copied
        b.a("shift32", 4 * (t - s.batch) * s.vocab)
    lb = 4 if s.loss_fp32 else d
    rows_v = (t - s.batch) * s.vocab if old else tv  # log_softmax over the shifted rows
    b.a("logp", lb * rows_v)
    b.f("logits32", "shift32")
    b.f("logits")  # the model output is dropped once `.loss` is taken (HF Trainer.compute_loss, plan_gpu)
    # backward
    b.a("gnll", lb * rows_v)  # nll_loss backward: zeros + scatter
    b.a("glogsm", lb * rows_v)  # _log_softmax_backward_data
    b.f("gnll", "logp")
    if old:  # SliceBackward: the shifted rows' gradient written into zeros of the whole logits' shape
        b.a("gslice", 4 * tv)
        b.f("glogsm")
        b.live["glogsm"] = b.live.pop("gslice")
    if s.loss_fp32:
        b.a("glogits", d * tv)  # ToCopyBackward to the model dtype
        b.f("glogsm")
    else:
        b.live["glogits"] = b.live.pop("glogsm")
    b.a("gF", d * t * s.hidden)  # lm_head backward: input gradient, then the weight's
    _weight_grad(b, s, s.head_numel or s.embed_numel, st)
    b.f("glogits", head)
    _rmsnorm_backward(b, s, "F:n", "gF", f"g{layers}")
    b.f("F:nout")


def _fused_linear_ce(b: _Builder, s: StepShape, head: str, layers: int, st: dict[str, list[int]]) -> None:
    """Liger's `LigerFusedLinearCrossEntropyFunction` in place of lm_head and the loss (plan/liger.py): in the
    forward the input and weight gradients, a fp32 per-token loss and a bool mask, then per chunk the c x V logits
    (their gradient written in place), the c x h input-gradient product, and (>= 0.6.2) the V x h weight-gradient
    product with its fp32 copy; the final hidden states die with the forward. In the backward the saved gradients
    are only scaled in place: the input gradient goes to the final norm, the weight gradient to DeepSpeed's hook."""
    t, d = s.tokens, s.d
    head_numel = s.head_numel or s.embed_numel
    b.a("flce:gin", d * t * s.hidden)
    if s.full_grads:
        b.a("flce:gw", d * head_numel)
    b.a("flce:loss", 4 * t)
    b.a("flce:mask", t)
    rows = min(s.fused_ce_rows, t)
    for start in range(0, t, rows):
        n = min(rows, t - start)
        b.a("flce:logits", d * n * s.vocab)
        b.a("flce:gic", d * n * s.hidden)
        b.f("flce:gic")
        if s.fused_ce_weight_copy and s.full_grads:
            b.a("flce:mm", d * head_numel)
            b.a("flce:mm32", 4 * head_numel)
            b.f("flce:mm", "flce:mm32")
        b.f("flce:logits")
    b.f("flce:mask", "flce:loss", "F:nout")
    # backward
    b.live["gF"] = b.live.pop("flce:gin")
    if s.full_grads:
        b.live["wgrad"] = b.live.pop("flce:gw")
        _weight_grad(b, s, head_numel, st, given=True)
    _rmsnorm_backward(b, s, "F:n", "gF", f"g{layers}")


def _cut_ce(b: _Builder, s: StepShape, layers: int, st: dict[str, list[int]]) -> None:
    """Apple's `LinearCrossEntropyFunction` in place of lm_head and the loss (plan/cce.py): in the forward the label
    rows' index (`_build_flat_valids`: nonzero int64, its int32 copy, the int64 sum), the fp32 LSE and the forward's
    locks, the fp32 logit average per vocabulary entry, the fp32 target logit per row; the final hidden states
    ("F:nout") stay for the backward. In the backward the vocabulary order (argsort int64, its int32 copy), de and
    (trainable head) dc in the model dtype with their int32 locks; de goes to the final norm, dc to DeepSpeed's
    hook."""
    from zerodoctor.plan.cce import LOCK_COLS, LOCK_ROWS

    rows = max(s.tokens - s.batch, 1)
    head_numel = s.head_numel or s.embed_numel
    b.a("cce:nz", 16 * rows)
    b.a("cce:nz32", 8 * rows)
    b.f("cce:nz")
    b.a("cce:valids", 8 * rows)
    b.f("cce:nz32")
    b.a("cce:lse", 4 * rows)
    b.a("cce:locks", 4 * -(-rows // LOCK_ROWS))
    b.a("cce:avg", 4 * s.vocab)
    b.f("cce:locks")
    b.a("cce:nll", 4 * rows)
    b.f("cce:nll")
    # backward
    b.a("cce:order64", 8 * s.vocab)
    b.a("cce:order", 4 * s.vocab)
    b.f("cce:order64")
    b.a("gF", s.d * s.tokens * s.hidden)
    cols = -(-s.hidden // LOCK_COLS)
    b.a("cce:delocks", 4 * -(-rows // LOCK_ROWS) * cols)
    if s.full_grads:
        b.a("wgrad", s.d * head_numel)
        b.a("cce:dclocks", 4 * -(-s.vocab // LOCK_ROWS) * cols)
    b.f("cce:delocks", "cce:dclocks", "cce:order", "cce:avg", "cce:lse", "cce:valids", "F:nout")
    if s.full_grads:
        _weight_grad(b, s, head_numel, st, given=True)
    _rmsnorm_backward(b, s, "F:n", "gF", f"g{layers}")


def _optimizer_step(b: _Builder, s: StepShape, *, first: bool) -> None:
    """DeepSpeed's step on the GPU. ZeRO-3 without optimizer offload, per sub-group (stage3.py `step`):
    `_prepare_fp32_grad_for_sub_group` flattens the sub-group's 16-bit gradients and casts the copy to fp32,
    the optimizer updates the fp32 master (its Adam state created lazily at the first step), the fp32 gradient
    is released. ZeRO-1/2: the same for the rank's whole partition. With optimizer offload the step runs on
    the host."""
    if s.offload_optimizer:
        return
    if s.stage == 3:
        # _get_norm_groups -> get_grad_norm_direct: each gradient partition cast to get_norm_dtype() (fp64 where
        # the device has it, DeepSpeed 0.19: runtime/zero/utils.py) for its norm, one at a time
        # An allocation freed before the next one leaves the cache as it found it (the block splits, then merges
        # back), and a size that fitted once keeps fitting (cached blocks only grow within the step): one
        # alloc/free per distinct size, in order of first appearance, is the same replay.
        for n in dict.fromkeys(-(-n // s.world) for n in s.param_numels):
            b.a("norm64", n * 8)
            b.f("norm64")
    for g, n in enumerate(s.sub_groups):
        b.a(f"flat{g}", n * s.d)
        b.a(f"g32_{g}", n * 4)
        b.f(f"flat{g}")
        if first and s.optimizer_state_bytes:
            for k in range(max(s.optimizer_state_bytes // 4, 1)):
                b.a(f"opt{g}_{k}", n * s.optimizer_state_bytes // max(s.optimizer_state_bytes // 4, 1))
        if s.adamw_temporary:
            b.a("adamw_tmp", n * 4)
            b.f("adamw_tmp")
        b.f(f"g32_{g}")


RUN_KEEPS_CACHE = (
    "transformers trainer.py Trainer._inner_training_loop (accelerator.free_memory() once, before the engine is "
    "built; clear_device_cache only every torch_empty_cache_steps, default None); DeepSpeed 0.19.8 only in "
    "initialize (stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ before flattening each parameter group, "
    "runtime/zero/utils.py defragment for ZeRO-3's flat 16-bit partitions) and offload_states / "
    "empty_partition_cache, never in forward, backward or step; ms-swift's sft/rlhf trainers never (only GRPO)"
)
"""Where a training run empties PyTorch's cache (tests/plan/test_cache_carry.py checks it on the engine): not
between its phases. A run's `max_memory_reserved` (ms-swift's `memory(GiB)`, an OOM message, nvidia-smi less
the context) includes what the earlier phases left cached; `benchmarks/plan_gpu.py` empties the cache at each
phase's end to read each phase's own fragmentation unless run with `--keep-cache`."""


def training_events(
    s: StepShape, *, steps: int = 3, simulated_layers: int | None = None, keep_cache: bool = False
) -> list[Event]:
    """The allocation sequence of `deepspeed.initialize` + `steps` training steps + a save, with phase marks
    as `benchmarks/plan_gpu.py` measures them: `load`, `first_forward_backward`, `first_step`, `steady`
    (steps 2..N), `save`; the peaks are reset at each mark, and the cache emptied there unless `keep_cache`
    (a real run, `RUN_KEEPS_CACHE`; `plan_gpu.py --keep-cache`): then a phase's reserved peak includes what
    the earlier phases left cached, and the cache is emptied where DeepSpeed's initialize does it, before the
    flat 16-bit buffer. Only the cache-emptying differs between the two sequences."""
    b = _Builder()
    for name, nbytes in s.load:
        if nbytes < 0:
            b.f(name)
        else:
            if keep_cache and name == "flat16":
                # the one place DeepSpeed empties the cache: as it builds the flat 16-bit buffer
                # (stage_1_and_2.py before flattening a group; ZeRO-3 runtime/zero/utils.py defragment)
                b.events.append(EmptyCache())
            b.a(name, nbytes)
    b.mark("load", empty_cache=True)
    for step in range(steps):
        _forward_backward(b, s, s.layers if simulated_layers is None else simulated_layers)
        if step == 0:
            b.mark("first_forward_backward", empty_cache=True)
        _optimizer_step(b, s, first=step == 0)
        if step == 0:
            b.mark("first_step", empty_cache=True)
    b.mark("steady", empty_cache=True)
    b.mark("save", empty_cache=False)
    if keep_cache:
        return [Mark(ev.name) if isinstance(ev, Mark) else ev for ev in b.events]
    return b.events


_LAYER_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def step_shape(
    inputs: PlanInputs,
    zero: ZeroSettings,
    training: Training,
    *,
    torch_adamw: bool | None = None,
    exact_load: bool = True,
) -> StepShape:
    """The `StepShape` of one rank for a planned strategy, from the planner's own quantities: the model's
    shapes and parameter tensors (`models.spec`), the model-state components (`plan/model_states.py`), the
    ZeRO-3 working set (`phases.zero3_working_set_numel`), the recipe's micro-batch and sequence length.
    `torch_adamw`: the optimizer is `torch.optim.AdamW` (what HF Trainer hands DeepSpeed; one fp32 temporary
    per updated tensor) rather than DeepSpeed's FusedAdam (a DeepSpeed `optimizer` block); None takes it from
    `zero.optimizer_from_config`. `exact_load=False`
    creates the parameters one decoder layer at a time instead of one tensor at a time (fewer events)."""
    from zerodoctor.plan import model_states as ms
    from zerodoctor.plan import phases
    from zerodoctor.plan.activations import loss_shift_for
    from zerodoctor.plan.liger import flce_chunk_rows

    spec = inputs.model
    p = spec.params
    t = training
    world = inputs.cluster.world_size
    seq = -(-min(t.seq_len, t.longest_sample_tokens or t.seq_len) // max(t.sequence_parallel, 1))
    batch = t.micro_batch * (2 if t.paired_inputs else 1)
    liger = phases.liger_for(inputs, t, zero)
    cut = phases.cce_for(inputs, t, zero) is not None
    fused = liger is not None and liger.fused_linear_ce
    d = t.param_bytes
    by_name = {
        lin.name: lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0)
        for lin in spec.linear_modules(components=("text",))
        if "{i}" in lin.path
    }
    linears = tuple(by_name.get(n, 0) for n in _LAYER_ORDER)
    trainable, frozen = phases.trainable_frozen(inputs, t)
    layers_sizes, rest_sizes = phases._param_sizes(inputs)
    # model order: the embedding, each decoder layer's tensors, then the rest (final norm, untied head)
    n_layers = max(p.num_layers, 1)
    per_layer = [n for n, c in layers_sizes for _ in range(max(c // n_layers, 1))]
    rest = [n for n, c in rest_sizes for _ in range(c)]
    per_param = rest[:1] + per_layer * n_layers + rest[1:]
    part = -(-trainable // world)
    if zero.stage == 3:
        sub_groups = tuple(ms._stage3_sub_groups([n for n in per_param], world, max(zero.sub_group_size, 1)))
        if t.method != "full":
            sub_groups = (part,)
    else:
        sub_groups = (part,)
    keep = 0
    layer_numel = max(sum(linears), 1)
    if zero.stage == 3:
        live = phases.zero3_working_set_numel(
            partitioned=p.total,
            largest_module=p.largest_module_numel,
            max_live=zero.max_live_parameters,
            max_reuse=zero.max_reuse_distance,
            prefetch_bucket=zero.prefetch_bucket_size,
            gradient_checkpointing=t.gradient_checkpointing,
        )
        # max_live's worth of layers kept; the parameter the prefetch loop adds on top of max_live (the head, in
        # the planner's working-set item) is gathered here as its own tensor at the end of the forward pass
        keep = min(live // layer_numel, p.num_layers)
    components = ms.model_state_components(
        trainable=trainable,
        frozen=frozen,
        stage=zero.stage,
        world_size=world,
        offload_optimizer=zero.offload_optimizer,
        offload_param=zero.offload_param if zero.stage == 3 else "none",
        param_bytes=d,
        optimizer=t.optimizer,
        pin_memory=zero.pin_memory,
        sub_group_size=max(zero.sub_group_size, 1),
        reduce_bucket_size=zero.reduce_bucket_size,
        overlap_comm=zero.overlap,
        gradient_accumulation_steps=t.grad_accum,
        deepspeed_version=inputs.deepspeed_version,
    )
    load: list[tuple[str, int]] = []
    tensors: list[int] = []
    on_gpu_params = (zero.stage < 3 or zero.offload_param == "none") and t.method != "qlora"
    # zero.Init partitions each parameter as it is created (its ds_tensor, 1/world of it); without zero.Init
    # (ZeRO-1/2) `module.to(device)` moves every whole parameter to the GPU one tensor at a time. (QLoRA's
    # packed 4-bit base is one block below.)
    if on_gpu_params:
        div = world if zero.stage == 3 else 1
        tensors = [-(-n // div) * d for n in per_param]
        if not exact_load:
            # one allocation per decoder layer (and the tensors outside the layers): the parameter tensors of
            # 10 MiB or more are whole segments either way, so the cache after the load is the same but for
            # how the small ones pack
            k = len(per_layer)
            layer_tensors = tensors[1 : 1 + k * n_layers]
            tensors = [tensors[0], *(sum(layer_tensors[j : j + k]) for j in range(0, len(layer_tensors), k))]
            tensors += [-(-x // div) * d for x in per_param[1 + k * n_layers :]]
        load += [(f"p{k}", n) for k, n in enumerate(tensors)]
    for c in components:
        if c.device != ms.GPU or c.lazy or c.transient:
            continue
        if c.name == ms.PARAM16:
            # the engine's flat 16-bit buffer of the trainable parameters, which are copied in and freed
            # (stage3.py _create_fp16_partitions_with_defragmentation; stage_1_and_2.py flatten). Full
            # fine-tuning: every parameter tensor; LoRA: the adapters (not among the base tensors above);
            # freeze tuning: its trainable layers stay counted as the tensors they were created as.
            if t.method != "freeze":
                load.append(("flat16", c.bytes))
            if t.method == "full":
                load += [(f"p{k}", -1) for k in range(len(tensors))]
        elif c.name == ms.FROZEN16:
            # frozen parameters stay where they were created (zero.Init's per-parameter partitions, or the
            # module's own tensors below ZeRO-3); a packed 4-bit base is one block
            if not tensors:
                load.append(("frozen16", c.bytes))
        elif c.name == ms.FP32_MASTER:
            # fp32 master per sub-group, made from a 16-bit clone (.clone().float())
            for g, n in enumerate(sub_groups):
                load += [(f"clone{g}", n * d), (f"master{g}", n * 4), (f"clone{g}", -1)]
        else:
            load.append((c.name, c.bytes))
    # A paged optimizer's states are CUDA unified memory, outside PyTorch's caching allocator.
    opt_bytes = 0 if t.optimizer in ms.PAGED_OPTIMIZERS else round(ms.optimizer_state_bytes_per_param(t.optimizer))
    return StepShape(
        tokens=batch * seq,
        batch=batch,
        seq=seq,
        hidden=p.hidden_size,
        inter=p.intermediate_size,
        q_dim=p.num_heads * p.head_dim,
        kv_dim=p.kv_heads * p.head_dim,
        heads=p.num_heads,
        vocab=p.vocab_size,
        layers=p.num_layers,
        d=d,
        loss_fp32=not (spec.loss_in_model_dtype and zero.stage >= 1),
        checkpointing=t.gradient_checkpointing,
        layer_linears=linears,
        embed_numel=p.embedding,
        head_numel=0 if p.tied_embeddings else p.lm_head,
        stage=zero.stage,
        world=world,
        offload_param=zero.stage == 3 and zero.offload_param != "none",
        offload_optimizer=zero.offload_optimizer != "none",
        full_grads=t.method == "full",
        keep_layers=keep,
        reduce_bucket=zero.reduce_bucket_size,
        load=tuple(load),
        sub_groups=sub_groups,
        param_numels=tuple(per_param) if t.method == "full" else (),
        optimizer_state_bytes=opt_bytes,
        adamw_temporary=(not zero.optimizer_from_config if torch_adamw is None else torch_adamw)
        and t.optimizer == "adamw",
        loss_shift=loss_shift_for(inputs.transformers_version),
        fused_ce_rows=flce_chunk_rows(batch * seq, p.hidden_size, p.vocab_size) if fused else 0,
        fused_ce_weight_copy=fused and liger is not None and liger.weight_grad_copy,
        liger_norm=liger is not None and liger.rms_norm,
        liger_swiglu=liger is not None and liger.swiglu,
        cut_ce=cut,
    )


PLANNER_SIMULATED_LAYERS = 4
"""Decoder layers the planner replays op by op (`training_events(simulated_layers=...)`); the others are one
block of what they keep between forward and backward. Against replaying every layer, this lowers the steady
floor (what stays at a full device) by 0.2-0.35 GiB on 32-layer 8B plans and by 1.4 GiB on Llama-3.1-405B (each
layer leaves a little fragmentation inside segments in use), and the steady reserved gap by 0.2 GiB (8B) to 9 GiB
(405B: a segment threshold the short replay does not cross); RESULTS.md "Allocator simulation". Replaying all
layers costs 5-10x the time, and the planner evaluates a dozen strategies per run."""


@dataclass(frozen=True)
class PhaseGap:
    """The simulated allocator's view of one planner phase, for one rank."""

    allocated: int
    reserved: int
    floor: int

    @property
    def gap(self) -> int:
        return max(self.reserved - self.allocated, 0)

    @property
    def floor_gap(self) -> int:
        return max(self.floor - self.allocated, 0)


def planner_phase_gaps(
    inputs: PlanInputs, zero: ZeroSettings, training: Training, config: AllocatorConfig | None = None
) -> dict[str, PhaseGap]:
    """Reserved-but-unallocated bytes per planner phase (`load`, `first_step`, `steady`, `save`) for one
    strategy: two steps replayed (the second is the steady one), `PLANNER_SIMULATED_LAYERS` layers op by op,
    the parameters created a layer at a time, the cache emptied at each phase boundary as
    `benchmarks/plan_gpu.py` measures. Cached by shape (candidates often share one)."""
    shape = step_shape(inputs, zero, training, exact_load=False)
    return _phase_gaps(shape, config or AllocatorConfig())


@functools.lru_cache(maxsize=64)
def _phase_gaps(shape: StepShape, config: AllocatorConfig) -> dict[str, PhaseGap]:
    res = replay(training_events(shape, steps=2, simulated_layers=PLANNER_SIMULATED_LAYERS), config)
    out: dict[str, PhaseGap] = {}
    for name in ("load", "first_step", "save"):
        p = res.phase(name)
        out[name] = PhaseGap(p.allocated_peak, p.reserved_peak, p.floor_peak)
    fb = [res.phase("first_forward_backward"), res.phase("steady")]
    out["steady"] = max(
        (PhaseGap(p.allocated_peak, p.reserved_peak, p.floor_peak) for p in fb), key=lambda g: g.gap
    )
    return out
