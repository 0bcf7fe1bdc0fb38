"""`zerodoctor diagnose` through main(): exit codes, JSON contract, text grouping, bad input, a healthy run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.cli.main import main

SIGKILL = (
    "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited\n"
    "[ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', '--local_rank=0'] "
    "exits with return code = -9\n"
)


def test_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "run.log"
    p.write_text(SIGKILL)
    assert main(["diagnose", "--format", "json", str(p)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "diagnose"
    top = doc["findings"][0]
    assert top["id"] == "host-oom-sigkill"
    assert top["data"]["first_failure"]["rank"] == 0
    assert top["data"]["phase"] in {
        "load",
        "zero_init",
        "first_optimizer_step",
        "training_step",
        "epoch_end",
        "evaluation",
        "checkpoint_save",
        "unknown",
    }
    assert top["evidence"][0]["line"] == 2


def test_text_groups_verdict_candidates_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "run.log"
    p.write_text(SIGKILL)
    assert main(["diagnose", str(p), "--fail-on", "never"]) == 0
    out = capsys.readouterr().out
    assert out.index("Verdict:") < out.index("Timeline:")
    assert "first failure: rank 0" in out


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "empty.log"
    p.write_text("")
    assert main(["diagnose", str(p)]) == 2
    err = capsys.readouterr().err
    assert "empty" in err and "Traceback" not in err
    assert main(["diagnose", str(tmp_path / "missing.log")]) == 2


def test_healthy_text_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "ok.log"
    p.write_text(
        "***** Running training *****\n{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
    )
    assert main(["diagnose", str(p), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [f["id"] for f in doc["findings"]] == ["no-known-failure"]


@pytest.mark.engine
def test_real_healthy_zero3_offload_run_has_no_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerodoctor.engine.launch import run_tiny_job

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        },
    }
    job = run_tiny_job(config, nproc=2, steps=2, workdir=tmp_path / "job")
    assert job.ok, job.output[-3000:]
    log = tmp_path / "healthy.log"
    log.write_text(job.output)
    assert main(["diagnose", "--format", "json", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]


def test_warnings_that_matter_are_listed_in_the_timeline(run_cli):
    """The KB's warning-kind signatures (here HF Trainer's "gather=false, saving the full checkpoint instead")
    are reported in the timeline, once each, with where they are."""
    import json
    from pathlib import Path

    log = Path(__file__).parent / "corpus" / "save_gather_false_then_empty_weights_at_inference.log"
    code, out, _ = run_cli("diagnose", str(log), "--format", "json")
    warnings = json.loads(out)["timeline"]["warnings"]
    assert any("Saving the full checkpoint instead" in w["text"] for w in warnings), warnings
    assert len({w["text"] for w in warnings}) == len(warnings)
    assert all(":" in w["location"] for w in warnings)
    code, text, _ = run_cli("diagnose", str(log))
    assert "warning at " in text and "Saving the full checkpoint instead" in text


def test_diagnose_imports_only_its_own_command(tmp_path: Path) -> None:
    """Cold start: `zerodoctor diagnose` does not import the other commands' machinery (selftest's launcher, the
    planner, the environment probes), which would cost it its 0.5 s start-up target."""
    import subprocess
    import sys

    log = tmp_path / "run.log"
    log.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n", encoding="utf-8")
    code = (
        "import sys; from zerodoctor.cli.main import main; rc = main(['diagnose', sys.argv[1]]);"
        "heavy = sorted(m for m in sys.modules if m.startswith(('zerodoctor.selftest', 'zerodoctor.plan',"
        " 'zerodoctor.env.probes', 'zerodoctor.check', 'zerodoctor.guard')));"
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    assert "HEAVY []" in out.stdout, out.stdout[-500:]
