"""`load_env`: zerodoctor JSON snapshots and the pip listings users can most easily attach."""

from __future__ import annotations

import json

import pytest

from zerodoctor.env import load_env
from zerodoctor.env.model import DeepSpeedInfo, Environment, GpuInfo, HostInfo, PackageInfo, TorchInfo
from zerodoctor.errors import EnvError

FREEZE = """\
# a comment
accelerate==1.15.0
DeepSpeed==0.14.2
Flash_Attn==2.5.8

torch==2.1.0+cu121 ; python_version >= "3.8"
peft @ file:///wheels/peft-0.10.0-py3-none-any.whl
transformers @ git+https://github.com/huggingface/transformers@abc123
-e git+https://github.com/hiyouga/LLaMA-Factory.git@0f1e2d#egg=llamafactory
# Editable install with no version control (xtuner==0.1.23)
-e /home/me/xtuner
nvidia-cudnn-cu12==8.9.2.26
"""


def write(tmp_path, text, name="env.txt"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_pip_freeze_variants(tmp_path):
    env = load_env(write(tmp_path, FREEZE))
    v = env.versions()
    assert v["deepspeed"] == "0.14.2" and v["flash-attn"] == "2.5.8" and v["accelerate"] == "1.15.0"
    assert v["torch"] == "2.1.0+cu121"
    assert v["peft"] == "0.10.0"  # from the wheel file name
    assert (
        "transformers" not in v and env.packages["transformers"].version is None
    )  # installed, version unknown
    assert env.packages["llamafactory"].editable and env.packages["llamafactory"].version is None
    assert v["xtuner"] == "0.1.23" and env.packages["xtuner"].editable
    assert v["bitsandbytes"] == "" and v["trl"] == ""  # known absent: a freeze lists everything
    assert env.packages_complete and env.source.startswith("pip-freeze:")
    assert env.torch == TorchInfo(
        version="2.1.0+cu121", cuda="12.1", hip=None, cudnn="8.9.2.26", build_known=True
    )
    assert (
        env.deepspeed is not None and env.deepspeed.version == "0.14.2" and not env.deepspeed.compatible_ops
    )
    assert not env.gpus_probed and env.facts() == {}


def test_torch_without_label_has_unknown_build(tmp_path):
    env = load_env(write(tmp_path, "torch==2.3.1\n"))
    assert env.torch is not None and env.torch.cuda is None and not env.torch.build_known


def test_pip_list_table(tmp_path):
    text = "Package            Version     Editable project location\n------------------ ----------- -------------------------\ndeepspeed          0.14.1\nzerodoctor         0.1.0       /work/main\n"
    env = load_env(write(tmp_path, text))
    assert env.versions()["deepspeed"] == "0.14.1" and env.packages["zerodoctor"].editable


def test_pip_list_json(tmp_path):
    env = load_env(write(tmp_path, json.dumps([{"name": "deepspeed", "version": "0.14.2"}]), "l.json"))
    assert env.versions()["deepspeed"] == "0.14.2"


def test_pip_noise_lines_are_ignored(tmp_path):
    env = load_env(write(tmp_path, "WARNING: Ignoring invalid distribution ~orch\ntorch==2.2.0\n"))
    assert env.versions()["torch"] == "2.2.0"


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("torch==2.1.0\ndeepspeed>=0.14\n", ":2:", "requirements file"),
        ("torch==2.1.0\nthis is not a package line\n", ":2:", "expected 'name==version'"),
        ("hello world\n", ":1:", "not a recognised environment file"),
        ("Package Version\n------- -------\ntorch\n", ":3:", "pip list"),
    ],
)
def test_malformed_listing_names_file_and_line(tmp_path, text, where, words):
    p = write(tmp_path, text)
    with pytest.raises(EnvError) as exc:
        load_env(p)
    msg = str(exc.value)
    assert f"{p}{where}" in msg and words in msg


def test_neither_format_lists_accepted_formats(tmp_path):
    with pytest.raises(EnvError) as exc:
        load_env(write(tmp_path, "hello world\n"))
    assert "pip freeze" in str(exc.value) and "zerodoctor env --format json" in str(exc.value)


def test_bad_json_and_wrong_json(tmp_path):
    with pytest.raises(EnvError, match=r"env.json:2:\d+: invalid JSON"):
        load_env(write(tmp_path, '{"environment":\n  {oops}}', "env.json"))
    with pytest.raises(EnvError, match="not an environment snapshot"):
        load_env(write(tmp_path, '{"foo": 1}', "env.json"))
    with pytest.raises(EnvError, match="schema_version 99"):
        load_env(write(tmp_path, '{"environment": {"schema_version": 99}}', "env.json"))
    with pytest.raises(EnvError, match="malformed"):
        load_env(write(tmp_path, '{"environment": {"schema_version": 1, "gpus": [3]}}', "env.json"))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(EnvError, match="no such file"):
        load_env(tmp_path / "nope.json")
    with pytest.raises(EnvError, match="empty"):
        load_env(write(tmp_path, "\n\n"))


def full_env() -> Environment:
    return Environment(
        python="3.10.12",
        platform="Linux 5.15 x86_64",
        packages={
            "deepspeed": PackageInfo("deepspeed", "0.14.2"),
            "trl": PackageInfo("trl", ""),
            "peft": PackageInfo("peft", None, url="file:///x"),
        },
        packages_complete=True,
        torch=TorchInfo("2.1.0+cu121", cuda="12.1", cudnn="8.9.2.26"),
        deepspeed=DeepSpeedInfo(
            "0.14.2",
            installed_ops={"cpu_adam": True},
            compatible_ops={"cpu_adam": True},
            accelerator="cuda",
            installed_accelerator="cuda",
            import_ok=True,
        ),
        gpus=[
            GpuInfo(0, "NVIDIA A100-SXM4-80GB", 85899345920, "535.104.05", "12.2"),
            GpuInfo(1, "NVIDIA A100-SXM4-40GB", 42949672960, "535.104.05", "12.2"),
        ],
        gpus_probed=True,
        host=HostInfo(
            ram_total_bytes=2 * 1024**4,
            ram_available_bytes=1024**4,
            swap_total_bytes=0,
            shm_total_bytes=64 * 1024**2,
            shm_free_bytes=60 * 1024**2,
            memlock_soft_bytes=None,
            memlock_hard_bytes=None,
            memlock_known=True,
            cpu_count=96,
        ),
        cuda_home="/usr/local/cuda",
        nvcc_version="12.1",
        env_vars={"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1"},
        source="live",
        notes=["x"],
    )


def test_round_trip_and_facts(tmp_path):
    env = full_env()
    d = env.to_dict()
    assert d["schema_version"] == 1
    assert Environment.from_dict(json.loads(json.dumps(d))) == env
    bare = load_env(write(tmp_path, json.dumps(d), "bare.json"))
    assert bare.packages == env.packages and bare.gpus == env.gpus
    facts = env.facts()
    assert facts["env.gpu_count"] == 2 and facts["env.gpu_memory_bytes"] == 42949672960
    assert facts["env.shm_bytes"] == 64 * 1024**2 and facts["env.memlock_bytes"] == float("inf")
    assert facts["env.host_ram_available_bytes"] == 1024**4
    assert env.versions() == {"deepspeed": "0.14.2", "trl": ""}


def test_visible_gpu_count_follows_cuda_visible_devices():
    import dataclasses

    env = full_env()
    assert dataclasses.replace(env, env_vars={"CUDA_VISIBLE_DEVICES": "1"}).facts()["env.gpu_count"] == 1
    assert dataclasses.replace(env, env_vars={"CUDA_VISIBLE_DEVICES": ""}).facts()["env.gpu_count"] == 0
    assert dataclasses.replace(env, env_vars={}).facts()["env.gpu_count"] == 2
