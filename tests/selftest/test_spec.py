"""SelftestSpec from a setup, without running anything: the tiny model, the scaled DeepSpeed config, the
batch for the selftest's ranks, and the CLI's input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.cli.main import main
from zerodoctor.errors import SetupError
from zerodoctor.models import model_from_config, resolve_model
from zerodoctor.selftest.shrink import shrink_model
from zerodoctor.selftest.spec import default_spec, run_config, spec_from_setup
from zerodoctor.setup.load import load_setup


@pytest.mark.parametrize(
    ("model", "keeps"),
    [
        ("mixtral-8x7b", ["grouped-query attention", "MoE (4 experts, 2 per token)"]),
        ("deepseek-coder-v2-lite", ["MoE", "multi-head latent attention"]),
        ("gemma-2-27b", ["tied input/output embeddings"]),
        ("llava-v1.6-34b", ["vision tower"]),
    ],
)
def test_shrunk_model_keeps_the_family_module_types(model, keeps):
    spec = resolve_model(model)
    tiny = shrink_model(spec.config, spec.display_name)
    counted = model_from_config(tiny.config, name="tiny", source=spec.source).params
    assert counted.total < 400_000
    assert counted.is_moe == spec.params.is_moe
    assert counted.tied_embeddings == spec.params.tied_embeddings
    for want in keeps:
        assert any(want in k for k in tiny.keeps), tiny.keeps


def test_remote_code_model_is_built_as_its_language_model_and_says_so():
    spec = resolve_model("minicpm-llama3-v-2.5")
    tiny = shrink_model(spec.config, spec.display_name)
    assert tiny.config["model_type"] == "llama"
    assert any("remote code" in n for n in tiny.notes)


def test_default_spec_scales_knobs_so_zero3_still_partitions():
    spec = default_spec()
    zero = spec.ds_config["zero_optimization"]
    assert spec.zero_stage == 3 and spec.offload_optimizer == "cpu" and spec.offload_param == "cpu"
    # 10 * hidden (40960 for Llama-3.1-8B) becomes 10 * 64: norms stay whole, 64x64 projections are partitioned
    assert zero["stage3_param_persistence_threshold"] == 640
    assert all(zero[k] % 64 == 0 for k in ("reduce_bucket_size", "sub_group_size", "allgather_bucket_size"))
    assert {a.key for a in spec.adaptations} >= {"zero_optimization.sub_group_size", "optimizer"}


def test_train_batch_size_follows_the_ranks_only_when_it_fits_the_user_world(tmp_path):
    cfg = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2},
    }
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    fits = spec_from_setup(load_setup([tmp_path / "ds.json"], framework="deepspeed", world_size=16))
    assert run_config(fits, 2)[0]["train_batch_size"] == 8
    wrong = spec_from_setup(load_setup([tmp_path / "ds.json"], framework="deepspeed", world_size=8))
    assert run_config(wrong, 2)[0]["train_batch_size"] == 16  # still wrong: 16 != 2 * 2 * 2


def test_setup_without_deepspeed_config_is_a_setup_error(tmp_path):
    (tmp_path / "args.yaml").write_text("output_dir: out\nper_device_train_batch_size: 2\n")
    with pytest.raises(SetupError, match="no DeepSpeed config"):
        spec_from_setup(load_setup([tmp_path / "args.yaml"]))


def test_cli_input_errors_exit_2(tmp_path, capsys):
    assert main(["selftest", str(tmp_path / "missing.json")]) == 2
    assert main(["selftest", "--model", "llama-3.1-8b"]) == 2
    assert "give its files too" in capsys.readouterr().err


def test_more_ranks_than_gpus_is_a_usage_error_before_launch():
    from zerodoctor.errors import UsageError
    from zerodoctor.selftest.run import LocalDevices, check_ranks

    one_gpu = LocalDevices(gpus=1, cores=16, note="CUDA_VISIBLE_DEVICES=3")
    assert check_ranks(None, one_gpu) == 1  # the default fits a one-GPU machine
    assert check_ranks(1, one_gpu) == 1
    with pytest.raises(UsageError) as err:
        check_ranks(2, one_gpu)
    assert str(err.value).startswith("--ranks 2: torch sees 1 CUDA GPU here (CUDA_VISIBLE_DEVICES=3)")
    assert "pass --ranks 1 or fewer" in str(err.value)
    assert check_ranks(None, LocalDevices(gpus=8, cores=64)) == 2
    assert check_ranks(8, LocalDevices(gpus=8, cores=64)) == 8
    with pytest.raises(UsageError, match="at least 1"):
        check_ranks(0, one_gpu)


def test_cpu_path_ranks_are_capped_by_cores():
    from zerodoctor.errors import UsageError
    from zerodoctor.selftest.run import LocalDevices, check_ranks, local_devices

    assert check_ranks(None, LocalDevices(gpus=0, cores=1)) == 2  # two ranks always, as the default needs
    assert check_ranks(2, LocalDevices(gpus=0, cores=1)) == 2
    assert check_ranks(6, LocalDevices(gpus=0, cores=6)) == 6
    with pytest.raises(UsageError) as err:
        check_ranks(7, LocalDevices(gpus=0, cores=6))
    assert "6 usable CPU cores" in str(err.value) and "Pass --ranks 6 or fewer" in str(err.value)
    forced = local_devices({"DS_ACCELERATOR": "cpu"})
    assert forced.gpus == 0 and forced.note == "DS_ACCELERATOR=cpu"


def test_cli_ranks_beyond_the_machine_exit_2_without_launching(tmp_path, capsys):
    from zerodoctor.selftest.run import local_devices

    too_many = str(local_devices().max_ranks + 1)
    assert main(["selftest", "--ranks", too_many, "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"--ranks {too_many}:" in err and "or fewer" in err
    assert not (tmp_path / "run").exists()  # refused before anything was launched
    # a setup directory is read as `check` reads it: its cluster.yaml and env.txt are skipped, not refused
    example = Path(__file__).resolve().parents[2] / "examples" / "llava-zero3-offload"
    assert (example / "cluster.yaml").exists()
    assert main(["selftest", str(example), "--ranks", too_many, "--workdir", str(tmp_path / "run")]) == 2
    assert f"--ranks {too_many}:" in capsys.readouterr().err


def test_stale_jit_build_lock_is_found(tmp_path, monkeypatch):
    import os
    import time

    from zerodoctor.selftest.run import stale_build_locks

    lock = tmp_path / "py311_cpu" / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert [p for p, _m in stale_build_locks(time.time())] == [lock]
    assert stale_build_locks(old - 1) == []
