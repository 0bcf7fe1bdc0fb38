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


def write_fix_dir(report: CheckReport, directory: Path) -> dict[str, Any]:
    """Write the copies; returns what was written and what was not fixed (for JSON and text output)."""
    from zerodoctor.lint.fixer import fixed_texts, plan_fixes

    if directory.exists() and not directory.is_dir():
        raise SetupError(
            f"--fix {directory}: is a file, not a directory", hint="name a new or existing directory"
        )
    setup = report.run.files
    own = {d.path.resolve() for d in setup.documents}
    changes, skipped = plan_fixes(setup, list(report.findings))
    plans = [(directory / doc.path.name, text) for doc, text in fixed_texts(setup, changes)]
    not_fixed = [f"{s.rule}: {s.reason}" for s in skipped]
    result = report.plan
    rec = result.recommended if result is not None else None
    if result is not None and rec is not None and (result.yours is None or result.yours.status != "fits"):
        if rec.zero.fsdp is not None:
            # an FSDP recommendation lives in the accelerate config, which has no DeepSpeed JSON to write
            not_fixed.append(
                f"plan: the recommended strategy is {rec.name}; set it in your accelerate config "
                "(distributed_type: FSDP, fsdp_config) - no DeepSpeed config written"
            )
        else:
            from zerodoctor.plan.emit import ds_config

            text = json.dumps(ds_config(result.inputs, rec, setup.ds_written), indent=2) + "\n"
            plans.append((directory / RECOMMENDED_NAME, text))
    written: list[str] = []
    if plans:
        directory.mkdir(parents=True, exist_ok=True)
    for target, text in plans:
        if target.resolve() in own:
            raise SetupError(
                f"--fix {directory}: {target.name} there is one of the setup's own files; not writing over it",
                hint="choose a different --fix directory",
            )
        target = _free(target)
        with target.open("x", encoding="utf-8") as fh:
            fh.write(text)
        written.append(str(target))
    return {
        "written": written,
        "changes": [c.describe() for c in changes],
        "not_fixed": not_fixed,
    }
