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


def test_a_paste_that_ends_inside_a_traceback_is_a_crash_placed_by_its_frames(tmp_path) -> None:
    """No exception line (the paste was cut): still a failure, in the optimizer step its frames name; the message
    says the type and message are not in the log."""
    frames = (
        'node-2:   File "/env/lib/python3.9/site-packages/deepspeed/runtime/engine.py", line 2087, in step\n'
        "node-2:     self._take_model_step(lr_kwargs)\n"
        'node-2:   File "/env/lib/python3.9/site-packages/deepspeed/runtime/engine.py", line 1994, in _take_model_step\n'
        "node-2:     scaled_global_grad_norm = get_global_norm(norm_list=norm_groups)\n"
        'node-2:   File "/env/lib/python3.9/site-packages/deepspeed/runtime/utils.py", line 307, in get_global_norm\n'
        "node-2:     total_norm += norm**2.0\n"
    )
    log = tmp_path / "cut.log"
    log.write_text("Traceback (most recent call last):\n" + frames, encoding="utf-8")
    d = diagnose([str(log)])
    top = d.findings[0]
    assert top.id == "class:crash", [f.id for f in d.findings]
    assert d.phase == "first_optimizer_step"
    assert "cut from the log" in top.title and "get_global_norm" in top.message
    # with a real failure elsewhere in the log, the cut traceback adds nothing
    log.write_text(
        "Traceback (most recent call last):\n" + frames + "exits with return code = -9\n", encoding="utf-8"
    )
    assert diagnose([str(log)]).findings[0].id == "host-oom-sigkill"


@pytest.mark.parametrize(
    ("stop_at", "class_id"), [("15:06:40", "class:collective-timeout"), ("14:57:10", "class:terminated")]
)
def test_a_ctrl_c_after_a_long_silence_is_a_hang(tmp_path, stop_at: str, class_id: str) -> None:
    """Users end a hung run with Ctrl-C before NCCL's watchdog fires: ten minutes without output before the
    `^C` is a hang (with both times in the message); a Ctrl-C 48 s after the last line is just a stop."""
    log = tmp_path / "run.log"
    log.write_text(
        "[INFO|trainer.py:2915] 2024-05-26 14:56:22,776 >> Saving model checkpoint to out/tmp-checkpoint-5\n"
        "Invalidate trace cache @ step 0: expected module 0, but got module 274\n"
        f"^C[2024-05-26 {stop_at},046] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 22523\n",
        encoding="utf-8",
    )
    d = diagnose([str(log)])
    assert d.findings[0].id == class_id, [f.id for f in d.findings]
    if class_id == "class:collective-timeout":
        assert d.findings[0].data["failure_class"]["silence_s"] == 618
        assert "10 min 18 s" in d.findings[0].title and "14:56:22" in d.findings[0].message


def test_the_op_builders_shared_checks_name_no_op_and_no_cpu_adam(tmp_path: Path) -> None:
    """DeepSpeed#1279: FusedAdam's build stops at the op builder's CUDA_HOME check (op_builder/builder.py, shared by
    every op). That file names no op, and the cpu_adam entry must not claim a log about another op's build."""
    log = tmp_path / "fused_adam_cuda_home.log"
    log.write_text(
        "My model trains fine with an optimizer from `torch.optim` but when using\n"
        "`deepspeed.ops.adam.FusedAdam` I get:\n"
        'File "/opt/lib/python3.8/site-packages/deepspeed/ops/op_builder/builder.py", line 38, in installed_cuda_version\n'
        '    assert cuda_home is not None, "CUDA_HOME does not exist, unable to compile CUDA op(s)"\n'
        "AssertionError: CUDA_HOME does not exist, unable to compile CUDA op(s)\n",
        encoding="utf-8",
    )
    findings = diagnose([str(log)]).findings
    assert findings[0].id == "class:op-build-failure"
    assert "'builder'" not in findings[0].title and "DS_BUILD_OPS=1" in findings[0].fixes[0].text
    assert "cpu-adam-build-failure" not in {f.id for f in findings}


def test_the_build_fix_names_the_failed_ops_own_switch() -> None:
    top = diagnose([str(LOGS / "build.log")]).findings[0]
    assert "DS_BUILD_TRANSFORMER_INFERENCE=1" in top.fixes[0].text


def test_the_oom_killers_task_table_alone_is_a_host_oom_kill(tmp_path: Path) -> None:
    """mm/oom_kill.c dump_tasks prints its table only while the OOM killer runs: a dmesg paste that kept only those
    rows (ktransformers#637, localised dmesg -T dates) proves a host OOM kill; a `ps` listing does not."""
    rows = "".join(
        f"[四 3月 20 21:01:25 2025] [{pid:7d}] {uid:5d} {pid:5d} {vm:8d} {rss:8d} {pt:8d} {sw:8d}         {adj:5d} {name}\n"
        for pid, uid, vm, rss, pt, sw, adj, name in [
            (2665, 0, 55756, 339, 77824, 68, 0, "crond"),
            (7958, 1000, 5195, 440, 86016, 416, 0, "systemd"),
            (86682, 0, 893460, 3496, 516096, 6431, -999, "containerd"),
        ]
    )
    log = tmp_path / "dmesg.log"
    log.write_text(rows, encoding="utf-8")
    assert diagnose([str(log)]).findings[0].id == "class:host-oom-kill"
    ps = tmp_path / "ps.log"
    ps.write_text(
        "USER       PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND\n"
        "root      2665  0.0  0.0  55756   339 ?        Ss   21:01   0:00 crond\n",
        encoding="utf-8",
    )
    assert not [f for f in diagnose([str(ps)]).findings if f.severity is Severity.ERROR]
