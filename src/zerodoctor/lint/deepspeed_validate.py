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

# Reads a list of {"config", "world_size"} requests, answers one result per request on one line.
_PROBE = r"""
import json, sys
requests = json.loads(sys.stdin.read())
out = {"version": None, "results": []}
try:
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    out["version"] = deepspeed.__version__
    real_rank, real_ws = dist.get_rank, dist.get_world_size
    for request in requests:
        errors = []
        ws = request["world_size"]
        # Tell DeepSpeed's parser the job's world size (it asks torch.distributed, which is not running here).
        dist.get_rank = (lambda *a, **k: 0) if ws else real_rank
        dist.get_world_size = (lambda *a, _ws=ws, **k: _ws) if ws else real_ws
        try:
            DeepSpeedConfig(request.get("path") or request["config"])
        except Exception as exc:
            errs = getattr(exc, "errors", None)
            if callable(errs):
                for e in exc.errors():
                    errors.append({"loc": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg", ""),
                                   "type": type(exc).__name__, "model": getattr(exc, "title", "")})
            else:
                errors.append({"loc": "", "msg": str(exc), "type": type(exc).__name__})
        out["results"].append(errors)
except Exception as exc:
    out["import_error"] = f"{type(exc).__name__}: {exc}"
print("ZD-RESULT " + json.dumps(out))
"""


# pydantic model title -> where its fields live in the config (pydantic reports locations per model).
_MODEL_PREFIX = {
    "DeepSpeedZeroConfig": "zero_optimization.",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer.",
    "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param.",
    "DeepSpeedFP16Config": "fp16.",
    "DeepSpeedBF16Config": "bf16.",
}


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


def _request(setup: TrainingSetup) -> dict[str, Any]:
    """When DeepSpeed would read the file exactly as written (nothing to fill, world size known or no
    train_batch_size), hand it the path: its own JSON loader then also judges duplicate keys."""
    cfg = _config_for_deepspeed(setup)
    req: dict[str, Any] = {"config": cfg, "world_size": setup.world_size}
    if setup.ds_doc is not None and setup.ds_doc.path.suffix == ".json" and cfg == setup.ds_doc.data:
        req["path"] = str(setup.ds_doc.path.resolve())
    return req


def validate_many(setups: list[TrainingSetup], python: str | None = None) -> list[list[Finding]]:
    """DeepSpeed's verdict on each setup's DeepSpeed config, from one subprocess (one DeepSpeed import)."""
    rule = RULES["DS001"].RULE
    todo = [s for s in setups if s.ds_written is not None]
    answers: dict[int, list[Finding]] = {id(s): [] for s in setups}
    if not todo:
        return [answers[id(s)] for s in setups]

    def for_all(message: str) -> list[list[Finding]]:
        note = [rule.finding(message, severity=Severity.INFO)]
        return [note if s.ds_written is not None else [] for s in setups]

    requests = [_request(s) for s in todo]
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _PROBE],
            input=json.dumps(requests),
            text=True,
            capture_output=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return for_all(
            f"DeepSpeed's own validation did not finish in {TIMEOUT_S} s; only the built-in checks ran."
        )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ZD-RESULT ")), None)
    if line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return for_all(f"DeepSpeed's own validation could not run ({tail}); only the built-in checks ran.")
    result = json.loads(line[len("ZD-RESULT ") :])
    if result.get("import_error"):
        return for_all(
            f"DeepSpeed is not importable here ({result['import_error']}); only the built-in checks ran. "
            "`zerodoctor env` says more."
        )
    for setup, errors in zip(todo, result["results"], strict=True):
        for err in errors:
            loc = err["loc"]
            key = f"{_MODEL_PREFIX.get(err.get('model', ''), '')}{loc}".rstrip(".")
            ev = (
                setup.ds_evidence(key)
                if key
                else Evidence(file=setup.ds_doc.display if setup.ds_doc else None)
            )
            answers[id(setup)].append(
                Finding(
                    id="DS001",
                    name="deepspeed.invalid-config:deepspeed",
                    severity=Severity.ERROR,
                    title=f"DeepSpeed {result['version']} rejects this config",
                    message=f"DeepSpeed's own config parser ({err['type']}): "
                    + (f"{loc}: " if loc else "")
                    + err["msg"],
                    evidence=(ev,),
                    references=rule.references,
                    source="deepspeed",
                )
            )
    return [answers[id(s)] for s in setups]


def validate_with_deepspeed(setup: TrainingSetup, python: str | None = None) -> list[Finding]:
    return validate_many([setup], python)[0]


# DeepSpeed messages that a built-in rule already reports with more context (file:line and the fix).
_COVERED_BY = {
    "train_batch_size is not equal": "DS002",
    "has to be greater than 0": "DS002",
    "cannot be simultaneously enabled": "DS003",
    "Partial offloading": "DS005",
}


def merge_with_builtin(builtin: list[Finding], from_deepspeed: list[Finding]) -> list[Finding]:
    """DeepSpeed's own verdicts that the built-in rules did not already report."""
    seen_keys = {ev.key for f in builtin if f.severity is Severity.ERROR for ev in f.evidence if ev.key}
    fired = {f.id for f in builtin if f.severity is Severity.ERROR}
    out = []
    for f in from_deepspeed:
        key = f.evidence[0].key if f.evidence else None
        if key and key in seen_keys:
            continue
        if any(text in f.message and code in fired for text, code in _COVERED_BY.items()):
            continue
        out.append(f)
    return out
