"""A value of the training files the run cannot use is reported where it is written (ZD003), never a crash and
never silently replaced; `check` refuses it with one line."""

from __future__ import annotations

import pytest

CASES = [
    (
        "per_device_train_batch_size: 0",
        "per_device_train_batch_size",
        "micro batch must be a whole number above 0",
    ),
    ("cutoff_len: lots", "cutoff_len", "sequence length must be a whole number above 0, got 'lots'"),
    ("lora_r: 1e300\nuse_peft: true", "lora_r", "larger than any count a training run can use"),
    (
        "optim: adafactor_2bit_magic\nper_device_train_batch_size: 1",
        None,
        None,
    ),  # unknown optimizers are not judged
]


@pytest.mark.parametrize(("extra", "key", "needle"), CASES)
def test_invalid_value_is_reported_at_its_line(run_cli, tmp_path, extra, key, needle):
    (tmp_path / "ds.json").write_text(
        '{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}'
    )
    (tmp_path / "args.yaml").write_text(f"output_dir: o\ndeepspeed: ds.json\n{extra}\n")
    code, out, err = run_cli("lint", str(tmp_path / "args.yaml"), "--format", "json")
    import json

    found = [f for f in json.loads(out)["findings"] if f["id"] == "ZD003"]
    if key is None:
        assert not found
        return
    assert code == 1, err
    assert len(found) == 1 and found[0]["evidence"][0]["key"] == key and found[0]["evidence"][0]["line"] == 3
    assert needle in found[0]["message"]
    code, _, err = run_cli(
        "check", str(tmp_path), "--gpu-memory", "80", "--host-ram", "512", "--gpus-per-node", "8"
    )
    assert code == 2 and needle in err and err.count("\n") == 1
