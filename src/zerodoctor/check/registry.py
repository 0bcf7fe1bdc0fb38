"""Every check `zerodoctor check` runs, by its stable id: the lint rules, the environment rules and the memory
plan's verdicts; with the phase of the run in which each would bite (what the report orders by).

`--only` / `--skip` take these ids (or a prefix such as `DS`, or a rule name); an id that matches nothing
is a usage error, never a silent "no problems found".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from zerodoctor.errors import UsageError

# When a problem bites, in run order. `check` lists findings in this order.
PHASES: tuple[tuple[str, str], ...] = (
    ("launch", "at launch"),
    ("load", "while loading the model"),
    ("first_optimizer_step", "at the first optimizer step"),
    ("steady_state", "during training"),
    ("evaluation", "at evaluation"),
    ("checkpoint_save", "at a checkpoint save"),
    ("end_of_epoch", "at the end of an epoch"),
)
PHASE_ORDER = {name: i for i, (name, _) in enumerate(PHASES)}
PHASE_TITLES = dict(PHASES)


@dataclass(frozen=True)
class CheckInfo:
    id: str
    name: str
    title: str
    judge: str  # env | lint | plan | setup
    phase: str


def _plan_checks() -> list[CheckInfo]:
    # The planner's verdict ids (plan/candidates.py judge()); their phase comes with each finding.
    return [
        CheckInfo("PLAN001", "plan.does-not-fit", "GPU memory: does not fit", "plan", "first_optimizer_step"),
        CheckInfo("PLAN002", "plan.host-ram-exhausted", "host RAM exhausted", "plan", "first_optimizer_step"),
        CheckInfo("PLAN003", "plan.save-spike", "checkpoint save spike", "plan", "checkpoint_save"),
        CheckInfo("PLAN004", "plan.qlora-weights-replicated", "QLoRA weights replicated", "plan", "load"),
        CheckInfo(
            "PLAN005",
            "plan.save-only-model-ignored",
            "save_only_model still writes optimizer states",
            "plan",
            "checkpoint_save",
        ),
        CheckInfo("PLAN006", "plan.nothing-fits", "no strategy fits", "plan", "load"),
        CheckInfo("PLAN007", "plan.recommendation", "recommended strategy", "plan", "launch"),
        CheckInfo("PLAN008", "plan.steps-per-epoch", "optimizer steps per epoch", "plan", "end_of_epoch"),
    ]


# The phase each lint rule's problem bites in (the rule's docstring says why).
LINT_PHASES = {
    "DS001": "launch",
    "DS002": "launch",
    "DS003": "launch",
    "DS004": "launch",
    "DS005": "load",
    "DS006": "first_optimizer_step",
    "DS007": "checkpoint_save",
    "DS008": "checkpoint_save",
    "DS009": "launch",
    "HF001": "launch",
    "HF002": "load",
    "HF003": "checkpoint_save",
    "HF004": "launch",
    "QL001": "load",
    "QL002": "load",
    "XT001": "end_of_epoch",
    "KB001": "launch",  # refined per finding from the knowledge-base entry's phase
}


def _build() -> dict[str, CheckInfo]:
    from zerodoctor.env.judge import RULES as ENV_RULES
    from zerodoctor.lint.rules import RULES as LINT_RULES

    out: dict[str, CheckInfo] = {}
    for code, module in LINT_RULES.items():
        r = module.RULE
        out[code] = CheckInfo(code, r.name, r.title, "lint", LINT_PHASES.get(code, "launch"))
    for code, fn in ENV_RULES.items():
        doc = (fn.__doc__ or code).strip().splitlines()[0]
        out[code] = CheckInfo(code, fn.__name__.replace("_", "-"), doc, "env", "launch")
    for info in _plan_checks():
        out[info.id] = info
    out["ZD001"] = CheckInfo(
        "ZD001", "setup.missing-reference", "a file the config names is missing", "setup", "launch"
    )
    out["ZD003"] = CheckInfo(
        "ZD003", "setup.invalid-value", "a setting the run cannot use", "setup", "launch"
    )
    out["ZD004"] = CheckInfo(
        "ZD004", "check.memory-tight", "memory inside the safety margin", "plan", "first_optimizer_step"
    )
    out["ZD002"] = CheckInfo("ZD002", "check.not-checked", "what could not be checked", "setup", "launch")
    out["ZD005"] = CheckInfo(
        "ZD005", "setup.duplicate-key", "a key written twice in a YAML or JSON file", "setup", "launch"
    )
    return out


@cache
def all_checks() -> dict[str, CheckInfo]:
    """The registry, id -> CheckInfo (built on first use: it imports the rule modules)."""
    return _build()


def resolve_check_ids(values: Iterable[str] | None, flag: str) -> frozenset[str] | None:
    """Ids for `--only` / `--skip`: exact ids, prefixes (`DS`, `PLAN`) or rule names, comma-separated or
    repeated. An entry that matches no check is a usage error."""
    if not values:
        return None
    out: set[str] = set()
    for value in values:
        for token in (t.strip() for t in value.split(",")):
            if not token:
                continue
            up = token.upper()
            hits = {
                cid
                for cid, info in all_checks().items()
                if cid == up or cid.startswith(up) or info.name.lower() == token.lower()
            }
            if not hits:
                raise UsageError(
                    f"{flag} {token}: no such check",
                    hint="`zerodoctor check --list-checks` lists them (ids like DS002, ENV001, PLAN001)",
                )
            out |= hits
    return frozenset(out) if out else None  # only empty values (`--only "$IDS"` with IDS unset): no filter
