"""Review R5 (session 12), the CLI and output layer: odd output targets and odd terminals end in exit 0/1/2
with one clear line, never an internal error (exit 3), a hang, invalid UTF-8, a raw terminal escape, or a
user's file deleted or overwritten. Each test failed before its fix; none runs the engine."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zerodoctor.cli.main import main

BAD_DS = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "\\u001b[2Jstagee": 1}}\n'


def _ds(tmp_path: Path, text: str = BAD_DS, name: str = "ds.json") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---- item 1: selftest --workdir never deletes or overwrites the user's files ----------------------------


def test_selftest_workdir_keeps_what_it_did_not_write(tmp_path):
    from zerodoctor.selftest.run import WORKDIR_MARK, claim_workdir

    new = tmp_path / "new" / "st"
    assert claim_workdir(new) == new and (new / WORKDIR_MARK).exists()  # a new directory is used as is
    assert claim_workdir(new) == new / "zerodoctor-selftest-1"  # claimed already: a fresh subdirectory
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_workdir(empty) == empty
    user = tmp_path / "user"
    (user / "ranks").mkdir(parents=True)
    (user / "ranks" / "notes.txt").write_text("precious")
    (user / "selftest.log").write_text("mine")
    (user / "zerodoctor-selftest-1").mkdir()
    got = claim_workdir(user)
    assert got == user / "zerodoctor-selftest-2" and list(got.iterdir()) == [got / WORKDIR_MARK]
    assert (user / "ranks" / "notes.txt").read_text() == "precious"
    assert (user / "selftest.log").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(Exception, match="cannot make the run's directory"):
        claim_workdir(a_file)


def test_selftest_run_in_a_used_workdir_leaves_it_alone(run_cli, tmp_path, monkeypatch):
    """The R5 reproducer through `main`, with torchrun replaced by `true` (no rank runs)."""
    import zerodoctor.selftest.run as st_run

    real = subprocess.Popen

    class FakePopen(real):  # type: ignore[misc, valid-type]
        def __init__(self, cmd, **kw):
            kw.pop("preexec_fn", None)
            super().__init__(["true"], **kw)

    monkeypatch.setattr(st_run.subprocess, "Popen", FakePopen)
    work = tmp_path / "p"
    (work / "ranks").mkdir(parents=True)
    (work / "ranks" / "notes.txt").write_text("precious")
    (work / "selftest.log").write_text("mine")
    (work / "selftest_spec.json").write_text("{}")
    code, out, err = run_cli("selftest", "--workdir", str(work), "--ranks", "1", "--timeout", "30")
    assert code == 1, err  # no rank ran: a failed selftest, not an error
    assert (work / "ranks" / "notes.txt").read_text() == "precious"
    assert (work / "selftest.log").read_text() == "mine"
    assert (work / "selftest_spec.json").read_text() == "{}"
    used = work / "zerodoctor-selftest-1"
    assert (used / "selftest.log").exists() and (used / "selftest_spec.json").exists()
    assert str(used / "selftest.log") in out  # the output says where the run's files are


# ---- item 2: report --out replaces only an earlier report ------------------------------------------------


def _guard_run(root: Path) -> Path:
    d = root / "zerodoctor"
    d.mkdir(parents=True)
    recs = [{"kind": "meta", "t": 1.8e9, "rank": 0, "host": "a", "local_rank": 0, "world_size": 1}]
    recs += [
        {"kind": "sample", "t": 1.8e9 + s, "rank": 0, "step": s, "optimizer_step": s, "phase": "train",
         "rss": (40 + s) << 30, "node_used": (100 + s) << 30, "node_total": 1 << 40}
        for s in range(1, 6)
    ]  # fmt: skip
    (d / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return root


def test_report_out_never_overwrites_a_users_page_or_writes_through_a_link(run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    run = _guard_run(tmp_path / "run")
    out = tmp_path / "site"
    out.mkdir()
    (out / "index.html").write_text("mine")
    code, _, err = run_cli("report", str(run), "--out", str(out))
    assert code == 2 and "index.html: already exists and was not written by zerodoctor" in err
    assert (out / "index.html").read_text() == "mine" and not list(out.glob("*.png"))

    fresh = tmp_path / "fresh"
    assert run_cli("report", str(run), "--out", str(fresh))[0] == 0
    charts = sorted(fresh.glob("*.png"))
    assert charts and "zerodoctor report" in (fresh / "index.html").read_text()
    assert run_cli("report", str(run), "--out", str(fresh))[0] == 0  # an earlier report is replaced

    (fresh / "index.html").unlink()
    (fresh / "index.html").symlink_to(tmp_path / "target.html")
    code, _, err = run_cli("report", str(run), "--out", str(fresh))
    assert code == 2 and "symbolic link" in err and not (tmp_path / "target.html").exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / charts[0].name).write_bytes(b"\x89PNG\r\n\x1a\nnot zerodoctor's")
    code, _, err = run_cli("report", str(run), "--out", str(other))
    assert code == 2 and charts[0].name in err and not (other / "index.html").exists()


# ---- item 6: output errors are exit 2 with one line, and a FIFO does not hang -----------------------------


class _FailingRaw(io.RawIOBase):
    def __init__(self, err: int) -> None:
        self.err = err

    def writable(self) -> bool:
        return True

    def write(self, b):  # type: ignore[override]
        if self.err:
            raise OSError(self.err, os.strerror(self.err))
        return len(b)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO, errno.EBADF])
def test_stdout_that_cannot_be_written_is_exit_2(capsys, monkeypatch, err):
    raw = _FailingRaw(err)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8"))
    assert main(["kb"]) == 2
    raw.err = 0  # the stream's own flush when it is closed after the test
    message = capsys.readouterr().err
    assert message.startswith(f"zerodoctor: error: cannot write standard output: {os.strerror(err)}")
    assert "Traceback" not in message and message.count("\n") == 1


def test_closed_stdout_is_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["kb"]) == 2
    assert "cannot write standard output: it is closed" in capsys.readouterr().err


def test_closed_stdout_and_full_disk_in_a_real_process(tmp_path):
    import zerodoctor

    env = {**os.environ, "PYTHONPATH": str(Path(zerodoctor.__file__).resolve().parents[1])}
    cmd = [sys.executable, "-c", "import sys; from zerodoctor.cli.main import main; sys.exit(main(['kb']))"]
    closed = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, close_fds=True,
                            pass_fds=(), preexec_fn=lambda: os.close(1), timeout=60, text=True)  # fmt: skip
    assert closed.returncode == 2 and "it is closed" in closed.stderr
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, env=env, timeout=60, text=True)
        assert r.returncode == 2, r.stderr
        assert r.stderr == (
            "zerodoctor: error: cannot write standard output: No space left on device "
            "(check the disk or file that standard output is redirected to)\n"
        )


def test_step_summary_that_cannot_be_written_is_exit_2(run_cli, tmp_path, monkeypatch):
    ds = _ds(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    targets = {"a directory": tmp_path, "missing dir": tmp_path / "no" / "summary.md", "fifo": fifo}
    if os.path.exists("/dev/full"):
        targets["full"] = Path("/dev/full")
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    for what, target in targets.items():
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
        signal.alarm(20)  # the FIFO nobody reads used to block forever
        try:
            code, _, err = run_cli("check", str(ds), "--model", "llama-3-8b", "--github")
        finally:
            signal.alarm(0)
        assert code == 2, (what, err)
        assert err.startswith(f"zerodoctor: error: cannot write $GITHUB_STEP_SUMMARY ({target}): "), err
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "ok.md"))
    assert run_cli("check", str(ds), "--model", "llama-3-8b", "--github")[0] == 1
    assert (tmp_path / "ok.md").read_text().startswith("# zerodoctor check")


# ---- item 7: a terminal that cannot show every character -------------------------------------------------


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "cp1252"])
def test_non_utf8_terminal_gets_escapes_not_an_internal_error(tmp_path, monkeypatch, encoding):
    ds = _ds(tmp_path, '{"train_batch_size": "值", "zero_optimization": {"stage": 2}}', name="配置.json")
    out_raw, err_raw = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out_raw, encoding=encoding))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err_raw, encoding=encoding))
    assert main(["lint", str(ds)]) == 1
    assert main(["lint", str(tmp_path / "无.json")]) == 2
    sys.stdout.flush()
    sys.stderr.flush()
    assert "\\u914d\\u7f6e.json" in out_raw.getvalue().decode(encoding)
    assert "\\u65e0.json: no such file" in err_raw.getvalue().decode(encoding)


# ---- item 12: JSON output is valid UTF-8 and reads back ---------------------------------------------------


def test_json_with_undecodable_bytes_is_valid_utf8_and_reads_back(tmp_path, monkeypatch, capsysbinary):
    monkeypatch.setenv("NCCL_DEBUG", "a\udcffb")  # what Python makes of the byte 0xff in an environment value
    buf = io.BytesIO()
    # a UTF-8 terminal in Python's POSIX-locale mode writes lone surrogates back as the raw bytes
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buf, encoding="utf-8", errors="surrogateescape"))
    assert main(["env", "--format", "json"]) == 0
    sys.stdout.flush()
    raw = buf.getvalue()
    text = raw.decode("utf-8")  # valid UTF-8 (it held the raw byte 0xff before)
    assert json.loads(text)["environment"]["env_vars"]["NCCL_DEBUG"] == "a\udcffb"
    snapshot = tmp_path / "env.json"
    snapshot.write_bytes(raw)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert main(["lint", str(_ds(tmp_path)), "--env", str(snapshot)]) == 1  # read, not "not a text file"


# ---- item 13: control characters from a user's file are shown escaped -------------------------------------


def test_terminal_escapes_in_keys_and_values_are_escaped(run_cli, tmp_path):
    ds = _ds(tmp_path)
    yaml_cfg = tmp_path / "train.yaml"
    yaml_cfg.write_text(
        f'model_name_or_path: "\\e[31mEVIL\\e[0m"\ndeepspeed: {ds}\nper_device_train_batch_size: 2\n'
    )
    runs = [
        run_cli("lint", str(ds)),
        run_cli("lint", str(ds), "--format", "markdown"),
        run_cli("plan", str(yaml_cfg), "--gpus-per-node", "8", "--gpu-memory", "80"),
        run_cli("check", str(yaml_cfg)),
        run_cli("check", str(yaml_cfg), "--format", "markdown"),
    ]
    for code, out, err in runs:
        assert code in (0, 1, 2), err
        assert "\x1b" not in out + err
    assert "\\x1b[2Jstagee" in runs[0][1]
    assert "\\x1b[31mEVIL" in runs[2][1] + runs[2][2] and "\\x1b[31mEVIL" in runs[3][1]
    code, out, _ = run_cli("lint", str(ds), "--format", "json")  # JSON keeps the key as read
    assert "\\u001b[2Jstagee" in out


def test_printable_keeps_text_and_escapes_controls():
    from zerodoctor.textutil import printable

    assert printable("naïve 值\tx\ny") == "naïve 值\tx\ny"
    assert printable("a\x1b[2Jb\rc\x07\u202ed\x9b") == "a\\x1b[2Jb\\rc\\x07\\u202ed\\x9b"


# ---- item 14(h), 14(i) -------------------------------------------------------------------------------------


def test_guard_reports_a_signal_death_as_128_plus_the_signal(run_cli, tmp_path):
    code, _, _ = run_cli("guard", "--run-dir", str(tmp_path), "--", "sh", "-c", "kill -9 $$")
    assert code == 128 + signal.SIGKILL
    assert run_cli("guard", "--run-dir", str(tmp_path), "--", "sh", "-c", "exit 3")[0] == 3


def test_cache_never_creates_a_missing_home(tmp_path, monkeypatch):
    from zerodoctor.kb import cache

    monkeypatch.delenv("ZERODOCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "nonexistent"))
    assert cache.cache_dir() is None
    cache.write("kb", "k", b"x")
    assert not (tmp_path / "nonexistent").exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / ".cache" / "zerodoctor"


# ---- item 11: a long run's charts draw a bounded number of points, peaks kept -----------------------------


def test_long_series_are_decimated_keeping_peaks_and_dips():
    from zerodoctor.report.plots import MAX_PLOTTED, decimate

    n = 200_000
    xs = list(range(n))
    ys = [10.0 + (i % 7) * 0.01 for i in range(n)]
    ys[123_457] = 80.0  # a one-sample spike (an OOM's peak)
    ys[77_777] = 0.5  # and a one-sample dip
    dx, dy = decimate(xs, ys)
    assert len(dx) <= MAX_PLOTTED + 2 and dx == sorted(dx)
    kept = set(zip(dx, dy, strict=True))
    assert (123_457, 80.0) in kept and (77_777, 0.5) in kept
    assert dx[0] == 0 and dx[-1] == n - 1
    assert max(dy) == max(ys) and min(dy) == min(ys)
    assert decimate(xs[:100], ys[:100]) == (xs[:100], ys[:100])  # short series are drawn whole
