"""`check --fix DIR`: corrected copies of the user's configs and the recommended DeepSpeed config, in DIR.

Only the lint rules' safe fixes are applied (a fix that changes training behaviour is listed, not applied),
and a fix only writes values the finding derived from the user's own setup. Nothing is ever written over a
user's file: DIR may be new or existing, but a copy that would land on one of the setup's own files is
refused, and an earlier copy in DIR is kept (the new one gets a numbered name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerodoctor.errors import SetupError

if TYPE_CHECKING:
    from zerodoctor.check.pipeline import CheckReport
    from zerodoctor.lint.fixer import Change
    from zerodoctor.setup.model import TrainingSetup

RECOMMENDED_NAME = "ds_config.recommended.json"


def _free(path: Path) -> Path:
    if not path.exists():
        return path
    for i in range(2, 1000):
        candidate = path.with_name(f"{path.stem}.{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise SetupError(
        f"{path.parent}: too many earlier copies of {path.name}", hint="clean the --fix directory"
    )


# What a recommended strategy consists of (plan/emit.py ds_config: stage, offload devices and pinning, the 16-bit
# gather at save); every other key and value of the user's config is kept as written.
PLAN_STRATEGY_FINDINGS = ("PLAN001:", "PLAN002:", "PLAN006:", "PLAN007:")
STRATEGY_KEYS = ("stage", "offload_optimizer", "offload_param", "stage3_gather_16bit_weights_on_model_save")


def _recommended(
    setup: TrainingSetup, emitted: dict[str, Any], changes: list[Change]
) -> tuple[str, list[str]]:
    """The user's DeepSpeed config (with this run's safe fixes) with only the strategy's keys taken from the
    recommendation, and every change listed; without a DeepSpeed JSON of the user's, the emitted config."""
    from zerodoctor.lint.fixer import dump_json, json_with_changes
    from zerodoctor.setup.deepspeed_config import ZERO_ALIASES

    doc = setup.ds_doc
    loaded = json_with_changes(doc, changes) if doc is not None else None
    if loaded is None:
        return json.dumps(emitted, indent=2) + "\n", [
            "a new DeepSpeed config (no DeepSpeed JSON of yours to start from)"
        ]
    data, indent = loaded
    rec_zero = emitted.get("zero_optimization") or {}
    zero = data.get("zero_optimization")
    if not isinstance(zero, dict):
        zero = data["zero_optimization"] = {}
    log: list[str] = []
    for key in STRATEGY_KEYS:
        spelled = [k for k in zero if k == key or ZERO_ALIASES.get(k) == key]
        old = zero[spelled[0]] if spelled else None
        new = rec_zero.get(key)
        if _same(old, new):
            continue
        for k in spelled[1:] if new is not None else spelled:
            zero.pop(k)
        if new is not None:
            zero[spelled[0] if spelled else key] = new
        log.append(
            f"zero_optimization.{key}: {_shown(old) if spelled else '(not set)'} -> "
            f"{_shown(new) if new is not None else '(removed)'}"
        )
    return dump_json(data, indent), log or ["no change: your config already is the recommended strategy"]


def _same(a: Any, b: Any) -> bool:
    from zerodoctor.lint.fixer import plain

    return bool(plain(a) == plain(b))


def _shown(value: Any) -> str:
    from zerodoctor.lint.fixer import plain

    return json.dumps(plain(value), default=str)


def _fix_dir_error(directory: Path, exc: OSError) -> SetupError:
    from zerodoctor.safeio import shown

    return SetupError(
        f"--fix {shown(directory, 80)}: cannot write there: {exc.strerror or exc}",
        hint="name a writable directory with a shorter path",
    )


def write_fix_dir(report: CheckReport, directory: Path) -> dict[str, Any]:
    """Write the copies; returns what was written and what was not fixed (for JSON and text output)."""
    from zerodoctor.lint.fixer import fixed_texts, plan_fixes

    try:
        is_file = directory.exists() and not directory.is_dir()
    except OSError as exc:  # a name longer than the file system allows, a loop of links
        raise _fix_dir_error(directory, exc) from None
    if is_file:
        raise SetupError(
            f"--fix {directory}: is a file, not a directory", hint="name a new or existing directory"
        )
    setup = report.run.files
    own = {d.path.resolve() for d in setup.documents}
    changes, skipped = plan_fixes(setup, list(report.findings))
    plans = [(directory / doc.path.name, text) for doc, text in fixed_texts(setup, changes)]
    rec_log: list[str] = []
    not_fixed = [f"{s.rule}: {s.reason}" for s in skipped]
    result = report.plan
    rec = result.recommended if result is not None else None
    if result is not None and rec is not None and (result.yours is None or not result.yours.fits):
        if rec.zero.fsdp is not None:
            # an FSDP recommendation lives in the accelerate config, which has no DeepSpeed JSON to write
            not_fixed.append(
                f"plan: the recommended strategy is {rec.name}; set it in your accelerate config "
                "(distributed_type: FSDP, fsdp_config) - no DeepSpeed config written"
            )
        else:
            from zerodoctor.plan.emit import ds_config

            emitted = ds_config(result.inputs, rec, setup.ds_written)
            text, rec_changes = _recommended(setup, emitted, changes)
            plans.append((directory / RECOMMENDED_NAME, text))
            rec_log = [f"{RECOMMENDED_NAME}: plan ({rec.name}): {c}" for c in rec_changes]
            # the planner's "use this strategy" findings are what the recommended config carries out
            not_fixed = [
                f"{n.split(':', 1)[0]}: written as {RECOMMENDED_NAME} (your own config is not changed)"
                if n.startswith(PLAN_STRATEGY_FINDINGS)
                else n
                for n in not_fixed
            ]
            if setup.args_doc is not None and setup.ds_doc is not None:
                not_fixed.append(
                    f"plan: {setup.args_doc.display} still names {setup.ds_doc.path.name}; point its DeepSpeed "
                    f"setting at {RECOMMENDED_NAME} to use the recommended strategy"
                )
    written: list[str] = []
    try:
        if plans:
            directory.mkdir(parents=True, exist_ok=True)
        for target, text in plans:
            if target.resolve() in own:
                raise SetupError(
                    f"--fix {directory}: {target.name} there is one of the setup's own files; not writing over "
                    "it",
                    hint="choose a different --fix directory",
                )
            target = _free(target)
            with target.open("x", encoding="utf-8") as fh:
                fh.write(text)
            written.append(str(target))
    except OSError as exc:  # not writable, a file on the way, a name too long, the disk full
        raise _fix_dir_error(directory, exc) from None
    return {
        "written": written,
        "changes": [c.describe() for c in changes] + rec_log,
        "not_fixed": not_fixed,
    }
