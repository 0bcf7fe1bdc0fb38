"""A hand-edited snapshot with wrongly typed fields is a one-line error naming the field, never a traceback."""

from __future__ import annotations

import json

import pytest

BAD = [
    (
        {"gpus": [{"index": "x", "name": "A100", "memory_total_bytes": 1}], "gpus_probed": True},
        "gpus[0].index",
    ),
    ({"host": {"ram_total_bytes": "big"}}, "host.ram_total_bytes"),
    ({"host": {"shm_total_bytes": [1]}}, "host.shm_total_bytes"),
    ({"torch": {"version": 5, "cuda": 12}}, "torch.version"),
    ({"deepspeed": {"version": "0.14.2", "installed_ops": "x"}}, "deepspeed.installed_ops"),
]


@pytest.mark.parametrize(("fields", "where"), BAD)
@pytest.mark.parametrize("command", ["env", "check"])
def test_wrongly_typed_snapshot_field(run_cli, tmp_path, fields, where, command):
    snap = tmp_path / "env.json"
    snap.write_text(json.dumps({"environment": {"schema_version": 1, **fields}}))
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 3}}')
    args = (
        ["--env", str(snap)] if command == "env" else [str(ds), "--env", str(snap), "--model", "llama-3.1-8b"]
    )
    code, out, err = run_cli(command, *args)
    assert code == 2 and "Traceback" not in err, err
    assert where in err and "env.json" in err and err.count("\n") == 1


def test_infinite_count_strings_in_hf_arguments_are_reported_not_crashed(run_cli, tmp_path):
    (tmp_path / "ds.json").write_text(
        '{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}'
    )
    (tmp_path / "args.yaml").write_text(
        'output_dir: o\ndeepspeed: ds.json\nper_device_train_batch_size: "inf"\ngradient_accumulation_steps: "1e999"\n'
    )
    code, out, err = run_cli("lint", str(tmp_path / "args.yaml"), "--world-size", "8")
    assert code == 1 and "Traceback" not in err and "per_device_train_batch_size" in out


def test_a_referenced_path_longer_than_the_file_system_allows(run_cli, tmp_path):
    (tmp_path / "args.yaml").write_text(f"output_dir: o\ndeepspeed: {'a' * 5000}.json\n")
    code, out, err = run_cli("lint", str(tmp_path / "args.yaml"))
    assert code in (0, 1) and "Traceback" not in err and "ZD001" in out
    code, _, err = run_cli("check", str(tmp_path))
    assert code == 2 and "does not exist" in err and err.count("\n") == 1
