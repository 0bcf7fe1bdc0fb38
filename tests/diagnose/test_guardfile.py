"""`diagnose` on the runtime guard's own error files (written by guard/crash.py): the phase the guard recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.guardfile import guard_error_text
from zerodoctor.guard.crash import record_exception
from zerodoctor.guard.monitor import Monitor
from zerodoctor.guard.options import GuardOptions


def _raise_in_save() -> None:
    raise RuntimeError("[enforce fail at inline_container.cc:595] . unexpected pos 1234 vs 5678")


@pytest.mark.parametrize(("guard_phase", "phase"), [("save", "checkpoint_save"), ("train", "training_step")])
def test_a_guard_error_file_gives_rank_phase_and_exception(tmp_path: Path, guard_phase: str, phase: str) -> None:
    opts = GuardOptions(run_dir=tmp_path, watchdog=False, diagnose_on_error=False)
    mon = Monitor(opts, rank=3, local_rank=3, world_size=4)
    mon.phase, mon.step = guard_phase, 120
    try:
        _raise_in_save()
    except RuntimeError as exc:
        record_exception(mon, exc, exc.__traceback__)
    files = sorted(p.name for p in (tmp_path / "zerodoctor").iterdir())
    assert "error-rank3.json" in files and "error-rank3.log" in files
    text = guard_error_text(str(tmp_path / "zerodoctor" / "error-rank3.json"))
    assert text is not None and text.startswith(f"zerodoctor guard [rank 3, step 120, {guard_phase}]: ".encode())
    for target in (tmp_path, tmp_path / "zerodoctor" / "error-rank3.json"):
        d = diagnose([str(target)])
        assert d.first_failure is not None and d.first_failure.rank == 3
        assert d.first_failure.detail.startswith("RuntimeError: [enforce fail")
        assert d.phase == phase, target
    # the .log twin holds the same traceback without the phase: the .json is read instead
    whole = diagnose([str(tmp_path)]).first_failure
    assert whole is not None and whole.line.source.endswith("error-rank3.json")


def test_other_json_files_are_not_guard_files(tmp_path: Path) -> None:
    torchrun = tmp_path / "error.json"
    torchrun.write_text('{"message": "x"}')
    odd = tmp_path / "error-rank0.json"
    odd.write_text('{"phase": "train; rm -rf /", "traceback": "Traceback"}')
    assert guard_error_text(str(torchrun)) is None and guard_error_text(str(odd)) is None


def training_step() -> None:  # named like HF Trainer's: frames alone would say "training step"
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_the_guards_recorded_phase_outranks_the_frames(tmp_path: Path) -> None:
    opts = GuardOptions(run_dir=tmp_path, watchdog=False, diagnose_on_error=False)
    mon = Monitor(opts, rank=1, local_rank=1, world_size=2)
    mon.phase, mon.step = "evaluation", 40
    try:
        training_step()
    except RuntimeError as exc:
        record_exception(mon, exc, exc.__traceback__)
    d = diagnose([str(tmp_path / "zerodoctor" / "error-rank1.json")])
    assert d.first_failure is not None and d.first_failure.rank == 1
    assert d.phase == "evaluation"
