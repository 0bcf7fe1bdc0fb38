"""`zerodoctor plan` when nothing fits answers like `check` (one source, zerodoctor.plan.nothing_fits): the phase
that binds, by how much, and the changes that make THIS run fit -- found by planning it again, named by the user's
keys and values -- and each change it proposes does fit when the user makes it (issue 9)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LF_LORA = ROOT / "examples" / "healthy-llamafactory-lora"
GENERIC = "add GPUs or nodes, shorten --seq-len or lower --micro-batch"


def _findings(run_cli, *args: str) -> dict[str, dict]:
    code, out, err = run_cli(*args, "--format", "json")
    assert out, err
    return {f["id"]: f for f in json.loads(out)["findings"]}


def _big_batch_case(tmp_path: Path, batch: int = 64, cutoff: int = 8192) -> Path:
    case = tmp_path / "lf"
    shutil.copytree(LF_LORA, case, dirs_exist_ok=True)
    yaml = case / "qwen2_5_7b_lora_sft.yaml"
    text = yaml.read_text().replace("per_device_train_batch_size: 1", f"per_device_train_batch_size: {batch}")
    yaml.write_text(text.replace("cutoff_len: 2048", f"cutoff_len: {cutoff}"))
    return case


CLUSTER = ("--nodes", "1", "--gpus-per-node", "2", "--gpu-memory", "24", "--host-ram", "128")


def test_plan_names_the_users_keys_and_a_computed_change(run_cli, tmp_path):
    case = _big_batch_case(tmp_path)
    yaml = case / "qwen2_5_7b_lora_sft.yaml"
    found = _findings(run_cli, "plan", str(yaml), *CLUSTER)
    f = found["PLAN006"]
    assert GENERIC not in f["message"]
    assert f["data"]["phase"] == "steady" and f["data"]["resource"] == "gpu"
    assert "activations" in f["data"]["dominant"]
    # by how much: need and capacity, and the difference in the text
    over = (f["data"]["need_bytes"] - f["data"]["capacity_bytes"]) / 2**30
    assert f"({over:,.1f} GiB over)" in f["message"]
    assert "per_device_train_batch_size (64, qwen2_5_7b_lora_sft.yaml:" in f["message"]
    assert "cutoff_len (8192, qwen2_5_7b_lora_sft.yaml:" in f["message"]
    change = f["data"]["changes"][0]
    assert change["strategy"] == "ZeRO-3 [lora]"  # the user's own strategy and method, not a QLoRA fallback
    assert f["fixes"][0].startswith("With ZeRO-3 [lora]: ")
    # PLAN001 (the user's strategy) says the same, not the generic line
    assert GENERIC not in found["PLAN001"]["message"] and "PLAN006" in found["PLAN001"]["message"]


def test_each_proposed_change_fits_when_the_user_makes_it(run_cli, tmp_path):
    case = _big_batch_case(tmp_path)
    yaml = case / "qwen2_5_7b_lora_sft.yaml"
    f = _findings(run_cli, "plan", str(yaml), *CLUSTER)["PLAN006"]
    assert f["data"]["changes"]
    for change in f["data"]["changes"]:
        text = yaml.read_text()
        if change["kind"] == "batch_1_seq_len":
            text = text.replace("per_device_train_batch_size: 64", "per_device_train_batch_size: 1")
            text = text.replace("cutoff_len: 8192", f"cutoff_len: {change['value']}")
        elif change["kind"] == "micro_batch":
            text = text.replace(
                "per_device_train_batch_size: 64", f"per_device_train_batch_size: {change['value']}"
            )
        elif change["kind"] == "seq_len":
            text = text.replace("cutoff_len: 8192", f"cutoff_len: {change['value']}")
        changed = tmp_path / "changed.yaml"
        changed.write_text(text)
        shutil.copy(case / "ds_z3_config.json", tmp_path / "ds_z3_config.json")
        after = _findings(run_cli, "plan", str(changed), *CLUSTER)
        assert "PLAN006" not in after and "PLAN001" not in after, change


def _env_with(tmp_path: Path, **versions: str) -> str:
    """An environment snapshot naming only the given package versions (what `zerodoctor env --json` records)."""
    from zerodoctor.env.model import Environment, PackageInfo

    env = Environment(python="3.11", platform="linux", packages={k: PackageInfo(k, v) for k, v in versions.items()})
    path = tmp_path / "env.json"
    path.write_text(json.dumps(env.to_dict()))
    return str(path)


def test_host_bound_run_is_told_how_many_ranks_per_node_fit(run_cli, tmp_path):
    # transformers 5.23: a PEFT save under ZeRO-3 gathers only the adapters (with 4.x or an unknown version the
    # closest candidate is bound by rank 0's whole-model save instead: plan/host_save.py)
    env = ("--env", _env_with(tmp_path, transformers="5.23.0"))
    args = ("plan", "--model", "llama-3.1-405b", "--nodes", "1", "--gpus-per-node", "8", *env)
    f = _findings(run_cli, *args, "--gpu-memory", "80", "--host-ram", "64")["PLAN006"]
    assert f["data"]["resource"] == "host" and f["data"]["phase"] == "load"
    change = f["data"]["changes"][0]
    assert change["kind"] == "ranks_per_node"
    g = change["value"]
    assert f"{g} ranks per node on {8 // g} nodes (the same 8 GPUs, now 8 per node on 1)" in f["message"]
    after = _findings(
        run_cli,
        "plan",
        "--model",
        "llama-3.1-405b",
        "--nodes",
        str(8 // g),
        "--gpus-per-node",
        str(g),
        "--gpu-memory",
        "80",
        "--host-ram",
        "64",
        *env,
    )
    assert "PLAN006" not in after


def test_when_no_single_change_fits_it_says_what_was_tried(run_cli, tmp_path):
    f = _findings(
        run_cli,
        "plan",
        "--env",
        _env_with(tmp_path, transformers="5.23.0"),  # adapter-only PEFT saves (see above)
        "--model",
        "llama-3.1-70b",
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--gpu-memory",
        "16",
        "--host-ram",
        "32",
    )["PLAN006"]
    assert f["data"]["changes"] == []
    assert "none of these fits on its own: up to 128 nodes of 8 GPUs" in f["message"]
    assert GENERIC not in f["message"]


def test_micro_batch_one_is_not_told_to_lower_it(run_cli, tmp_path):
    f = _findings(
        run_cli,
        "plan",
        "--env",
        _env_with(tmp_path, transformers="5.23.0"),  # adapter-only PEFT saves (see above)
        "--model",
        "llama-3.1-405b",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--gpu-memory",
        "8",
        "--host-ram",
        "64",
    )["PLAN006"]
    assert "lower --micro-batch" not in f["message"] and "shorten --seq-len (2048, assumed)" in f["message"]


def test_plan_and_check_give_the_same_answer(run_cli, tmp_path):
    case = _big_batch_case(tmp_path)
    (case / "cluster.yaml").write_text("nodes: 1\ngpus_per_node: 2\ngpu_memory_gib: 24\nhost_ram_gib: 128\n")
    from_check = _findings(run_cli, "check", str(case))["PLAN006"]
    from_plan = _findings(
        run_cli, "plan", str(case / "qwen2_5_7b_lora_sft.yaml"), "--env", str(case / "env.txt"), *CLUSTER
    )["PLAN006"]
    assert from_check["message"] == from_plan["message"]
    assert from_check["fixes"] == from_plan["fixes"]


def test_the_changes_come_from_the_planner_itself():
    """The change found is the boundary: one step further does not fit with the same strategy."""
    from dataclasses import replace

    from zerodoctor.plan.candidates import plan
    from zerodoctor.plan.inputs import PlanOptions, build_inputs
    from zerodoctor.plan.nothing_fits import SEQ_STEP, advise
    from zerodoctor.plan.phases import plan_strategy

    i = build_inputs(
        PlanOptions(model="llama-3.1-70b", nodes=1, gpus_per_node=4, gpu_memory_gib=12, host_ram_gib=512)
    )
    r = plan(i)
    assert r.recommended is None
    a = advise(i, r.candidates, r.margin)
    assert a is not None and a.changes[0].kind == "seq_len"
    base = next(s for s in r.candidates if s.name == a.changes[0].strategy)
    n = a.changes[0].value
    assert plan_strategy(i, base.zero, replace(base.training, seq_len=n), label=base.label).fits
    assert not plan_strategy(
        i, base.zero, replace(base.training, seq_len=n + SEQ_STEP), label=base.label
    ).fits


def test_an_evaluation_that_binds_is_answered_with_the_eval_batch(run_cli, tmp_path):
    case = tmp_path / "ev"
    shutil.copytree(LF_LORA, case)
    yaml = case / "qwen2_5_7b_lora_sft.yaml"
    yaml.write_text(
        yaml.read_text()
        + "val_size: 0.1\neval_strategy: steps\neval_steps: 100\nper_device_eval_batch_size: 64\n"
    )
    f = _findings(run_cli, "plan", str(yaml), *CLUSTER)["PLAN006"]
    assert f["data"]["phase"] == "eval"
    kinds = [c["kind"] for c in f["data"]["changes"]]
    assert kinds and kinds[0] == "eval_batch"
    assert {c["strategy"] for c in f["data"]["changes"]} == {"ZeRO-3 [lora]"}  # one strategy, the user's
    n = f["data"]["changes"][0]["value"]
    assert (
        "per_device_eval_batch_size (64, qwen2_5_7b_lora_sft.yaml:" in f["message"]
        and f"-> {n}:" in f["message"]
    )
    yaml.write_text(
        yaml.read_text().replace("per_device_eval_batch_size: 64", f"per_device_eval_batch_size: {n}")
    )
    assert "PLAN006" not in _findings(run_cli, "plan", str(yaml), *CLUSTER)
