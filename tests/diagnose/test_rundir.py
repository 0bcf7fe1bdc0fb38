"""`zerodoctor diagnose RUN_DIR`: per-rank logs and torchrun error files in a directory tree."""

from __future__ import annotations

import json
from pathlib import Path


def _torchrun_tree(root: Path) -> Path:
    """torchrun --log-dir layout: <run_id>/attempt_0/<local_rank>/{stdout,stderr}.log and error.json."""
    att = root / "none_abc123" / "attempt_0"
    for r in range(4):
        d = att / str(r)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text("***** Running training *****\n{'loss': 1.1, 'epoch': 0.1}\n")
        (d / "stderr.log").write_text(" 10%|#         | 100/1000 [10:00<90:00,  5.40s/it]\n")
    stack = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/deepspeed/runtime/zero/stage3.py", line 2106, in _optimizer_step\n'
        "    self.optimizer.step()\n"
        '  File "/usr/lib/python3/site-packages/torch/optim/adamw.py", line 157, in _init_group\n'
        '    state["exp_avg_sq"] = torch.zeros_like(\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.39 GiB. GPU 2 has a total capacity of "
        "79.32 GiB of which 1.25 GiB is free. Of the allocated memory 73.29 GiB is allocated by PyTorch, and "
        "2.10 GiB is reserved by PyTorch but unallocated.\n"
    )
    (att / "2" / "error.json").write_text(
        json.dumps(
            {
                "message": {
                    "message": "OutOfMemoryError: CUDA out of memory.",
                    "extraInfo": {"py_callstack": stack, "timestamp": "1718960000"},
                }
            }
        )
    )
    (root / "notes.md").write_text("not a log\n")
    return root


def test_run_dir_reads_rank_files_and_error_json(tmp_path: Path, run_cli) -> None:
    root = _torchrun_tree(tmp_path / "run")
    code, out, err = run_cli("diagnose", str(root), "--format", "json")
    assert code in (0, 1), err
    doc = json.loads(out)
    paths = [x["path"] for x in doc["logs"]]
    assert len(paths) == 9 and any(p.endswith("2/error.json") for p in paths)
    assert not any(p.endswith("notes.md") for p in paths)
    top = doc["findings"][0]
    ff = top["data"]["first_failure"]
    assert ff["rank"] == 2 and ff["file"].endswith("attempt_0/2/error.json")
    assert top["data"]["phase"] == "first_optimizer_step"


def test_empty_run_dir_is_a_clear_error(tmp_path: Path, run_cli) -> None:
    (tmp_path / "empty").mkdir()
    code, _out, err = run_cli("diagnose", str(tmp_path / "empty"))
    assert code == 2 and "no log files" in err and "Traceback" not in err


def test_not_a_torchrun_error_file_is_read_as_text(tmp_path: Path, run_cli) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "error.json").write_text('{"unrelated": 1}\nRuntimeError: boom\n')
    code, out, err = run_cli("diagnose", str(d), "--format", "json")
    assert code in (0, 1), err
