"""A run stopped by SIGHUP (a closed terminal or ssh session): torch elastic's agent logs `Received 1 death signal`
and hands the signal on to every worker, whose handler raises `SignalException(f"Process {pid} got signal:
{sigval}")` (torch/distributed/elastic/multiprocessing/api.py _terminate_process_handler). A stop from outside, not a
rank's own failure; the fix names what outlives a session.

A native crash reported by UCX's signal handler (ucs/debug/debug.c: `[host:pid:idx:tid] Caught signal 11 (Segmentation
fault: address not mapped to object at address (nil))`, then `==== backtrace (tid: N) ====`): the process dies of that
signal."""

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.findings import Severity

SIGNAL_LINE = "torch.distributed.elastic.multiprocessing.api.SignalException: Process 8665 got signal: {sig}\n"


def _top(tmp_path: Path, text: str):
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    findings = diagnose([str(log)]).findings
    assert findings
    return findings[0]


@pytest.mark.parametrize(
    "text",
    [
        # the worker's exception line with a shell script's prefix and no traceback (ChatGLM2-6B#238's paste)
        "ptuning/train.sh: " + SIGNAL_LINE.format(sig=1),
        # a bare exception line without traceback, after the agent's warning (RRHF#35's paste)
        "WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers\n"
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2920926 closing signal SIGHUP\n"
        + SIGNAL_LINE.format(sig=1),
        # Python <= 3.10's str() of the enum
        SIGNAL_LINE.format(sig="Signals.SIGHUP"),
    ],
)
def test_sighup_is_a_stop_from_outside_with_the_session_fix(tmp_path, text):
    top = _top(tmp_path, text)
    assert top.id == "class:terminated" and top.severity is Severity.WARNING
    assert "SIGHUP" in top.message, top.message
    assert any("nohup" in f.text for f in top.fixes), top.fixes


def test_sigterm_keeps_the_scheduler_reading(tmp_path):
    top = _top(tmp_path, SIGNAL_LINE.format(sig=15))
    assert top.id == "class:terminated"
    assert "SIGHUP" not in top.message and not any("nohup" in f.text for f in top.fixes), top.fixes


def test_the_words_in_prose_without_the_exception_are_not_a_stop(tmp_path):
    top_text = "Q: what does `got signal: 1` mean in torchrun output?\n 100%|##########| 10/10 [00:10<00:00,  1.00it/s]\n"
    log = tmp_path / "run.log"
    log.write_text(top_text, encoding="utf-8")
    assert not [f for f in diagnose([str(log)]).findings if f.severity is Severity.ERROR]


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("Caught signal 11 (Segmentation fault: address not mapped to object at address (nil))  \n", -11),
        ("[node3:1588861:0:1588861] Caught signal 7 (Bus error: nonexistent physical address)\n", -7),
        ("[h000:2722682:0:2722812] Caught signal 8 (Floating point exception: integer divide by zero)\n", -8),
    ],
)
def test_ucx_fatal_signal_is_the_process_death(tmp_path, line, code):
    top = _top(tmp_path, line + "==== backtrace (tid:   8601) ====\n 0 0x0000000000042520 __sigaction() ???:0\n")
    assert top.id.startswith("class:crash") or top.data.get("failure_class", {}).get("id") == "class:crash", top.id
    assert str(code) in top.title, top.title


def test_a_program_that_catches_a_reload_signal_is_no_failure(tmp_path):
    """Another program's handler words (`Caught signal 1 (SIGHUP). Reloading configuration.`) are not UCX's."""
    log = tmp_path / "run.log"
    log.write_text("Caught signal 1 (Hangup). Reloading configuration.\n", encoding="utf-8")
    assert not [f for f in diagnose([str(log)]).findings if f.severity is Severity.ERROR]
