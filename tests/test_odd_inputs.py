"""Odd inputs found by the fuzz campaign in the run description, the model reader, accelerate configs and the
log reader: each ends in an answer or a one-line error."""

from __future__ import annotations

import os

import pytest


def _one_line(err: str) -> None:
    assert err.startswith("zerodoctor: error: ") and err.count("\n") == 1 and "Traceback" not in err, err


def test_model_config_with_zero_heads(run_cli, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 0, "num_hidden_layers": 2, '
        '"vocab_size": 100, "intermediate_size": 128}'
    )
    code, _, err = run_cli(
        "plan", "--model", str(cfg), "--gpus-per-node", "1", "--gpu-memory", "8", "--host-ram", "8"
    )
    assert code == 2 and "num_attention_heads' must be a whole number above 0" in err
    _one_line(err)


@pytest.mark.parametrize("value", ["5", "true", "[bf16]"])
def test_accelerate_mixed_precision_of_the_wrong_type(run_cli, tmp_path, value):
    acc = tmp_path / "acc.yaml"
    acc.write_text(
        f"distributed_type: DEEPSPEED\nmixed_precision: {value}\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n"
    )
    code, out, err = run_cli("lint", str(acc))
    assert code in (0, 1) and "Traceback" not in err, err


def test_sequence_parallel_error_names_where_both_values_came_from(run_cli):
    code, _, err = run_cli(
        "plan", "--model", "llama-3.1-8b", "--gpus-per-node", "5", "--sequence-parallel", "8",
        "--gpu-memory", "80", "--host-ram", "100",
    )  # fmt: skip
    assert code == 2 and "(--sequence-parallel)" in err
    _one_line(err)


def test_unknown_model_names_the_config_line(run_cli, tmp_path):
    args = tmp_path / "m.yaml"
    args.write_text("model_name_or_path: 5e8\nstage: sft\nfinetuning_type: lora\n")
    code, _, err = run_cli(
        "plan", str(args), "--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "100"
    )
    assert code == 2 and "m.yaml:1:1 (model_name_or_path): unknown model '5e8'" in err
    _one_line(err)


def test_diagnose_odd_paths(run_cli, tmp_path):
    code, _, err = run_cli("diagnose", "x" * 300)
    assert code == 2 and "File name too long" in err
    _one_line(err)
    code, _, err = run_cli("diagnose", "/dev/zero")
    assert code == 2 and "is a device or socket" in err
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    code, _, err = run_cli("diagnose", str(fifo))  # no writer: empty, not a hang
    assert code == 2 and "the log is empty" in err


# ---- report: guard record files a damaged or hand-edited run leaves (fuzz campaign 2026-11-25) ---------------


def _guard_run(tmp_path, lines0: list[str] | None = None, error: bytes | None = None):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    from generators import _record_lines

    d = tmp_path / "run" / "zerodoctor"
    d.mkdir(parents=True)
    (d / "rank0.jsonl").write_text("\n".join(lines0 or _record_lines(0)) + "\n")
    (d / "rank1.jsonl").write_text("\n".join(_record_lines(1)) + "\n")
    if error is not None:
        (d / "error-rank1.json").write_bytes(error)
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("world_size", "1000000000", "world_size: 1000000000 is not a rank count"),  # was a MemoryError
        ("world_size", "1e999", "world_size: inf is not a finite measurement"),  # was an OverflowError
        ("step", "Infinity", "step: inf is not a finite measurement"),
        ("rss", "9" * 5000, "unreadable line"),  # json.loads' 4,300-digit ValueError: was exit 3
        ("gpu_allocated", '"12"', "gpu_allocated: '12' is not a number"),
        ("phase", '{"a": 1}', "phase: {'a': 1} is not a name"),  # was unhashable in the projection
        ("gpu_allocated", "null", "gpu_allocated: None is not a number"),  # was a TypeError (fragmentation)
    ],
)
def test_report_skips_records_with_values_no_guard_writes(run_cli, tmp_path, key, value, said):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    from generators import _record_lines, _set_json_value

    lines = _record_lines(0)
    at = 0 if key == "world_size" else 3
    lines[at] = _set_json_value(lines[at], key, value)
    code, out, err = run_cli("report", str(_guard_run(tmp_path, lines)), "--format", "json")
    assert code == 0 and "Traceback" not in err, err
    notes = json.loads(out)["notes"]
    assert any(said in n for n in notes), notes


def test_report_damaged_findings_and_error_files(run_cli, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    from generators import _record_lines, _set_json_value

    lines = _record_lines(0)
    lines[-1] = _set_json_value(_set_json_value(lines[-1], "fixes", "true"), "data", "5")  # were TypeErrors
    run = _guard_run(tmp_path, lines, error=b'{"rank": 1, "diagnosis": "oom", "message": "x"}')
    code, out, err = run_cli("report", str(run), "--format", "json")
    assert code == 0 and "Traceback" not in err and '"rank 1 failed"' in out, err


def test_report_rank_file_that_is_a_fifo_does_not_hang(run_cli, tmp_path):
    run = _guard_run(tmp_path)
    os.mkfifo(run / "zerodoctor" / "rank2.jsonl")
    os.mkfifo(run / "zerodoctor" / "error-rank0.json")
    code, out, err = run_cli("report", str(run), "--format", "json")  # no writer: read as empty
    assert code == 0 and "Traceback" not in err, err


# ---- guard: options and ZERODOCTOR_GUARD_* variables are checked before the command runs -------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--host-limit-gib", "inf"], "--host-limit-gib: expected a finite size"),  # was OverflowError
        (["--host-limit-gib", "nan"], "--host-limit-gib: expected a finite size"),  # was ValueError
        (["--host-limit-gib", "1e308"], "--host-limit-gib: expected a size up to"),  # was OverflowError
        (["--host-limit-gib", "-1"], "--host-limit-gib: expected a size above 0"),  # was accepted
        (["--hang-factor", "nan"], "--hang-factor: expected a number above 0"),  # was accepted
        (["--hang-first-s", "-5"], "--hang-first-s: expected a number above 0"),  # was accepted
        (["--hang-first-s", "1e12"], "--hang-first-s: expected a number above 0 and up to"),  # timer overflow
        (["--every", "1.5"], "--every: expected a whole number"),
    ],
)
def test_guard_refuses_odd_options_before_running(run_cli, tmp_path, argv, said):
    marker = tmp_path / "ran"
    code, _, err = run_cli("guard", *argv, "--run-dir", str(tmp_path / "g"), "--", "touch", str(marker))
    assert code == 2 and said in err and "Traceback" not in err, err
    assert not marker.exists() and not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    ("var", "value"),
    [("EVERY", "1e999"), ("HANG_FACTOR", "nan"), ("HANG_FIRST_S", "-1"), ("HOST_MEASURE", "bogus")],
)
def test_guard_refuses_odd_variables_before_running(run_cli, tmp_path, monkeypatch, var, value):
    monkeypatch.setenv("ZERODOCTOR_GUARD_" + var, value)
    marker = tmp_path / "ran"
    code, _, err = run_cli("guard", "--run-dir", str(tmp_path / "g"), "--", "touch", str(marker))
    assert code == 2 and f"ZERODOCTOR_GUARD_{var}='{value}' is not a valid" in err, err
    _one_line(err)
    assert not marker.exists()


# ---- check --fix and selftest --workdir: a place that cannot be written is one line, not exit 3 -------------


def test_check_fix_into_a_directory_name_too_long(run_cli, tmp_path):
    setup = tmp_path / "setup"
    setup.mkdir()
    (setup / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}')
    before = (setup / "ds.json").read_bytes()
    code, _, err = run_cli("check", str(setup), "--fix", str(tmp_path / ("x" * 300)), "--env", "none")
    assert code == 2 and "cannot write there: File name too long" in err, err  # was OSError, exit 3
    _one_line(err)
    assert (setup / "ds.json").read_bytes() == before


def test_selftest_workdir_that_is_a_file(run_cli, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}')
    before = ds.read_bytes()
    code, _, err = run_cli("selftest", str(ds), "--model", "llama-3-8b", "--workdir", str(ds))
    assert code == 2 and "--workdir" in err and "File exists" in err, err  # was FileExistsError, exit 3
    _one_line(err)
    assert ds.read_bytes() == before


def test_report_keeps_the_guards_own_text_and_null_fields(run_cli, tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    from generators import _record_lines, _set_json_value

    lines = _record_lines(0)
    lines[0] = _set_json_value(_set_json_value(lines[0], "gpu_uuid", '"GPU-1"'), "gpu_name", '"H100"')
    lines[1] = _set_json_value(lines[1], "rss_hwm", "null")  # an event may carry a null
    code, out, err = run_cli("report", str(_guard_run(tmp_path, lines)), "--format", "json")
    assert code == 0 and not json.loads(out)["notes"], out


# ---- selftest: a value the run cannot use is refused before torchrun starts (it ran the defaults instead) ---


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("gradient_accumulation_steps: 2001-12-14", "args.yaml:4:1 (gradient_accumulation_steps)"),
        ("cutoff_len: 1e999", "(cutoff_len): sequence length must be a whole number above 0"),
    ],
)
def test_selftest_refuses_an_invalid_value_before_the_launch(run_cli, tmp_path, monkeypatch, line, said):
    import time

    import zerodoctor.selftest.run as st_run

    def launched(*_a, **_k):
        raise AssertionError("the selftest started a real run for a setup with an invalid value")

    monkeypatch.setattr(st_run, "launch", launched)
    (tmp_path / "ds.json").write_text(
        '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}'
    )
    args = tmp_path / "args.yaml"
    key = line.split(":")[0]
    base = {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
        "stage": "sft",
        "finetuning_type": "lora",
        "gradient_accumulation_steps": "8",
        "cutoff_len": "2048",
        "per_device_train_batch_size": "1",
        "deepspeed": "ds.json",
    }
    base[key] = line.split(": ", 1)[1]
    args.write_text("".join(f"{k}: {v}\n" for k, v in base.items()))
    start = time.process_time()
    code, _, err = run_cli("selftest", str(args))
    assert code == 2 and said in err, err
    _one_line(err)
    assert time.process_time() - start < 2.0


def test_report_draws_a_bounded_number_of_rank_panels(tmp_path, monkeypatch):
    """A 400-rank run drew 400 panels per chart (over 20 s of CPU, fuzz seed 502654): the outliers and the
    lowest ranks are drawn, and the title says how many of how many."""
    from pathlib import Path

    pytest.importorskip("matplotlib")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "report_conftest", Path(__file__).parent / "report" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    write_run = module.write_run

    from zerodoctor.report import plots
    from zerodoctor.report.run_report import load_run

    report = load_run(write_run(tmp_path, steps=4))
    monkeypatch.setattr(plots, "MAX_SMALL_MULTIPLES", 2)
    chart = plots.gpu_per_rank(report)
    assert chart is not None and "(2 of 4 ranks: outliers and the lowest; the JSON has all)" in chart.title
    assert 3 in report.outliers  # the synthetic run's outlier is among the panels drawn
