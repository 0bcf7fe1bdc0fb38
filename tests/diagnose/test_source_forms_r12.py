"""Round 12 (issue 10): fixes from reviews R1 and R4 of round 11, and tune-split misses the log itself proves, each
built from the library's own message text (patterns.py / extract.py / classes.py name each source beside its rule).

- extract.py keeps its phase markers in a bounded list: a run of bars that the scan does not collapse (interleaved
  ranks' `[rankN]:` bars) after a failure must not push out the markers before the failure (review R4 item 1).
"""

from __future__ import annotations

from pathlib import Path

from zerodoctor.diagnose import diagnose

OOM_RANK1 = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "train.py", line 10, in <module>\n'
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of "
    "79.10 GiB of which 1.06 MiB is free.\n"
)


def _run(tmp_path: Path, text: str):
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    return diagnose([str(log)])


def _top(tmp_path: Path, text: str):
    d = _run(tmp_path, text)
    assert d.findings, "no finding"
    return d.findings[0]


# ---- markers kept across a long run of interleaved ranks' bars (review R4 item 1) --------------------------------
def _map_bar(i: int, rank: int) -> str:
    # datasets' Dataset.map bar (arrow_dataset.py: `desc="Map"`, `num_proc`), prefixed by torchrun's `[rankN]:`
    total = 60000
    return f"[rank{rank}]:Map (num_proc=8):  {i * 100 // total:2d}%|##        | {i * 3}/{total} [00:{i % 60:02d}<01:00, 1234.56 examples/s]\n"


def test_a_failure_keeps_its_tokenization_phase_under_a_long_run_of_interleaved_bars(tmp_path):
    before = "".join(_map_bar(i, i % 3) for i in range(900))
    # ranks 0 and 2 go on mapping after rank 1 failed: 10,500 bar lines whose prefixes alternate (no run collapses)
    after = "".join(_map_bar(900 + i, (i % 2) * 2) for i in range(10500))
    top = _top(tmp_path, before + OOM_RANK1 + after)
    assert top.data["phase"] == "tokenization", top
    assert top.data["first_failure"]["rank"] == 1, top


def test_each_guard_line_is_kept(tmp_path):
    # (negative: the runtime guard's lines are markers of one kind that each name their own rank's phase; two in a
    # row stay two, and the failing rank's one names the phase)
    text = (
        "zerodoctor guard [rank 1, step 12, save]: Failure not in the knowledge base: see the traceback\n"
        "zerodoctor guard [rank 0, step 12, train]: Failure not in the knowledge base: see the traceback\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/train.py", line 40, in <module>\n'
        "[rank1]:     helper(batch)\n"
        "[rank1]: RuntimeError: something unusual happened\n"
    )
    assert _top(tmp_path, text).data["phase"] == "checkpoint_save"
