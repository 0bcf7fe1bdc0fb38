"""Every place the installed libraries judge a configuration is named `class:config-rejected`, with the frame that
judged it: the raise and assert statements of DeepSpeed's config parsing and engine sanity checks, transformers'
DeepSpeed integration and TrainingArguments, accelerate's plugins and Accelerator, PEFT's LoRA config - read from
the installed sources (their AST), so a new check in a new release is covered the day it is installed.

Each site becomes a traceback whose innermost frame is that file, line and function, and whose exception line is
the statement's message (f-string fields as `X`); a site that is not a configuration check (reading a checkpoint
back, a weight conversion, a runtime state) is listed in NOT_CONFIG with its reason.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose

# file (inside its package) -> the functions whose raises are checked (None: every function of the file)
SITES: dict[str, tuple[str, ...] | None] = {
    "deepspeed/runtime/config.py": None,
    "deepspeed/runtime/zero/config.py": None,
    "deepspeed/runtime/config_utils.py": None,
    "deepspeed/runtime/engine.py": (
        "_do_sanity_check",
        "_do_args_sanity_check",
        "_configure_with_arguments",
        "_configure_optimizer",
        "_configure_basic_optimizer",
        "_configure_zero_optimizer",
    ),
    "transformers/integrations/deepspeed.py": None,
    "transformers/training_args.py": ("__post_init__", "_validate_args"),
    "accelerate/utils/dataclasses.py": None,
    "accelerate/accelerator.py": ("__init__", "_prepare_deepspeed"),
    # the Trainer's constructor checking the model and arguments it is given
    "transformers/trainer.py": ("__init__",),
    "peft/tuners/lora/config.py": None,
    # BaseTuner checking a tuner config against the model while it injects the adapters
    "peft/tuners/tuners_utils.py": (
        "inject_adapter",
        "_prepare_adapter_config",
        "_inject_parameters",
        "_check_lora_target_modules_mamba",
        "_check_target_module_compatiblity",
    ),
    # LoraModel: a target module of a type LoRA cannot wrap, configs that cannot be combined
    "peft/tuners/lora/model.py": (
        "_create_new_module",
        "_prepare_adapter_config",
        "_check_new_adapter_config",
    ),
}
# Raise sites in those files that judge no configuration (function -> why).
NOT_CONFIG = {
    "_apply_weight_conversions_to_state_dict": "converting checkpoint weights at load",
    "deepspeed_load_checkpoint": "reading a checkpoint back (a resume)",
    "deepspeed_sp_compute_loss": "a runtime state: no sequence-parallel group exists",
    "dtype": "HfDeepSpeedConfig used before trainer_config_process (a call-order bug)",
    "set_deepspeed_weakref": "a missing package (ImportError in spirit)",
    "set_moe_leaf_modules": "a model class not found in the model",
    "selected": "a property set the wrong way (an API misuse)",
    "select": "a plugin not enabled (an API misuse)",
    "_get_profiler_activity": "a profiler activity name",
}
# (import failures are class:import-error; a RuntimeError in these files is a runtime state, not a refused setting)
SKIP_TYPES = frozenset({"ImportError", "ModuleNotFoundError", "RuntimeError"})


def _text(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _text(node.func.value)
    return "X"


def _sites() -> list[tuple[str, int, str, str, str]]:
    found: list[tuple[str, int, str, str, str]] = []
    for rel, funcs in SITES.items():
        spec = importlib.util.find_spec(rel.split("/", 1)[0])
        if spec is None or not spec.submodule_search_locations:
            continue
        path = Path(next(iter(spec.submodule_search_locations))).parent / rel
        if not path.is_file():
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (funcs is not None and fn.name not in funcs) or fn.name in NOT_CONFIG:
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and n.exc.args:
                    f = n.exc.func
                    exc = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "?"
                    found.append((rel, n.lineno, fn.name, exc, _text(n.exc.args[0])))
                elif isinstance(n, ast.Assert) and n.msg is not None:
                    found.append((rel, n.lineno, fn.name, "AssertionError", _text(n.msg)))
    return [s for s in found if s[3] not in SKIP_TYPES]


SITES_FOUND = _sites()


def test_the_sources_were_read() -> None:
    # DeepSpeed, transformers and accelerate are installed with the project's test extras
    assert len(SITES_FOUND) > 100


@pytest.mark.parametrize(
    ("rel", "lineno", "func", "exc", "message"), SITES_FOUND, ids=[f"{s[0]}:{s[1]}" for s in SITES_FOUND]
)
def test_config_raise_site_is_config_rejected(
    tmp_path: Path, rel: str, lineno: int, func: str, exc: str, message: str
) -> None:
    msg = " ".join(message.split())
    log = tmp_path / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/home/user/train.py", line 12, in <module>\n'
        "    main()\n"
        f'  File "/opt/conda/lib/python3.10/site-packages/{rel}", line {lineno}, in {func}\n'
        f"    raise {exc}(\n"
        f"{exc}: {msg}\n"
    )
    top = diagnose([str(log)]).findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    assert fc["id"] == "class:config-rejected", (top.id, top.title)
    assert fc["judged_by"] == f"{rel}:{lineno} in {func}"


@pytest.mark.parametrize(
    ("line", "key"),
    [
        # transformers 4.30's deepspeed_optim_sched (DeepSpeedExamples#600, transformers#24359): no frame pasted
        (
            "ValueError: Found `optimizer` configured in the DeepSpeed config, but no `scheduler`. Please configure a "
            "scheduler in the DeepSpeed config.",
            "optimizer",
        ),
        # DeepSpeed's zero/config.py validator, pasted alone
        ("ValueError: compute_grad_norm=false is supported only with ZeRO Stage 1 or 2", "compute_grad_norm"),
        # accelerate's FSDP plugin __post_init__
        (
            "ValueError: `activation_checkpointing_offload=True` requires `activation_checkpointing=True`.",
            "activation_checkpointing_offload",
        ),
        # TrainingArguments __post_init__
        (
            "ValueError: evaluation strategy steps requires either non-zero --eval_steps or --logging_steps",
            "eval_steps",
        ),
    ],
)
def test_frameless_refusal_names_its_key(tmp_path: Path, line: str, key: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(line + "\n")
    top = diagnose([str(log)]).findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    assert fc["id"] == "class:config-rejected", (top.id, top.title)
    assert key in fc["keys"]


@pytest.mark.parametrize(
    "line",
    [
        "ValueError: too many values to unpack (expected 2)",
        "ValueError: Expected input batch_size (16) to match target batch_size (8).",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two devices",
    ],
)
def test_frameless_runtime_errors_stay_crashes(tmp_path: Path, line: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(line + "\n")
    top = diagnose([str(log)]).findings[0]
    fc = top.data.get("failure_class") or {"id": top.id}
    assert fc["id"] != "class:config-rejected", line


# LLaMA-Factory's argument checks (hiyouga/LLaMA-Factory src/llamafactory/hparams/parser.py at 003a2ac: get_train_args,
# _verify_model_args), not installed here: their messages as the source raises them
LLAMAFACTORY = [
    ("get_train_args", "`predict_with_generate` cannot be set as True except SFT."),
    ("get_train_args", "Please launch distributed training with `llamafactory-cli` or `torchrun`."),
    ("get_train_args", "Please use `FORCE_TORCHRUN=1` to launch DeepSpeed training."),
    ("get_train_args", "`predict_with_generate` is incompatible with DeepSpeed ZeRO-3."),
    ("get_train_args", "GaLore and APOLLO are incompatible with DeepSpeed yet."),
    ("get_train_args", "Unsloth is incompatible with DeepSpeed ZeRO-3."),
    ("_verify_model_args", "Quantization is only compatible with the LoRA or OFT method."),
    ("_verify_model_args", "Adapter is only valid for the LoRA method."),
]


@pytest.mark.parametrize(("func", "message"), LLAMAFACTORY)
def test_llamafactory_argument_checks_are_config_rejected(tmp_path: Path, func: str, message: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/LLaMA-Factory/src/llamafactory/hparams/parser.py", line 200, in ' + func + "\n"
        '    raise ValueError("...")\n'
        f"ValueError: {message}\n"
    )
    top = diagnose([str(log)]).findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    assert fc["id"] == "class:config-rejected", (top.id, top.title)
    assert fc["judged_by"] == f"llamafactory/hparams/parser.py:200 in {func}"
