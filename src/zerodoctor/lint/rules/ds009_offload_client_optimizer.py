"""DS009 deepspeed.offload-client-optimizer: ZeRO-Offload with an optimizer DeepSpeed did not build.

Why it matters: since DeepSpeed 0.8.3 (PR #2971), `deepspeed.initialize` raises "ZeRORuntimeException: You are
using ZeRO-Offload with a client provided optimizer (<class 'torch.optim.adamw.AdamW'>) which in most cases
will yield poor performance..." when `offload_optimizer` is on, the config has no `optimizer` block, the
script passes its own optimizer, and `zero_force_ds_cpu_optimizer` is true (the default).

What frameworks do for you: HF Trainer and LLaMA-Factory go through accelerate, which swaps a torch optimizer
for `DeepSpeedCPUAdam` when optimizer offload is on (accelerate `accelerator.py` prepare_deepspeed), so they
are not reported. XTuner/mmengine pass the config's torch AdamW straight to `deepspeed.initialize`; XTuner's own
offload JSON sets `"zero_force_ds_cpu_optimizer": false` for that reason (it then runs torch AdamW on CPU
tensors). A plain DeepSpeed script with its own optimizer hits the exception.

Fix (safe): an `"optimizer": {"type": "AdamW", ...}` block, so DeepSpeed builds DeepSpeedCPUAdam; or
`"zero_force_ds_cpu_optimizer": false` (slow CPU step with a GPU optimizer class; bnb 8-bit optimizers will
not work with offload).
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import as_number, offload_device
from zerodoctor.setup.run import RunDescription
from zerodoctor.versions import parse_version

INTRODUCED = "0.8.3"  # DeepSpeed PR #2971


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.ds_written is None or offload_device(setup, "optimizer") not in ("cpu", "nvme"):
        return
    have = parse_version(setup.package_version("deepspeed"))
    if have is not None and have < parse_version(INTRODUCED):  # type: ignore[operator]
        return
    if setup.framework not in ("deepspeed", "xtuner"):
        return  # accelerate converts the optimizer; unknown launcher: no verdict
    if isinstance(setup.ds_written.get("optimizer"), dict):
        return
    # DeepSpeed reads this key raw and uses its Python truth value ("false" the string counts as true).
    force = setup.ds_written.get("zero_force_ds_cpu_optimizer", True)
    if not force:
        return
    how = "is true" if "zero_force_ds_cpu_optimizer" in setup.ds_written else "defaults to true"
    who = (
        "XTuner passes the config's optimizer (torch AdamW)"
        if setup.framework == "xtuner"
        else "the training script must pass its own optimizer"
    )
    yield RULE.finding(
        f"Optimizer offload is on and the DeepSpeed config has no optimizer block, so {who} to deepspeed.initialize, "
        "which raises 'ZeRORuntimeException: You are using ZeRO-Offload with a client provided optimizer' "
        f"(zero_force_ds_cpu_optimizer {how}).",
        evidence=[setup.ds_evidence("zero_optimization.offload_optimizer.device")],
        fixes=[
            _optimizer_block_fix(run),
            Fix(
                "Or allow the client optimizer (slow CPU step)",
                target="deepspeed",
                patch={"zero_force_ds_cpu_optimizer": False},
            ),
        ],
        severity=Severity.ERROR if setup.framework == "xtuner" else Severity.WARNING,
    )


def _user_learning_rate(run: RunDescription) -> float | None:
    """The learning rate the user's own files give (XTuner `lr` / `optim_wrapper.optimizer.lr`, HF/LLaMA-Factory
    `learning_rate`): a fix writes it, never a value the user did not imply."""
    s = run.files
    candidates = []
    if s.xtuner_doc is not None:
        candidates += [s.xtuner_doc.get(("optim_wrapper", "optimizer", "lr")), s.xtuner_doc.get("lr")]
    if s.args_doc is not None:
        candidates.append(s.args_doc.get("learning_rate"))
    for value in candidates:
        num = as_number(value)
        if num is not None and num > 0 and num != float("inf"):
            return float(num)
    return None


def _optimizer_block_fix(run: RunDescription) -> Fix:
    lr = _user_learning_rate(run)
    if lr is None:
        return Fix(
            'Add an optimizer block so DeepSpeed builds DeepSpeedCPUAdam: "optimizer": {"type": "AdamW", '
            '"params": {"lr": <your learning rate>}} (not applied automatically: the learning rate is yours)'
        )
    return Fix(
        f"Add an optimizer block so DeepSpeed builds DeepSpeedCPUAdam (lr {lr:g} from your config)",
        target="deepspeed",
        patch={"optimizer": {"type": "AdamW", "params": {"lr": lr}}},
    )


RULE = Rule(
    code="DS009",
    name="deepspeed.offload-client-optimizer",
    title="ZeRO-Offload with a client optimizer",
    severity=Severity.ERROR,
    references=("bitsandbytes-foundation/bitsandbytes#596", "OpenMOSS/MOSS#272", "OptimalScale/LMFlow#693"),
    check=check,
    fix_safety="safe",
)
