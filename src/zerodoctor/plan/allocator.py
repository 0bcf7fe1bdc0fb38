"""A small simulator of PyTorch's CUDA caching allocator, to predict reserved-but-unallocated memory.

`torch.cuda.max_memory_reserved` (what an OOM message and nvidia-smi see, less the CUDA context) is larger
than `max_memory_allocated` because the allocator caches freed blocks, rounds requests and splits cached
blocks for smaller requests, so a later large request may find no free block big enough and take a new
segment from the device. How much depends on the order and sizes of a step's allocations, not on a constant.
`Allocator` replays a sequence of `Alloc` / `Free` events with the rules of `c10/cuda/CUDACachingAllocator.cpp`
(PyTorch main, read at commit 001074d2; the rules below are unchanged from torch 2.1 to 2.11, the versions
whose wheels zerodoctor supports), each rule cited by the C++ function it comes from:

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
from dataclasses import dataclass, field
from typing import NamedTuple

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

    @property
    def gap(self) -> int:
        """Reserved peak minus allocated peak: what an OOM message calls "reserved but unallocated"."""
        return self.reserved_peak - self.allocated_peak


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

    def _note_reserved(self) -> None:
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
        self._note_reserved()
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
                return None
            c = nxt
        pool.remove(c)
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
