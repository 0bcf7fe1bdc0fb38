"""The failure-class layer: with no knowledge-base entry for it, a failure is still named, with the log's own
values, and the message says what the log proves and what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.findings import Severity

LOGS = Path(__file__).parent / "classes"


@pytest.mark.parametrize(
    ("log", "class_id", "must_say"),
    [
        # every GPU loading the whole bf16 model for predict (no ZeRO-3): the OOM arithmetic from the message
        (
            "oom_load.log",
            "class:gpu-oom",
            ["GPU 3", "during load", "1.96 GiB - 1.02 GiB = 0.94 GiB short", "79.15 GiB"],
        ),
        (
            "assert.log",
            "class:library-assertion",
            ["partitioned_param_coordinator.py:194", "record_module", "0.15.1"],
        ),
        # an op with no knowledge-base entry of its own (fused_adam and cpu_adam have one)
        ("build.log", "class:op-build-failure", ["transformer_inference"]),
        ("import.log", "class:import-error", ["cannot import name 'Cache'"]),
        ("config.log", "class:config-rejected", ["train_micro_batch_size_per_gpu"]),
    ],
)
def test_class_named_with_the_logs_values(log: str, class_id: str, must_say: list[str]) -> None:
    top = diagnose([str(LOGS / log)]).findings[0]
    assert top.id == class_id
    assert top.severity is Severity.ERROR
    assert "The log proves:" in top.message and "It does not prove:" in top.message
    for text in must_say:
        assert text in top.message, (text, top.message)
    assert top.fixes


@pytest.mark.parametrize(
    ("save_line", "top_id"),
    [
        # plain training: no entry explains the timeout, the class names it
        ("", "class:collective-timeout"),
        # rank 0 still saving when the others' gather timed out: the KB entry, with the class beside it
        (
            "[INFO|trainer.py:3719] 2024-05-20 03:10:44,018 >> Saving model checkpoint to out/checkpoint-400\n",
            "nccl-timeout-save-eval",
        ),
    ],
)
def test_kb_verdict_carries_the_class_too(tmp_path: Path, save_line: str, top_id: str) -> None:
    """A watchdog timeout the KB knows is still classified: which collective, which ranks, how long."""
    lines = (LOGS / "watchdog.log").read_text().splitlines(keepends=True)
    log = tmp_path / "watchdog.log"
    log.write_text("".join(lines[:2]) + save_line + "".join(lines[2:]))
    top = diagnose([str(log)]).findings[0]
    assert top.id == top_id
    fc = top.data["failure_class"]
    assert fc["id"] == "class:collective-timeout"
    assert fc["collective"] == "_ALLGATHER_BASE" and fc["timeout_ms"] == 1800000
    assert fc["ranks"] == [1, 2, 3] and fc["silent_ranks"] == [0]


def test_dmesg_kill_numbers() -> None:
    top = diagnose([str(LOGS / "dmesg.log")]).findings[0]
    assert top.id == "host-oom-sigkill"
    assert top.data["failure_class"]["anon_rss_gib"] == pytest.approx(475.66, abs=0.01)


def test_stopped_from_outside_is_not_an_error(tmp_path: Path) -> None:
    log = tmp_path / "slurm.log"
    log.write_text(
        " 40%|####      | 400/1000 [1:00:00<1:30:00,  9.00s/it]\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 79, '
        "in _terminate_process_handler\n"
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 139101 got signal: 15\n"
    )
    findings = diagnose([str(log)]).findings
    assert findings[0].id == "class:terminated" and findings[0].severity is Severity.WARNING


def test_nccl_system_error_is_not_called_a_timeout() -> None:
    """deepspeedai/DeepSpeed#2931 (2-node inference): an InfiniBand completion error, then ncclSystemError."""
    top = diagnose([str(LOGS / "nccl_ib_error.log")]).findings[0]
    assert top.id == "nccl-ib-completion-error-12"  # the knowledge base names it; the class underneath stays
    assert top.data["failure_class"]["id"] == "class:nccl-error"
    assert "NET/IB : Got completion from peer" in top.data["failure_class"]["nccl_warn"]
    assert "timeout" not in top.title.lower()
