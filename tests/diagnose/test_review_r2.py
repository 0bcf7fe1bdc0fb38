"""The R2 review's findings on the line model, the log and config readers and the knowledge base's texts (issue 10):
a line as long as a terminal's width no longer swallows the complete line after it, UTF-16 logs and configs are
decoded, a compressed log with no text is an empty log, a log with only CR line ends has its lines counted, and no
text a verdict prints carries another case's thread or numbers. Everything goes through the CLI, `main([...])`."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.diagnose.reader import TERMINAL_WIDTHS
from zerodoctor.kb.loader import load_entries
from zerodoctor.kb.schema import Entry


def _diagnose(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, dict[str, object]]:
    capsys.readouterr()
    rc = main(["diagnose", *map(str, paths), "--format", "json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else {}


def _top(report: dict[str, object]) -> dict[str, object]:
    findings = report["findings"]
    assert isinstance(findings, list) and findings
    top = findings[0]
    assert isinstance(top, dict)
    return top


def _evidence_lines(top: dict[str, object]) -> list[tuple[int, str]]:
    ev = top["evidence"]
    assert isinstance(ev, list)
    return [(e["line"], e["text"]) for e in ev]


def _line_of(width: int, tail: str = "progres") -> str:
    """A complete progress print exactly `width` characters long whose last word runs to the last column."""
    head = "Step 20/400: loss=1.2345 lr=1.0e-05 throughput=1234.5 tokens/s, this is an ordinary "
    body = (head + "x" * width)[: width - len(tail)] + tail
    assert len(body) == width
    return body


# ---- review 1: a complete line after a line of a terminal's width is not the rest of a wrapped row ---------------

_STANDALONE = {
    # (the line as the shell prints it, the finding it must give, the key of its evidence)
    "Killed": ("host-oom-sigkill", "shell-killed"),
    "Segmentation fault (core dumped)": ("class:crash", None),
    "Bus error (core dumped)": (None, None),
    "Terminated": ("class:terminated", None),
}


@pytest.mark.parametrize("width", sorted(TERMINAL_WIDTHS))
@pytest.mark.parametrize("line", sorted(_STANDALONE))
def test_a_signal_line_after_a_terminal_width_line_is_read_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], width: int, line: str
) -> None:
    log = tmp_path / "run.log"
    log.write_text(_line_of(width) + "\n" + line + "\n", encoding="utf-8")
    rc, report = _diagnose(capsys, log)
    top = _top(report)
    want, key = _STANDALONE[line]
    assert top["severity"] == ("warning" if line == "Terminated" else "error"), top
    if want is not None:
        assert top["id"] == want
    # the evidence is the signal line itself, at line 2, not a line joined with the progress print
    assert (2, line) in _evidence_lines(top), top["evidence"]
    if key is not None:
        assert any(e["key"] == key for e in top["evidence"])  # type: ignore[index,union-attr]


@pytest.mark.parametrize("width", sorted(TERMINAL_WIDTHS))
def test_a_rank_prefixed_line_of_terminal_width_keeps_a_segfault_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], width: int
) -> None:
    # r2work/logs/glue_seg.log: "[rank0]: " + 91 characters, then the shell's report
    log = tmp_path / "run.log"
    first = "[rank0]: " + "y" * (width - 9)
    log.write_text(first + "\nSegmentation fault (core dumped)\n", encoding="utf-8")
    top = _top(_diagnose(capsys, log)[1])
    assert top["id"] == "class:crash" and top["severity"] == "error", top
    assert (2, "Segmentation fault (core dumped)") in _evidence_lines(top)


def test_a_warning_of_terminal_width_does_not_swallow_the_next_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the reviewer's dense log: a 160-column reducer warning took in the trace-cache warning below it
    # (`...forward pass.Invalidate trace cache @ step 0...`)
    reducer = (
        "[rank27]:[W reducer.cpp:1389] Warning: find_unused_parameters=True was specified in DDP constructor, but "
        "did not find any unused parameters in the forward pass."
    )
    assert len(reducer) == 160
    trace = "Invalidate trace cache @ step 0 and module 1: cache has only 0 modules"
    log = tmp_path / "run.log"
    log.write_text(reducer + "\n" + trace + "\nKilled\n", encoding="utf-8")
    rc, report = _diagnose(capsys, log)
    texts = [str(e.get("text", "")) for f in report["findings"] for e in f["evidence"]]  # type: ignore[attr-defined]
    texts += [str(w.get("text", "")) for w in report["timeline"].get("warnings", [])]  # type: ignore[attr-defined]
    assert not any("forward pass.Invalidate" in t for t in texts), texts
    assert (3, "Killed") in _evidence_lines(_top(report))


def test_a_job_line_of_bash_is_read_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        _line_of(120, "xx") + "\n./train.sh: line 12: 4242 Killed                  python train.py\n"
    )
    top = _top(_diagnose(capsys, log)[1])
    assert top["id"] in ("host-oom-sigkill", "class:host-oom-kill"), top
    assert top["data"]["first_failure"]["line"] == 2  # type: ignore[index]


def test_a_padded_row_before_killed_keeps_killed_on_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # r2work/logs/glue_pad.log: a row padded with a blank, then the shell's `Killed`: found at line 2, not line 1
    log = tmp_path / "run.log"
    log.write_text(_line_of(129, "x") + " \nKilled\n", encoding="utf-8")
    top = _top(_diagnose(capsys, log)[1])
    assert top["id"] == "host-oom-sigkill"
    assert (2, "Killed") in _evidence_lines(top)


@pytest.mark.parametrize("width", sorted(TERMINAL_WIDTHS))
def test_killed_after_a_padded_row_on_the_same_line_stays_a_word_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], width: int
) -> None:
    # a screen copy with the row padded to the window (reader.unpad_rows): a row as long as a terminal's width was
    # read as cut inside a word and joined with no blank (`...xxKilled`), so `Killed` was missed
    log = tmp_path / "run.log"
    log.write_text(_line_of(width, "xx").ljust(width + 60) + "Killed\n", encoding="utf-8")
    top = _top(_diagnose(capsys, log)[1])
    assert top["id"] == "host-oom-sigkill", (width, top["id"])


_BATCH = (
    "AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
    "gradient_acc_step * world_size 64 != 4 * 8 * 1"
)
_FRAME = (
    '  File "/usr/lib/python3/site-packages/deepspeed/runtime/config.py", line 700, in _batch_assertion\n'
)


@pytest.mark.parametrize("width", sorted(w for w in TERMINAL_WIDTHS if w < len(_BATCH)))
@pytest.mark.parametrize("cut", ["mid-word", "before-blank", "punctuation"])
def test_a_row_cut_at_a_terminal_width_still_joins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], width: int, cut: str
) -> None:
    # the wrapped forms that must still join: the rest starts inside a word, with the blank the cut fell before, or
    # with punctuation / digits (no capitalised word, no signal line)
    msg = _BATCH
    # move the cut so the rest starts as wanted: shift the message with filler words in front of the numbers
    for pad in range(0, 40):
        text = msg.replace("parameters.", "parameters." + " x" * pad, 1) if pad else msg
        rest = text[width:]
        if not rest:
            continue
        if (
            (cut == "mid-word" and text[width - 1].isalnum() and (rest[0].islower() or rest[0].isdigit()))
            or (cut == "before-blank" and rest[0] == " " and text[width - 1] != " ")
            or (cut == "punctuation" and not text[width - 1].isalnum() and rest[0] in "*!=_0123456789")
        ):
            msg = text
            break
    else:
        pytest.skip("no such cut at this width")
    log = tmp_path / "run.log"
    rows = [msg[i : i + width] for i in range(0, len(msg), width)]
    log.write_text(
        "Traceback (most recent call last):\n"
        + _FRAME
        + "\n".join(rows)
        + "\n[2024-05-01 10:00:00,000] [INFO] next\n"
    )
    top = _top(_diagnose(capsys, log)[1])
    assert top["id"] == "batch-size-assertion", (width, cut, rows, top["id"])


_WATCHDOG = (
    "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
    "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
    "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, "
    "and could be triggered by another thread holding the GIL inside a CUDA api, or other deadlock-prone "
    "behaviors."
)


@pytest.mark.parametrize("width", sorted(TERMINAL_WIDTHS))
def test_a_watchdog_line_cut_at_a_terminal_width_keeps_its_first_half(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], width: int
) -> None:
    # the hit (`watchdog got stuck`) may fall in a later row; the first row's rank prefix stays with it. (A cut
    # inside `watchdog got stuck for 480 seconds` itself, at 120-150 columns, leaves no row that hits any pattern: not found before
    # this change either, and not what it is about.)
    rows = [_WATCHDOG[i : i + width] for i in range(0, len(_WATCHDOG), width)]
    if not any("watchdog got stuck for 480 seconds" in r for r in rows):
        pytest.skip("the signature itself is cut in two")
    log = tmp_path / "run.log"
    log.write_text("\n".join(rows) + "\n")
    top = _top(_diagnose(capsys, log)[1])
    assert top["id"] == "class:collective-timeout", (width, top["id"])
    first = top["data"]["first_failure"]  # type: ignore[index]
    assert first["rank"] == 6 and first["line"] == 1, first


# ---- review 9: UTF-16 logs and configs -------------------------------------------------------------------------

_OOM_LOG = (
    "[2024-05-01 10:00:00,000] [INFO] [engine.py:100:__init__] DeepSpeed engine started\n"
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/env/lib/python3.10/site-packages/torch/optim/adamw.py", line 180, in _init_group\n'
    "[rank0]:     state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)\n"
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.11 GiB memory in use.\n"
)


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf16_log_with_a_bom_is_read_like_its_utf8_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], codec: str
) -> None:
    plain = tmp_path / "plain.log"
    plain.write_text(_OOM_LOG, encoding="utf-8")
    wide = tmp_path / "wide.log"
    bom = {"utf-16": b"", "utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}[codec]
    wide.write_bytes(bom + _OOM_LOG.encode(codec))  # (PowerShell 5.1's `>`: UTF-16LE with a BOM)
    rc_plain, want = _diagnose(capsys, plain)
    rc_wide, got = _diagnose(capsys, wide)
    assert rc_wide == rc_plain == 1
    assert _top(got)["id"] == _top(want)["id"]
    assert [e["line"] for e in _top(got)["evidence"]] == [e["line"] for e in _top(want)["evidence"]]  # type: ignore[union-attr]
    assert any("UTF-16" in n for n in got["notes"])  # type: ignore[union-attr]


def test_a_utf16_log_through_gzip_and_stdin_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import gzip
    import io
    import sys

    data = _OOM_LOG.encode("utf-16")
    gz = tmp_path / "wide.log.gz"
    gz.write_bytes(gzip.compress(data))
    assert _top(_diagnose(capsys, gz)[1])["severity"] == "error"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    capsys.readouterr()
    assert main(["diagnose", "-", "--format", "json"]) == 1


def test_nul_bytes_without_a_bom_stay_binary_and_the_message_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "wide.log"
    log.write_bytes(_OOM_LOG.encode("utf-16-le"))  # no BOM: cannot be told from binary data
    capsys.readouterr()
    assert main(["diagnose", str(log)]) == 2
    err = capsys.readouterr().err
    assert "binary file" in err and "iconv -f UTF-16LE -t UTF-8" in err and str(log) in err
    assert "Traceback" not in err


def _setup_copy(tmp_path: Path) -> Path:
    import shutil

    src = Path(__file__).resolve().parents[2] / "examples" / "healthy-llamafactory-lora"
    dst = tmp_path / "setup"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("README.md", "expected.yaml"))
    return dst


@pytest.mark.parametrize("name", ["ds_z3_config.json", "qwen2_5_7b_lora_sft.yaml"])
def test_a_utf16_config_is_checked_like_its_utf8_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    setup = _setup_copy(tmp_path)
    capsys.readouterr()
    rc_plain = main(["check", str(setup)])
    want = capsys.readouterr().out
    f = setup / name
    f.write_bytes(f.read_text(encoding="utf-8").encode("utf-16"))
    rc_wide = main(["check", str(setup)])
    got = capsys.readouterr()
    assert rc_wide == rc_plain == 0, got.err
    assert got.out.splitlines()[0] == want.splitlines()[0] == "zerodoctor check: READY"


def test_a_config_with_nul_bytes_and_no_bom_names_the_file_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = _setup_copy(tmp_path)
    f = setup / "ds_z3_config.json"
    f.write_bytes(f.read_text(encoding="utf-8").encode("utf-16-le"))
    capsys.readouterr()
    assert main(["check", str(setup)]) == 2
    err = capsys.readouterr().err
    assert "ds_z3_config.json" in err and "binary file" in err and "iconv" in err
    assert "Traceback" not in err


# ---- review 12: a compressed log with no text is an empty log ---------------------------------------------------


def test_a_gz_that_decodes_to_no_text_is_an_empty_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    capsys.readouterr()
    assert main(["diagnose", str(empty)]) == 2
    assert "the log is empty" in capsys.readouterr().err
    whole = gzip.compress(_OOM_LOG.encode() * 4)
    for name, data in (
        ("none.log.gz", gzip.compress(b"")),
        ("cut.log.gz", whole[:20]),
        ("cut2.log.gz", whole[:12]),
    ):
        gz = tmp_path / name
        gz.write_bytes(data)
        assert main(["diagnose", str(gz)]) == 2, name
        err = capsys.readouterr().err
        assert "the log is empty" in err and name in err and "Traceback" not in err


def test_a_truncated_gz_keeps_the_text_it_decoded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # r2work/logs/trunc.log.gz: the first block decoded from a .gz cut short was dropped when the read after it
    # raised, so 0 bytes were read and the run passed; now the text before the cut is read and the stop noted
    import gzip

    text = "".join(f"[2024-05-01 10:00:{i % 60:02d},000] [INFO] step {i}\n" for i in range(400)) + _OOM_LOG
    data = gzip.compress(text.encode(), mtime=0)
    gz = tmp_path / "trunc.log.gz"
    gz.write_bytes(data[: len(data) - 12])  # (no end-of-stream marker: the last block of text may be lost)
    _rc, report = _diagnose(capsys, gz)
    (note,) = report["notes"]  # type: ignore[misc]
    assert "stopped reading after" in note and "after 0 bytes" not in note
    assert report["logs"][0]["lines"] > 300  # type: ignore[index]
    gz.write_bytes(data[:150])  # (a few hundred bytes of text: the first lines, then the stop)
    _rc, report = _diagnose(capsys, gz)
    (note,) = report["notes"]  # type: ignore[misc]
    assert "after 0 bytes" not in note and report["logs"][0]["lines"] >= 1  # type: ignore[index]


# ---- review 13: a log whose lines end in a lone CR ----------------------------------------------------------------


def test_a_log_with_only_cr_line_ends_has_its_lines_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lf = tmp_path / "lf.log"
    lf.write_text(_OOM_LOG, encoding="utf-8")
    cr = tmp_path / "cr.log"
    cr.write_bytes(_OOM_LOG.replace("\n", "\r").encode())
    _rc, want = _diagnose(capsys, lf)
    _rc, got = _diagnose(capsys, cr)
    assert _top(got)["id"] == _top(want)["id"]
    lines = [e["line"] for e in _top(got)["evidence"]]  # type: ignore[union-attr]
    assert lines == [e["line"] for e in _top(want)["evidence"]] and max(lines) == 5  # type: ignore[union-attr]
    assert not want["notes"] and got["notes"]


def test_a_cr_log_that_turns_to_crlf_later_counts_each_line_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the first block has CR line ends only; a CR LF further on is one line end, not two (and a CR at the end of one
    # read followed by the LF at the start of the next is one too)
    head = "".join(f"[2024-05-01 10:00:{i % 60:02d},000] [INFO] step {i}\r" for i in range(2000))
    log = tmp_path / "cr.log"
    log.write_bytes((head + _OOM_LOG.replace("\n", "\r\n")).encode())
    _rc, report = _diagnose(capsys, log)
    assert max(e["line"] for e in _top(report)["evidence"]) == 2000 + 5  # type: ignore[union-attr]
    assert any("carriage return (CR) alone" in n for n in report["notes"])  # type: ignore[union-attr]
    assert report["logs"][0]["lines"] == 2005  # type: ignore[index]


def test_tqdm_carriage_returns_inside_lf_lines_stay_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bar = "".join(f"\r {i}%|#         | {i}/100 [00:0{i % 10}<01:40,  1.00s/it]" for i in range(1, 40))
    log = tmp_path / "bar.log"
    log.write_text("start\n" + bar + "\n" + _OOM_LOG, encoding="utf-8")
    _rc, report = _diagnose(capsys, log)
    # the bar is line 2 whatever its CRs; the traceback's exception is line 2 + 5
    assert max(e["line"] for e in _top(report)["evidence"]) == 7  # type: ignore[union-attr]
    # a log that opens with a long run of bar refreshes and no LF in its first block: the refreshes stay one line
    log.write_text(bar * 8 + "\n" + _OOM_LOG, encoding="utf-8")
    _rc, report = _diagnose(capsys, log)
    assert max(e["line"] for e in _top(report)["evidence"]) == 6  # type: ignore[union-attr]


# ---- review 3: no text a verdict prints carries another case's thread or numbers -----------------------------------

_THREAD_REF = re.compile(r"\b[\w.-]+/[\w.-]+#\d+")
_SIZE = re.compile(r"(?<![\w{])\d+(?:[.,]\d+)?\s?[KMGT]i?B\b")
# Sizes that are a documented default, not a run's figure: Docker gives a container 64 MB of /dev/shm
# (docs.docker.com, `docker run --shm-size`); the two /dev/shm entries name it as the cause to look for.
_DEFAULTS = {"64 MB"}


def _printed_texts(entry: Entry) -> dict[str, str]:
    """The entry's texts a verdict shows (diagnose and check): title, summary, each fix's text, command, caveat."""
    texts = {"title": entry.title, "summary": entry.summary}
    for i, fix in enumerate(entry.fixes, 1):
        texts[f"fix {i}"] = fix.text
        if fix.command:
            texts[f"fix {i} command"] = fix.command
        if fix.caveat:
            texts[f"fix {i} caveat"] = fix.caveat
    return texts


def test_no_entry_shows_a_thread_or_another_runs_size_in_a_verdict() -> None:
    bad = []
    for entry in load_entries():
        for where, text in _printed_texts(entry).items():
            refs = _THREAD_REF.findall(text)
            sizes = [s for s in _SIZE.findall(text) if s not in _DEFAULTS]
            if refs or sizes:
                bad.append(f"{entry.id} {where}: {refs + sizes}")
    assert not bad, "\n".join(bad)


def test_the_check_catches_what_it_is_for() -> None:
    # (negatives of the check itself: the review's quotes are caught, a user's own numbers in a template are not)
    assert _THREAD_REF.search(
        "This is the OOM of hiyouga/LlamaFactory#7532 (DeepSeek-Coder-V2 236B on 48 x 80 GB)"
    )
    assert _SIZE.findall("a 905 KB pytorch_model.bin, 2.8 TB for a 236B model, 1.59 GiB") == [
        "905 KB",
        "2.8 TB",
        "1.59 GiB",
    ]
    assert not _SIZE.search("about {gib} GiB, 12 bytes/param, expandable_segments:True, 8 B/param")


def _example_logs() -> list[tuple[str, str]]:
    return [(e.id, ex.log) for e in load_entries() for ex in e.examples.match if ex.log]


@pytest.mark.parametrize(("entry_id", "text"), _example_logs(), ids=lambda v: str(v)[:40])
def test_a_verdict_shows_only_the_logs_own_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry_id: str, text: str
) -> None:
    # every entry's own example logs, through the CLI: the top finding's message and fixes hold no thread reference
    # and none of the threads' figures (kept in root_cause and reference notes) unless the log holds it too (the
    # message's own arithmetic on the user's values is fine, whatever it gives)
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    _rc, report = _diagnose(capsys, log)
    top = _top(report)
    shown = " ".join([str(top["message"]), *map(str, top["fixes"])])  # type: ignore[call-overload]
    assert not _THREAD_REF.search(shown), (entry_id, _THREAD_REF.findall(shown))
    own = {_norm(s) for s in _SIZE.findall(text)}
    foreign = [s for s in _SIZE.findall(shown) if _norm(s) in _case_sizes() and _norm(s) not in own]
    assert not foreign, (entry_id, top["id"], foreign)


def _norm(size: str) -> str:
    return re.sub(r"\s", "", size)


@functools.cache
def _case_sizes() -> frozenset[str]:
    """The figures of the threads an entry was built from: what its root cause and reference notes quote."""
    out: set[str] = set()
    for entry in load_entries():
        for text in [entry.root_cause, *(r.note or "" for r in entry.references)]:
            out.update(_norm(s) for s in _SIZE.findall(text) if s not in _DEFAULTS)
    return frozenset(out)


@pytest.mark.parametrize("moe", [False, True])
def test_the_first_step_oom_of_a_dense_7b_names_no_other_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], moe: bool
) -> None:
    # r2work/odd/llama7b_firststep.log: a dense 7B on a 24 GB card was told "This is the OOM of
    # hiyouga/LlamaFactory#7532 (DeepSeek-Coder-V2 236B on 48 x 80 GB)" and given the MoE fix as such
    model = "deepseek_v2/modeling_deepseek.py" if moe else "llama/modeling_llama.py"
    log = tmp_path / "run.log"
    log.write_text(
        f'[rank0]:   File "/env/lib/python3.10/site-packages/transformers/models/{model}", line 100, in forward\n'
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/env/lib/python3.10/site-packages/deepspeed/runtime/zero/stage3.py", line 2213, in step\n'
        "[rank0]:     self._optimizer_step(sub_group_id)\n"
        '[rank0]:   File "/env/lib/python3.10/site-packages/deepspeed/runtime/zero/stage3.py", line 1063, in '
        "_optimizer_step\n"
        "[rank0]:     self.optimizer.step()\n"
        '[rank0]:   File "/env/lib/python3.10/site-packages/torch/optim/adamw.py", line 152, in _init_group\n'
        '[rank0]:     state["exp_avg_sq"] = torch.zeros_like(\n'
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of "
        "23.65 GiB of which 0.90 GiB is free. Of the allocated memory 21.10 GiB is allocated by PyTorch, and 0.30 GiB "
        "is reserved by PyTorch but unallocated.\n",
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["diagnose", str(log)]) == 1
    out = capsys.readouterr().out
    assert "z3-first-step-gpu-oom-no-optimizer-offload" in out
    assert "#7532" not in out.split("see:")[0] and "236B" not in out and "80 GB" not in out
    # the MoE fix is worded as a condition, for every model
    assert "Only if the model is a mixture-of-experts (MoE) model" in out
    assert "For MoE models (DeepSeek-V2 family) also mark" not in out
