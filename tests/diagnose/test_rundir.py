"""`zerodoctor diagnose RUN_DIR`: per-rank logs and torchrun error files in a directory tree."""

from __future__ import annotations

import json
import os
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


# ---- the runtime guard's hang-watchdog dumps ----------------------------------------------------------------

SITE = "/opt/venv/lib/python3.11/site-packages"
WAITING = f'''Timeout (0:10:00)!
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007fa44f213b80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "{SITE}/deepspeed/comm/torch.py", line 216 in all_reduce
  File "{SITE}/deepspeed/comm/comm.py", line 117 in log_wrapper
  File "{SITE}/deepspeed/comm/comm.py", line 504 in all_reduce
  File "{SITE}/deepspeed/runtime/zero/stage3.py", line 1402 in _reduce_and_partition_ipg_grads
  File "/home/u/train.py", line 88 in <module>
'''
ELSEWHERE = f'''Timeout (0:10:00)!
Thread 0x00007fa44f213b81 (most recent call first):
  File "{SITE}/torch/utils/data/dataloader.py", line 1295 in _get_data
  File "{SITE}/torch/utils/data/dataloader.py", line 733 in __next__
  File "/home/u/train.py", line 80 in <module>
'''


def _guard_dir(root: Path, stacks: dict[int, str], *, world: int, went_on: set[int] = frozenset()) -> Path:
    d = root / "zerodoctor"
    d.mkdir(parents=True)
    for rank in range(world):
        meta = {"kind": "meta", "t": 1000.0, "rank": rank, "world_size": world}
        (d / f"rank{rank}.jsonl").write_text(json.dumps(meta) + "\n")
    for rank, text in stacks.items():
        p = d / f"stacks-rank{rank}.txt"
        p.write_text(text)
        later = {"kind": "event", "t": 5000.0 if rank in went_on else 1000.0, "rank": rank, "event": "x"}
        with (d / f"rank{rank}.jsonl").open("a") as fh:
            fh.write(json.dumps(later) + "\n")
        os.utime(p, (2000.0, 2000.0))  # the dump is later than the last record unless the rank went on
    (d / "stacks-rank3.txt").write_text("")  # a watchdog that never fired
    (root / "train.log").write_text("step 10 loss 1.2\n")
    return root


def test_hang_names_the_waiting_ranks_the_late_rank_and_the_silent_one(tmp_path: Path, run_cli) -> None:
    root = _guard_dir(tmp_path / "run", {0: WAITING, 1: ELSEWHERE, 2: WAITING}, world=4)
    code, out, err = run_cli("diagnose", str(root), "--format", "json")
    assert code == 1, err
    top = json.loads(out)["findings"][0]
    assert top["id"] == "guard.hang" and top["severity"] == "error"
    assert top["title"] == "rank(s) [0, 2] wait in all_reduce for rank(s) [1, 3]"
    msg = top["message"]
    assert "rank 0 waits in all_reduce (deepspeed/comm/comm.py:504), called from " in msg
    assert "_reduce_and_partition_ipg_grads (deepspeed/runtime/zero/stage3.py:1402)" in msg
    assert "rank 1 never arrived: it was in _get_data (torch/utils/data/dataloader.py:1295)" in msg
    assert "rank 3 never dumped" in msg and "the run was stuck there" in msg
    d = top["data"]
    assert (d["ranks_waiting"], d["ranks_elsewhere"], d["ranks_silent"]) == ([0, 2], [1], [3])
    assert d["stacks"][0]["innermost"] == {
        "file": f"{SITE}/torch/distributed/distributed_c10d.py",
        "line": 2501,
        "func": "all_reduce",
    }


def test_hang_that_recovered_is_a_warning_after_the_real_failure(tmp_path: Path, run_cli) -> None:
    root = _guard_dir(tmp_path / "run", {0: WAITING, 1: ELSEWHERE}, world=2, went_on={0, 1})
    (root / "train.log").write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/home/u/train.py", line 80, in <module>\n'
        "[rank1]: RuntimeError: boom\n"
    )
    code, out, err = run_cli("diagnose", str(root), "--format", "json")
    findings = json.loads(out)["findings"]
    assert findings[0]["id"] != "guard.hang" and findings[0]["severity"] == "error"
    (hang,) = [f for f in findings if f["id"] == "guard.hang"]
    assert hang["severity"] == "warning" and "went on afterwards" in hang["message"]


def test_every_rank_in_the_same_collective_and_several_dumps(tmp_path: Path) -> None:
    from zerodoctor.diagnose.rundir import hang_findings

    root = _guard_dir(tmp_path / "run", {0: WAITING + "\n" + WAITING, 1: WAITING}, world=2)
    (f,) = hang_findings([str(root)])
    assert f.title == "every rank that dumped waits in all_reduce: the collective itself does not complete"
    assert f.data["stacks"][0]["dumps"] == 2
    # the guard folder itself can be given too; a run without dumps has no hang finding
    assert hang_findings([str(root / "zerodoctor")])[0].title == f.title
    (tmp_path / "quiet").mkdir()
    assert hang_findings([str(tmp_path / "quiet"), str(root / "train.log"), "-"]) == []


def test_guard_folder_with_only_dumps_is_diagnosed_not_refused(tmp_path: Path, run_cli) -> None:
    root = _guard_dir(tmp_path / "run", {0: WAITING, 1: ELSEWHERE}, world=2)
    (root / "train.log").unlink()
    code, out, err = run_cli("diagnose", str(root / "zerodoctor"), "--format", "json")
    assert code == 1 and json.loads(out)["findings"][0]["id"] == "guard.hang", err


def test_hostile_guard_folder_neither_blocks_nor_explodes(tmp_path: Path) -> None:
    from zerodoctor.diagnose.rundir import hang_findings

    root = _guard_dir(tmp_path / "run", {0: WAITING}, world=2)
    d = root / "zerodoctor"
    os.mkfifo(d / "stacks-rank1.txt")  # a FIFO would block a reader
    meta = {"kind": "meta", "t": 1.0, "rank": 1, "world_size": 10**12}
    (d / "rank1.jsonl").write_text(json.dumps(meta) + "\n")
    (f,) = hang_findings([str(root)])
    assert f.data["ranks_waiting"] == [0] and f.data["world_size"] == 2
