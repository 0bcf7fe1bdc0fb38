"""The caching-allocator simulator against the rules of c10/cuda/CUDACachingAllocator.cpp, one rule per test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodoctor.plan.allocator import (
    ALLOCATOR_STREAMS_USED,
    Alloc,
    Allocator,
    AllocatorConfig,
    EmptyCache,
    Free,
    Mark,
    SimulatedOOM,
    allocation_size,
    planner_phase_gaps,
    replay,
    round_size,
    step_shape,
    training_events,
)
from zerodoctor.plan.inputs import PlanOptions, ZeroSettings, load_inputs

MIB = 1 << 20

FRAGMENTING = [
    Alloc("x", 80 * MIB),
    Free("x"),
    Alloc("y", 30 * MIB),
    Alloc("z", 30 * MIB),
    Free("y"),  # 50 MiB free inside the 80 MiB segment, but in two pieces around z
    Alloc("w", 45 * MIB),
]


# ---- round_size / get_allocation_size -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "rounded"),
    [(1, 512), (511, 512), (512, 512), (513, 1024), (MIB, MIB), (MIB + 1, MIB + 512)],
)
def test_round_size_to_min_block(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


def test_round_size_power2_divisions() -> None:
    # roundup_power2_next_division: 1.2e6 lies between 2^20 and 2^21; 4 divisions of 2^20 are 256 KiB apart
    assert round_size(1_200_000, 4) == MIB + 256 * 1024
    assert round_size(1 << 21, 4) == 1 << 21  # powers of two are kept
    assert round_size(1500, 4) == 1536  # at most 4 x 512: plain 512 rounding


@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, 2 * MIB),  # small pool: kSmallBuffer
        (MIB, 2 * MIB),
        (MIB + 512, 20 * MIB),  # 1 MiB < size < kMinLargeAlloc: kLargeBuffer
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # from kMinLargeAlloc on: rounded to kRoundLarge
        (11 * MIB + 512, 12 * MIB),
    ],
)
def test_allocation_size(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


# ---- pools, packing, splitting -------------------------------------------------------------------------------


def test_small_requests_pack_into_2mib_segments() -> None:
    a = Allocator()
    for i in range(5):
        a.malloc(i, 512 * 1024)
    assert (a.reserved, a.segments, a.allocated) == (4 * MIB, 2, 5 * 512 * 1024)


def test_small_and_large_pools_do_not_share_blocks() -> None:
    a = Allocator()
    a.malloc("s", 512 * 1024)
    a.free("s")  # a 2 MiB small-pool segment is cached
    a.malloc("l", MIB + 512)  # a large request cannot use it
    assert (a.reserved, a.segments) == (22 * MIB, 2)


def test_mid_size_requests_share_a_20mib_segment() -> None:
    a = Allocator()
    a.malloc(1, 3 * MIB)
    a.malloc(2, 3 * MIB)  # from the remainder of the 20 MiB block
    assert (a.reserved, a.segments, a.allocated) == (20 * MIB, 1, 6 * MIB)


def test_large_block_not_split_when_remainder_is_at_most_1mib() -> None:
    a = Allocator()
    a.malloc(1, 12 * MIB)
    a.free(1)
    a.malloc(2, 11 * MIB)  # remainder exactly kSmallSize: not > 1 MiB, the whole block is handed out
    assert a.live_bytes(2) == 12 * MIB
    assert a.allocated == 12 * MIB
    a.free(2)
    a.malloc(3, 11 * MIB - 512)  # remainder > 1 MiB: split
    assert a.live_bytes(3) == 11 * MIB - 512


def test_small_block_split_down_to_512_bytes() -> None:
    a = Allocator()
    a.malloc(1, MIB - 512)  # small pool: a 2 MiB segment, remainder 1 MiB + 512 B (>= 512: split)
    a.malloc(2, MIB)  # from the remainder, leaving exactly 512 B (>= kMinBlockSize: split again)
    assert a.live_bytes(2) == MIB
    a.malloc(3, 512)  # the last 512 B are a block of their own
    assert (a.segments, a.reserved, a.allocated) == (1, 2 * MIB, 2 * MIB)


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    a = Allocator()
    a.malloc("big", 100 * MIB)
    a.malloc("mid", 50 * MIB)
    a.free("big")
    a.free("mid")
    a.malloc("x", 40 * MIB)  # the 50 MiB block, split
    assert a.reserved == 150 * MIB
    a.malloc("y", 90 * MIB)  # the 100 MiB block is still whole
    assert a.reserved == 150 * MIB and a.segments == 2


def test_blocks_of_different_streams_are_not_shared() -> None:
    a = Allocator()
    a.malloc(1, 30 * MIB, stream=0)
    a.free(1)
    a.malloc(2, 30 * MIB, stream=1)
    assert a.segments == 2


# ---- merging, empty_cache ---------------------------------------------------------------------------------------


def test_freed_neighbours_merge_within_a_segment() -> None:
    a = Allocator()
    a.malloc("seg", 90 * MIB)
    a.free("seg")
    for i in range(3):
        a.malloc(i, 30 * MIB)  # three blocks split from the one segment
    assert a.segments == 1
    a.free(1)
    a.empty_cache()  # the segment is split and in use: nothing goes back
    assert a.reserved == 90 * MIB
    a.free(0)
    a.free(2)  # merges [0][1][2] back into one block of the whole segment
    a.malloc("whole", 90 * MIB)
    assert a.segments == 1
    a.free("whole")
    a.empty_cache()
    assert (a.reserved, a.segments) == (0, 0)


def test_free_blocks_of_adjacent_segments_never_merge() -> None:
    a = Allocator()
    a.malloc(1, 40 * MIB)
    a.malloc(2, 40 * MIB)
    a.free(1)
    a.free(2)
    a.malloc(3, 60 * MIB)  # 80 MiB free in two segments, no block of 60
    assert (a.reserved, a.segments) == (140 * MIB, 3)


def test_fragmentation_gap_a_loss_like_pattern() -> None:
    # A 2 GiB tensor freed, then a smaller one split from it, then 2 GiB again: a second 2 GiB segment.
    r = replay(
        [
            Alloc("logits", 2048 * MIB),
            Free("logits"),
            Alloc("act", 100 * MIB),
            Alloc("logits2", 2048 * MIB),
            Mark("step"),
        ]
    )
    assert r.allocated_peak == 2148 * MIB
    assert r.reserved_peak == 4096 * MIB
    assert r.phase("step").gap == 1948 * MIB


# ---- max_split_size ------------------------------------------------------------------------------------------------


def test_max_split_size_oversize_blocks_are_not_split_nor_given_to_small_requests() -> None:
    a = Allocator(AllocatorConfig(max_split_size=200 * MIB))
    a.malloc("big", 400 * MIB)
    a.free("big")
    a.malloc("small", 50 * MIB)  # < max_split: may not take the oversize block
    assert a.segments == 2
    a.malloc("over", 390 * MIB)  # oversize request: takes the 400 MiB block whole (within kLargeBuffer)
    assert a.live_bytes("over") == 400 * MIB and a.segments == 2


def test_max_split_size_oversize_request_does_not_take_a_much_larger_block() -> None:
    a = Allocator(AllocatorConfig(max_split_size=200 * MIB))
    a.malloc("big", 400 * MIB)
    a.free("big")
    a.malloc("over", 300 * MIB)  # 400 >= 300 + 20 MiB: a new segment
    assert a.segments == 2


def test_max_split_size_releases_oversize_cached_blocks_before_the_full_retry() -> None:
    a = Allocator(AllocatorConfig(max_split_size=200 * MIB, capacity=1000 * MIB))
    a.malloc("over", 600 * MIB)
    a.free("over")
    a.malloc("keep", 300 * MIB)  # oversize request, 600 >= 300 + 20: new segment; 900 reserved
    a.malloc("need", 250 * MIB)  # no room: the cached 600 MiB oversize block is released first
    assert a.alloc_retries == 0 and a.reserved == 550 * MIB


# ---- OOM and the retry -------------------------------------------------------------------------------------------------


def test_cached_whole_segments_are_released_and_the_allocation_retried() -> None:
    r = replay(
        [Alloc(1, 60 * MIB), Free(1), Alloc(2, 80 * MIB)],
        AllocatorConfig(capacity=100 * MIB),
    )
    assert r.oom is None and r.alloc_retries == 1 and r.reserved_peak == 80 * MIB


def test_oom_when_split_segments_hold_the_memory() -> None:
    events = FRAGMENTING
    r = replay(events, AllocatorConfig(capacity=100 * MIB))
    assert r.oom is not None and r.oom.id == "w" and r.oom.event_index == 5
    assert r.oom.allocated == 30 * MIB and r.oom.reserved == 80 * MIB
    assert r.alloc_retries == 1
    with pytest.raises(SimulatedOOM):
        a = Allocator(AllocatorConfig(capacity=100 * MIB))
        for ev in events:
            a.malloc(ev.id, ev.nbytes) if isinstance(ev, Alloc) else a.free(ev.id)


# ---- expandable segments -------------------------------------------------------------------------------------------------


def test_expandable_segments_map_20mib_pages_and_split_finely() -> None:
    a = Allocator(AllocatorConfig(expandable_segments=True))
    for i in range(3):
        a.malloc(i, 12 * MIB)
    assert a.reserved == 40 * MIB  # 36 MiB in one segment, whole 20 MiB pages
    assert a.segments == 1
    a.malloc("s", 4096)  # the small pool has its own segment of 2 MiB pages
    assert a.reserved == 42 * MIB and a.segments == 2


def test_expandable_segments_avoid_the_fragmentation_oom() -> None:
    events = FRAGMENTING
    r = replay(events, AllocatorConfig(expandable_segments=True, capacity=100 * MIB))
    # the retry unmaps the free pages ([0, 20) and [60, 80) MiB) and maps w's pages after z
    assert r.oom is None and r.alloc_retries == 1


def test_expandable_empty_cache_unmaps_only_whole_free_pages() -> None:
    a = Allocator(AllocatorConfig(expandable_segments=True))
    a.malloc(1, 30 * MIB)
    a.malloc(2, 30 * MIB)  # pages [0, 60) MiB
    a.free(1)  # free [0, 30): page [0, 20) is whole
    a.empty_cache()
    assert a.reserved == 40 * MIB
    a.free(2)
    a.empty_cache()
    assert (a.reserved, a.segments) == (0, 0)


def test_expandable_freed_space_is_reused_in_place() -> None:
    r = replay(
        [Alloc("logits", 2048 * MIB), Free("logits"), Alloc("act", 100 * MIB), Alloc("logits2", 2048 * MIB)],
        AllocatorConfig(expandable_segments=True),
    )
    assert r.reserved_peak == 2160 * MIB  # 2148 MiB in 20 MiB pages, no second 2 GiB segment


# ---- phases ----------------------------------------------------------------------------------------------------------------


def test_marks_report_each_phase_and_empty_the_cache() -> None:
    r = replay(
        [
            Alloc("state", 100 * MIB),
            Alloc("tmp", 300 * MIB),
            Free("tmp"),
            Mark("load", empty_cache=True),
            Alloc("act", 50 * MIB),
            Mark("step"),
            EmptyCache(),
        ]
    )
    load, step = r.phases
    assert (load.allocated_peak, load.reserved_peak) == (400 * MIB, 400 * MIB)
    assert (step.allocated_peak, step.reserved_peak) == (150 * MIB, 150 * MIB)
    assert r.segments == 2


# ---- the training sequence ------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _inputs(gpus: int = 1, **kw):  # type: ignore[no-untyped-def]
    return load_inputs(
        PlanOptions(
            model="qwen2.5-0.5b", nodes=1, gpus_per_node=gpus, gpu_memory_gib=80, host_ram_gib=256,
            seq_len=512, micro_batch=2, **kw,
        )
    )  # fmt: skip


def _streams(events) -> set[int]:  # type: ignore[no-untyped-def]
    return {ev.stream for ev in events if isinstance(ev, Alloc)}


def test_zero3_on_one_rank_fetches_nothing_without_parameter_offload() -> None:
    # NoGatherHandle: with one rank a parameter is its partition; only offload_param copies it to the GPU
    inputs = _inputs(1)
    plain = training_events(step_shape(inputs, ZeroSettings(stage=3), inputs.training), steps=1)
    off = training_events(
        step_shape(
            inputs, ZeroSettings(stage=3, offload_param="cpu", offload_optimizer="cpu"), inputs.training
        ),
        steps=1,
    )
    assert 1 not in _streams(plain)  # the all-gather stream
    assert 1 in _streams(off)
    two = _inputs(2)
    assert 1 in _streams(training_events(step_shape(two, ZeroSettings(stage=3), two.training), steps=1))
    assert ALLOCATOR_STREAMS_USED == (0, 1, 2)


def test_loss_events_follow_the_recorded_order() -> None:
    # Recorded on the CPU with torch.profiler (benchmarks/plan_allocator.py --record, Qwen2.5-1.5B widths): bf16
    # logits, their fp32 copy, log-probabilities; the copy and the logits freed; in backward nll_loss's gradient,
    # log_softmax's, then the bf16 gradient of the logits.
    inputs = _inputs(1)
    shape = step_shape(inputs, ZeroSettings(stage=0), inputs.training)
    tv = shape.tokens * shape.vocab
    seq = []
    sizes = {}
    for ev in training_events(shape, steps=1):
        if isinstance(ev, Alloc):
            sizes[ev.id] = ev.nbytes
            if ev.nbytes in (2 * tv, 4 * tv):
                seq.append(("+", ev.nbytes // tv))
        elif isinstance(ev, Free) and sizes.get(ev.id) in (2 * tv, 4 * tv):
            seq.append(("-", sizes[ev.id] // tv))
        elif isinstance(ev, Mark) and ev.name == "first_forward_backward":
            break
    assert seq == [
        ("+", 2), ("+", 4), ("+", 4), ("-", 4), ("-", 2),
        ("+", 4), ("+", 4), ("-", 4), ("-", 4), ("+", 2), ("-", 4), ("-", 2),
    ]  # fmt: skip


def test_every_step_allocation_is_freed_and_states_persist() -> None:
    inputs = _inputs(2)
    events = training_events(step_shape(inputs, ZeroSettings(stage=3), inputs.training), steps=2)
    r = replay(events)
    assert r.oom is None
    # after the step only model states (and the lazily created Adam state) stay allocated
    save = r.phase("save")
    steady = r.phase("steady")
    assert save.allocated_peak < steady.allocated_peak
    assert save.floor_peak <= save.reserved_peak


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=64 * MIB), min_size=1, max_size=12),
    st.lists(st.integers(min_value=1, max_value=64 * MIB), min_size=1, max_size=6),
)
def test_repeated_alloc_free_pairs_change_nothing(held: list[int], temps: list[int]) -> None:
    # the reason _optimizer_step replays one alloc/free pair per distinct size
    base: list[Alloc | Free | Mark] = [Alloc(f"h{i}", n) for i, n in enumerate(held)]
    base += [Free(f"h{i}") for i in range(0, len(held), 2)]
    once = base + [x for n in dict.fromkeys(temps) for x in (Alloc("t", n), Free("t"))]
    twice = base + [x for n in temps + temps for x in (Alloc("t", n), Free("t"))]
    a, b = replay(once), replay(twice)
    assert (a.allocated_peak, a.reserved_peak, a.segments) == (b.allocated_peak, b.reserved_peak, b.segments)


def test_the_h100_readings_are_explained_where_the_sequence_is_modelled() -> None:
    # benchmarks/plan_allocator.py: the steady forward/backward/step of the three H100 runs (nothing fitted)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import plan_allocator

    results = json.loads((ROOT / "benchmarks" / "gpu" / "plan_gpu_h100.json").read_text())
    for r in results:
        inputs = plan_allocator.case_inputs(r)
        assert inputs.zero is not None
        shape = step_shape(inputs, inputs.zero, inputs.training, torch_adamw=False)
        sim = replay(training_events(shape, steps=r["case"]["steps"]))
        meas = r["phases"]["steady"]
        gap = meas["reserved"] - meas["allocated"]
        assert abs(sim.phase("steady").gap - gap) < 2 * GIB, r["case"]["name"]
        assert abs(sim.phase("steady").reserved_peak - meas["reserved"]) < 0.1 * meas["reserved"]


def test_planner_phase_gaps_for_the_planner() -> None:
    inputs = _inputs(8)
    gaps = planner_phase_gaps(inputs, ZeroSettings(stage=3), inputs.training)
    assert set(gaps) == {"load", "first_step", "steady", "save"}
    for g in gaps.values():
        assert 0 <= g.floor_gap <= g.gap
    exp = planner_phase_gaps(
        inputs, ZeroSettings(stage=3), inputs.training, AllocatorConfig(expandable_segments=True)
    )
    assert exp["steady"].floor_gap <= gaps["steady"].floor_gap


# ---- a run keeps its cache between phases (allocator.RUN_KEEPS_CACHE) ----------------------------------------


def test_kept_cache_counts_an_earlier_phase_block_that_was_split() -> None:
    """A block cached by the first forward/backward (a 100 MiB activation) is split by the first step's lazily
    created state (60 MiB, kept); the next forward's 100 MiB activation no longer fits in what is left and takes
    a new segment. With the cache emptied at each phase's end the steady phase never sees the first one's block."""
    events = [
        Mark("load"),
        Alloc("act", 100 * MIB),
        Free("act"),
        Mark("first_forward_backward"),
        Alloc("adam", 60 * MIB),
        Mark("first_step"),
        Alloc("act2", 100 * MIB),
        Free("act2"),
        Mark("steady"),
    ]
    kept = replay(events)
    emptied = replay([Mark(e.name, empty_cache=True) if isinstance(e, Mark) else e for e in events])
    assert emptied.phase("steady").reserved_peak == 160 * MIB  # adam's 60 MiB segment + a new 100 MiB one
    assert kept.phase("first_step").reserved_peak == 100 * MIB  # adam took 60 MiB of the cached 100 MiB block
    assert kept.phase("steady").reserved_peak == 200 * MIB  # that segment stays, the 40 MiB rest does not fit
    assert kept.phase("steady").allocated_peak == emptied.phase("steady").allocated_peak == 160 * MIB


def test_training_events_keep_cache_differs_only_in_where_the_cache_is_emptied() -> None:
    inputs = _inputs(8)
    shape = step_shape(inputs, ZeroSettings(stage=3), inputs.training)
    emptied = training_events(shape, steps=2, simulated_layers=2)
    kept = training_events(shape, steps=2, simulated_layers=2, keep_cache=True)
    marks = [e for e in emptied if isinstance(e, Mark)]
    assert [m.name for m in marks] == ["load", "first_forward_backward", "first_step", "steady", "save"]
    assert any(m.empty_cache for m in marks)
    assert not any(e.empty_cache for e in kept if isinstance(e, Mark))
    # DeepSpeed's initialize empties the cache once, right before the flat 16-bit buffer (test_cache_carry.py)
    flat = next(i for i, e in enumerate(kept) if isinstance(e, EmptyCache))
    assert sum(isinstance(e, EmptyCache) for e in kept) == 1
    assert isinstance(kept[flat + 1], Alloc) and flat < kept.index(Mark("load"))
    tensors = [e for e in kept if not isinstance(e, (Mark, EmptyCache))]
    assert tensors == [e for e in emptied if not isinstance(e, Mark)]
    a, b = replay(emptied), replay(kept)
    for phase in ("first_step", "steady"):
        # the same tensors (a block found in the cache is charged whole when its rest is too small to split off,
        # so the allocated bytes differ by that rounding only), and at least as much reserved
        assert b.phase(phase).allocated_peak == pytest.approx(a.phase(phase).allocated_peak, rel=0.01)
        assert b.phase(phase).reserved_peak >= a.phase(phase).reserved_peak
    # nothing is ever given back: the run's reserved bytes only grow from phase to phase
    reserved = [b.phase(n).reserved_peak for n in ("load", "first_forward_backward", "first_step", "steady")]
    assert reserved == sorted(reserved)
