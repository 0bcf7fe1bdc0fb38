"""The live probe on this machine (no GPU here: that must be a normal answer)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zerodoctor.env import Environment, collect, judge_environment


def test_collect_shallow_is_a_normal_answer():
    env = collect(deep=False)
    assert env.source == "live"
    assert env.python == ".".join(map(str, sys.version_info[:3]))
    assert env.packages_complete
    assert env.packages["torch"].version and env.versions()["deepspeed"]
    assert env.versions()["llamafactory"] == ""  # tracked, not installed here: known absent
    assert env.torch is not None and env.torch.build_known
    assert env.deepspeed is not None and "cpu_adam" in env.deepspeed.installed_ops
    assert env.deepspeed.import_ok is None  # deep probe off: not tried
    assert env.host is not None and env.host.ram_total_bytes and env.host.memlock_known
    if not env.gpus:
        assert env.gpu_probe_note
    facts = env.facts()
    assert facts["env.host_ram_bytes"] > 0 and "env.memlock_bytes" in facts
    json.dumps(env.to_dict())  # JSON-ready
    ids = {f.id for f in judge_environment(env, include_kb=False)}
    assert all(f.startswith("ENV") for f in ids)
    if not env.gpus and env.gpus_probed:
        assert "ENV006" in ids


@pytest.fixture(scope="module")
def deep_env() -> Environment:
    return collect(deep=True)


def test_collect_deep_runs_the_deepspeed_ops_subprocess(deep_env):
    ds = deep_env.deepspeed
    assert ds is not None
    assert ds.import_ok is True, ds.probe_note
    assert "cpu_adam" in ds.compatible_ops or "cpu_adam" in ds.installed_ops
    assert ds.accelerator  # "cpu" on this machine
    assert ds.ninja_available is not None and ds.extensions_root
    assert ds.cpu_adam_cached in (True, False)


def test_live_snapshot_round_trip(deep_env, tmp_path):
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"environment": deep_env.to_dict()}))
    from zerodoctor.env import load_env

    loaded = load_env(path)
    assert loaded.source == f"snapshot:{path}"
    assert loaded.to_dict() | {"source": "live"} == deep_env.to_dict()


@pytest.mark.parametrize(
    "module", ["zerodoctor.env", "zerodoctor.env.snapshot", "zerodoctor.env.model", "zerodoctor.env.judge"]
)
def test_import_does_not_import_torch(module):
    code = (
        f"import sys, {module}\n"
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_shallow_collect_does_not_import_torch():
    code = (
        "import sys; from zerodoctor.env import collect; collect(deep=False); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
