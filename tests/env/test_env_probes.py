"""Probes turn failure into notes: a broken or slow DeepSpeed is a record, never an exception."""

from __future__ import annotations

import subprocess
import sys

from zerodoctor.env import probes
from zerodoctor.env.model import DeepSpeedInfo


def test_parse_nvcc_version():
    out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.1, V12.1.105\n"
    assert probes.parse_nvcc_version(out) == "12.1"
    assert probes.parse_nvcc_version("garbage") is None


def test_read_module_constants(tmp_path):
    f = tmp_path / "version.py"
    f.write_text(
        "from typing import Optional\n__version__ = '2.1.0+cu121'\ncuda: Optional[str] = '12.1'\nhip = None\nx = foo()\n"
    )
    assert probes.read_module_constants(f) == {"__version__": "2.1.0+cu121", "cuda": "12.1", "hip": None}


def test_env_vars_are_filtered():
    env = {
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "secret",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "DS_SKIP_CUDA_CHECK": "1",
        "HOME": "/root",
    }
    assert probes.probe_env_vars(env) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "DS_SKIP_CUDA_CHECK": "1",
        "NCCL_DEBUG": "INFO",
    }


def test_find_cuda_home_prefers_env():
    assert probes.find_cuda_home({"CUDA_HOME": "/opt/cuda-12.1", "PATH": ""}) == "/opt/cuda-12.1"


def test_deep_probe_timeout_is_a_note(monkeypatch):
    def slow(*a, **k):
        raise subprocess.TimeoutExpired(cmd="python", timeout=1)

    monkeypatch.setattr(probes.subprocess, "run", slow)
    result, note, crashed = probes.run_deep_probe(1)
    assert result is None and not crashed and "did not finish in 1 s" in note
    ds = probes.merge_deep_probe(DeepSpeedInfo(version="0.19.8"), "0.19.8", result, note, crashed)
    assert ds.import_ok is None and ds.probe_note == note


def test_deep_probe_crash_is_a_record(monkeypatch):
    def crash(*a, **k):
        return subprocess.CompletedProcess(a, -11, stdout="", stderr="Segmentation fault")

    monkeypatch.setattr(probes.subprocess, "run", crash)
    result, note, crashed = probes.run_deep_probe(5)
    assert result is None and crashed and "exited with code -11" in note
    ds = probes.merge_deep_probe(None, "0.19.8", result, note, crashed)
    assert ds.import_ok is False and "Segmentation fault" in ds.import_error


def test_deep_probe_import_failure(monkeypatch):
    real_run = subprocess.run

    def broken_python(cmd, **kw):  # run the real script where `import deepspeed` fails
        script = "import sys; sys.modules['deepspeed'] = None\n" + cmd[2]
        return real_run([sys.executable, "-c", script], **kw)

    monkeypatch.setattr(probes.subprocess, "run", broken_python)
    result, note, crashed = probes.run_deep_probe(60)
    assert note is None and result["import_ok"] is False and result["stage"] == "import deepspeed"
    ds = probes.merge_deep_probe(None, "0.19.8", result, note, crashed)
    assert ds.import_ok is False and "import deepspeed" in ds.import_error


def test_gpu_probe_without_driver_is_normal():
    gpus, probed, note = probes.probe_gpus()
    if not gpus:
        assert note  # "no GPU: ..." or "could not check ..."
    else:
        assert probed and gpus[0].memory_total_bytes


def test_host_probe_without_dev_shm(tmp_path):
    host, notes = probes.probe_host(shm_path=str(tmp_path / "missing"))
    assert host.shm_total_bytes is None
    assert any("does not exist" in n for n in notes)
