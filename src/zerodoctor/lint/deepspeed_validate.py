"""Validate a DeepSpeed config with DeepSpeed's own config models (`DeepSpeedConfig`), in a subprocess.

A subprocess because importing DeepSpeed imports torch (seconds) and a broken install must not take lint
down. The config DeepSpeed sees is the effective one: "auto" values the framework fills at launch are filled
where known and otherwise removed (the framework fills them; DeepSpeed never sees "auto" there). The world
size is given to DeepSpeed's parser when known; when not, `train_batch_size` is left out so DeepSpeed's batch
assertion is not judged against a world size of 1 that the job will not have.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

from zerodoctor.findings import Evidence, Finding, Severity
from zerodoctor.lint.rules import RULES
from zerodoctor.lint.rules._common import fillable_auto_keys, is_auto
from zerodoctor.setup.model import TrainingSetup

TIMEOUT_S = 120

_PROBE = r"""
import json, sys
request = json.loads(sys.stdin.read())
out = {"version": None, "errors": []}
try:
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    out["version"] = deepspeed.__version__
    ws = request["world_size"]
    if ws:
        # Tell DeepSpeed's parser the job's world size (it asks torch.distributed, which is not running here).
        dist.get_rank = lambda *a, **k: 0
        dist.get_world_size = lambda *a, **k: ws
    try:
        DeepSpeedConfig(request["config"])
    except Exception as exc:
        errs = getattr(exc, "errors", None)
        if callable(errs):
            for e in exc.errors():
                out["errors"].append({"loc": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg", ""),
                                      "type": type(exc).__name__, "model": getattr(exc, "title", "")})
        else:
            out["errors"].append({"loc": "", "msg": str(exc), "type": type(exc).__name__})
except Exception as exc:
    out["import_error"] = f"{type(exc).__name__}: {exc}"
print("ZD-RESULT " + json.dumps(out))
"""


# pydantic model title -> where its fields live in the config (pydantic reports locations per model).
_MODEL_PREFIX = {"DeepSpeedZeroConfig": "zero_optimization.",
                 "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer.",
                 "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param.",
                 "DeepSpeedFP16Config": "fp16.", "DeepSpeedBF16Config": "bf16."}


def _config_for_deepspeed(setup: TrainingSetup) -> dict[str, Any]:
    cfg = copy.deepcopy(setup.effective_ds or {})
    fillable = fillable_auto_keys(setup.framework)

    def strip(node: dict[str, Any], prefix: str = "") -> None:
        for k in list(node):
            v = node[k]
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                strip(v, key + ".")
            elif is_auto(v) and (fillable is None or key in fillable):
                del node[k]

    strip(cfg)
    if not setup.world_size:
        cfg.pop("train_batch_size", None)
    return cfg


def validate_with_deepspeed(setup: TrainingSetup, python: str | None = None) -> list[Finding]:
    if setup.ds_written is None:
        return []
    request = {"config": _config_for_deepspeed(setup), "world_size": setup.world_size}
    rule = RULES["DS001"].RULE
    try:
        proc = subprocess.run([python or sys.executable, "-c", _PROBE], input=json.dumps(request), text=True,
                              capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [rule.finding(f"DeepSpeed's own validation did not finish in {TIMEOUT_S} s; only the built-in checks ran.",
                             severity=Severity.INFO)]
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ZD-RESULT ")), None)
    if line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [rule.finding(f"DeepSpeed's own validation could not run ({tail}); only the built-in checks ran.",
                             severity=Severity.INFO)]
    result = json.loads(line[len("ZD-RESULT "):])
    if result.get("import_error"):
        return [rule.finding(f"DeepSpeed is not importable here ({result['import_error']}); only the built-in checks "
                             "ran. `zerodoctor env` says more.", severity=Severity.INFO)]
    findings = []
    for err in result["errors"]:
        loc = err["loc"]
        prefix = _MODEL_PREFIX.get(err.get("model", ""), "")
        key = f"{prefix}{loc}".rstrip(".")
        ev: Evidence = setup.ds_evidence(key) if key else Evidence(file=setup.ds_doc.display if setup.ds_doc else None)
        findings.append(Finding(
            id="DS001", name="deepspeed.invalid-config:deepspeed", severity=Severity.ERROR,
            title=f"DeepSpeed {result['version']} rejects this config",
            message=f"DeepSpeed's own config parser ({err['type']}): " + (f"{loc}: " if loc else "") + err["msg"],
            evidence=(ev,), references=rule.references, source="deepspeed",
        ))
    return findings
