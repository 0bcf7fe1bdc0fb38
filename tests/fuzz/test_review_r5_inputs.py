"""Review R5 (session 12): odd inputs that crashed, hung or passed silently; each now gets a clear answer.

Every case runs through `zerodoctor.cli.main.main([...])` on files written to tmp_path; no engine runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoctor.cli.main import main


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ["[1, 2]", "'zero3'", "5", "true"])
@pytest.mark.parametrize("command", [["lint"], ["plan", "--model", "llama-3-8b"]])
def test_accelerate_deepspeed_config_not_a_mapping(tmp_path, capsys, value, command):
    """Item 3: `deepspeed_config:` that is not a mapping was an AttributeError (exit 3) in zero3_init_flag."""
    cfg = _write(
        tmp_path / "acc.yaml",
        f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config: {value}\nnum_processes: 2\n",
    )
    rc = main([command[0], str(cfg), *command[1:]])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{cfg}:3: deepspeed_config: expected a mapping" in err
    assert "Traceback" not in err


DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
}  # fmt: skip
QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "vocab_size": 151936,
    "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
}  # fmt: skip
CLUSTER = ["--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "512", "--method", "lora"]


@pytest.mark.parametrize(
    ("base", "change", "words"),
    [
        (
            QWEN2_MOE,
            {"num_hidden_layers": 10**12},
            "num_hidden_layers = 1000000000000 is more than any published",
        ),
        (
            DEEPSEEK_V3,
            {"num_hidden_layers": 10**12},
            "num_hidden_layers = 1000000000000 is more than any published",
        ),
        (
            DEEPSEEK_V3,
            {"moe_layer_freq": 0},
            "field 'moe_layer_freq' must be a whole number above 0, found 0",
        ),
    ],
)
def test_model_layer_counts_are_checked_before_any_per_layer_loop(tmp_path, capsys, base, change, words):
    """Item 5: a huge layer count hung in the per-layer sums (qwen2_moe, deepseek_v3) and moe_layer_freq 0
    divided by zero; both are now a one-line error naming config.json and the key, and quick."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **change}), encoding="utf-8")
    rc = main(["plan", "--model", str(tmp_path), *CLUSTER])
    err = capsys.readouterr().err
    assert rc == 2
    assert words in err and "config.json" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--ignore", "--select"])
def test_an_empty_rule_code_names_no_rule(tmp_path, capsys, flag):
    """Item 9: `--ignore ""` matched every code (startswith("")) and turned lint off."""
    ds = _write(tmp_path / "ds.json", '{"train_micro_batch_size_per_gpu": 0}')
    rc = main(["lint", str(ds), flag, ""])
    out = capsys.readouterr().out
    assert rc == 1
    assert "DS002" in out


PLAN_CLUSTER = ["--model", "llama-3-8b", "--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "512"]


def _plan_json(argv: list[str], capsys) -> dict:
    rc = main(["plan", *argv, *PLAN_CLUSTER, "--format", "json"])
    out = capsys.readouterr().out
    assert rc in (0, 1)
    return json.loads(out)


def test_xtuner_augmented_assignment_is_evaluated(tmp_path, capsys):
    """Item 10: `accumulative_counts *= sequence_parallel_size` (XTuner's template) was ignored: accum 16, not 32;
    `int(32768 / sequence_parallel_size)` stayed symbolic and seq became the 2048 default."""
    cfg = _write(
        tmp_path / "sp_config.py",
        "from xtuner.engine import *\nsequence_parallel_size = 2\nbatch_size = 1\naccumulative_counts = 16\n"
        "accumulative_counts *= sequence_parallel_size\nmax_length = int(32768 / sequence_parallel_size)\n",
    )
    training = _plan_json([str(cfg)], capsys)["training"]
    assert training["grad_accum"] == 32
    assert training["seq_len"] == 16384


def test_xtuner_values_left_symbolic_are_named_as_assumed(tmp_path, capsys):
    """Item 10: a value the reader cannot evaluate became a default with no word; now a note names key and line."""
    cfg = _write(
        tmp_path / "xt_config.py",
        "from xtuner.engine import *\nbatch_size = mystery(16)\nmax_length = 2048 // 0\naccumulative_counts = 4\n",
    )
    notes = _plan_json([str(cfg)], capsys)["notes"]
    assert any(
        f"{cfg}:2: batch_size = mystery(16) could not be evaluated" in n and "--micro-batch" in n
        for n in notes
    )
    assert any(
        f"{cfg}:3: max_length = 2048 // 0 could not be evaluated" in n and "--seq-len" in n for n in notes
    )
    # a flag that gives the value makes the note moot
    notes = _plan_json([str(cfg), "--seq-len", "1024", "--micro-batch", "2"], capsys)["notes"]
    assert not any("could not be evaluated" in n for n in notes)


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"bf16": True}, "bf16", "argument after ** must be a mapping, not bool"),
        ({"fp16": 1}, "fp16", "argument after ** must be a mapping, not int"),
        ({"bf16": "auto"}, "bf16", "argument after ** must be a mapping, not str"),
        ({"optimizer": "AdamW"}, "optimizer", "'str' object has no attribute 'keys'"),
        ({"optimizer": []}, "optimizer", "'list' object has no attribute 'keys'"),
        ({"optimizer": {"type": 5}}, "optimizer.type", "'int' object has no attribute 'lower'"),
        ({"scheduler": "x"}, "scheduler", "'str' object has no attribute 'keys'"),
        ({"zero_optimization": None}, "zero_optimization", "must be a mapping, not NoneType"),
        (
            {"activation_checkpointing": True},
            "activation_checkpointing",
            "'bool' object has no attribute 'get'",
        ),
        ({"communication_data_type": 5}, "communication_data_type", "'int' object has no attribute 'lower'"),
        ({"amp": {"enabled": True}}, "amp", "NVIDIA Apex AMP integration has been removed"),
        ({"gradient_clipping": "1.0"}, "gradient_clipping", "must be a number"),
        (
            {"zero_optimization": {"stage": True}},
            "zero_optimization.stage",
            "reads a boolean as the number 1",
        ),
        (
            {"zero_optimization": {"stage": 2, "allgather_bucket_size": -1}},
            "zero_optimization.allgather_bucket_size",
            "Input should be greater than or equal to 0",
        ),
        (
            {"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}},
            "zero_optimization.reduce_bucket_size",
            "Input should be greater than 0",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": 5}}},
            "zero_optimization.offload_param.nvme_path",
            "Input is not a valid path",
        ),
    ],
)
def test_default_lint_refuses_what_deepspeeds_constructor_refuses(tmp_path, capsys, change, key, words):
    """Item 8: lint said "No problems found" / check "READY" for configs DeepSpeed 0.19.8's DeepSpeedConfig()
    rejects (checked against the installed DeepSpeed by the review); the default lint now reports each."""
    ds = _write(
        tmp_path / "ds.json",
        json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, **change}),
    )
    rc = main(["lint", str(ds), "--framework", "deepspeed", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    hits = [
        f
        for f in report["findings"]
        if f["id"] == "DS001" and f["severity"] == "error" and any(e.get("key") == key for e in f["evidence"])
    ]
    assert hits and words in hits[0]["message"], report["findings"]


def test_unknown_kind_hint_names_only_commands_that_have_kind(tmp_path, capsys):
    """Item 14(a): plan and check were told to use --kind, which they lack."""
    cfg = _write(tmp_path / "odd.yaml", "something: 1\nelse: 2\n")
    rc = main(["plan", str(cfg), *PLAN_CLUSTER])
    err = capsys.readouterr().err
    assert rc == 2
    assert "cannot tell what kind of config this is" in err
    assert "name it with --kind" not in err and "`zerodoctor lint --kind KIND`" in err


HF_ARGS = "model_name_or_path: meta-llama/Meta-Llama-3-8B\noutput_dir: o\nper_device_train_batch_size: 1\n"


@pytest.mark.parametrize(("make", "words"), [("dir", "is a directory"), ("loop", "is a symbolic link loop")])
def test_a_named_deepspeed_config_that_is_not_a_file_says_what_it_is(tmp_path, capsys, make, words):
    """Item 14(b): a directory or a symlink loop named by `deepspeed:` was reported as not existing."""
    target = tmp_path / "ds.json"
    if make == "dir":
        target.mkdir()
    else:
        target.symlink_to(target)
    cfg = _write(tmp_path / "hf.yaml", HF_ARGS + "deepspeed: ds.json\n")
    main(["lint", str(cfg)])
    out = capsys.readouterr().out
    assert f"but {target} {words}" in out
    rc = main(["check", str(cfg), *PLAN_CLUSTER])
    err = capsys.readouterr().err
    assert rc == 2 and f"but {target} {words}" in err and "does not exist" not in err


def test_the_same_file_twice_is_one_config_and_stdin_twice_is_an_error(tmp_path, capsys, monkeypatch):
    """Item 14(c), (d): `lint ds.json ds.json` said "two DeepSpeed configs"; `lint - -` said the file is empty."""
    ds = _write(
        tmp_path / "ds.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}'
    )
    assert main(["lint", str(ds), str(ds)]) == 0
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("{}"))
    capsys.readouterr()
    assert main(["lint", "-", "-"]) == 2
    assert "- (standard input) can be given only once" in capsys.readouterr().err


def test_fix_of_stdin_is_refused_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Item 14(e): `lint - --fix` wrote a file named `-.fixed`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO('{"train_batch_size": 64}'))
    assert main(["lint", "-", "--fix"]) == 2
    assert "--fix cannot write the fixed copy of standard input" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_check_list_checks_in_json(capsys):
    """Item 14(f): `check --list-checks --format json` printed text."""
    assert main(["check", "--list-checks", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["checks"]
    assert any(r["id"] == "DS001" and r["name"] == "deepspeed.invalid-config" for r in rows)


def test_check_only_empty_runs_every_check(tmp_path, capsys):
    """Item 14(g): `check --only ""` ran nothing and answered "could not check" with 0 findings."""
    ds = _write(
        tmp_path / "ds.json",
        '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, '
        '"zero_optimization": {"stage": 2}}',
    )
    rc = main(["check", str(ds), *PLAN_CLUSTER, "--only", "", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)
    assert any(f["id"] == "DS002" for f in report["findings"])  # the checks ran (DS002 warns at 8 GPUs)


def test_lint_refuses_a_world_size_that_is_not_nodes_times_gpus(tmp_path, capsys):
    """Item 14(l): lint accepted --world-size 16 --nodes 2 --gpus-per-node 4 (check flags it)."""
    ds = _write(tmp_path / "ds.json", '{"train_micro_batch_size_per_gpu": 1}')
    rc = main(["lint", str(ds), "--world-size", "16", "--nodes", "2", "--gpus-per-node", "4"])
    assert rc == 2
    assert "world size 16 (--world-size) is not 2 node(s) x 4 GPUs" in capsys.readouterr().err


def test_kb_help_does_not_mention_fail_on(capsys):
    """Item 14(m): kb's help epilog spoke of --fail-on, which kb lacks."""
    assert main(["kb", "--help"]) == 0
    assert "--fail-on" not in capsys.readouterr().out


def test_findings_of_one_rule_are_capped(tmp_path, capsys):
    """Item 14(j): 100k unknown keys printed one finding each (43 MB, 56 s); now 50 and one summary."""
    keys = {f"unknown_{i}": 1 for i in range(300)}
    ds = _write(tmp_path / "ds.json", json.dumps({"zero_optimization": {"stage": 2, **keys}}))
    rc = main(["lint", str(ds), "--framework", "deepspeed", "--format", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert rc == 1
    ds001 = [f for f in findings if f["id"] == "DS001"]
    assert len(ds001) == 51
    assert any("250 further DS001 finding(s) are not shown" in f["message"] for f in ds001)


def test_yaml_duplicate_keys_are_reported(tmp_path, capsys):
    """Item 14(k): a key written twice in a YAML passed silently (last wins); JSON duplicates were flagged."""
    cfg = _write(tmp_path / "hf.yaml", HF_ARGS + "per_device_train_batch_size: 4\n")
    rc = main(["lint", str(cfg), "--format", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert rc == 0
    dup = [f for f in findings if f["id"] == "ZD005"]
    assert len(dup) == 1
    assert "`per_device_train_batch_size` is written more than once" in dup[0]["message"]
    assert "so the run uses 4" in dup[0]["message"] and dup[0]["evidence"][0]["line"] == 4
