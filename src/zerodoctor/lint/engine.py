"""Run the rules over a TrainingSetup. Rules are independent; a rule that crashes is a zerodoctor bug and is
reported as such (an internal-error finding), never silently skipped and never taking the other rules down."""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterable

from zerodoctor.errors import UsageError
from zerodoctor.findings import Evidence, Finding, Fix, Severity, sort_findings
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules import RULES
from zerodoctor.setup.model import TrainingSetup, unusable_reference
from zerodoctor.setup.run import RunDescription, describe_run


class RuleCrash(Exception):
    """A rule raised: a bug in zerodoctor. Carries the rule code and the traceback text."""


def select_rules(select: Iterable[str] | None = None, ignore: Iterable[str] | None = None) -> list[Rule]:
    # An empty value (`--ignore "$SKIP"` with SKIP unset) names no rule: every code starts with "", so kept
    # it would select or skip them all.
    wanted = {s.strip().upper() for s in select or () if s.strip()} or None
    skip = {s.strip().upper() for s in ignore or () if s.strip()}
    known = [(code.upper(), module.RULE.name.upper()) for code, module in RULES.items()]
    for flag, values in (("--select", wanted or set()), ("--ignore", skip)):
        for value in values:
            if not any(value in (code, name) or code.startswith(value) for code, name in known):
                raise UsageError(
                    f"{flag} {value}: no such rule",
                    hint="`zerodoctor kb` lists the rules (codes like DS002, or names like deepspeed.batch-size-mismatch)",
                )
    out = []
    for code, module in RULES.items():
        rule: Rule = module.RULE
        names = {code.upper(), rule.name.upper()}
        if wanted is not None and not (names & wanted or any(code.startswith(w) for w in wanted)):
            continue
        if names & skip or any(code.startswith(s) for s in skip):
            continue
        out.append(rule)
    return out


def lint_setup(setup: TrainingSetup, rules: list[Rule] | None = None, *, cap: bool = True) -> list[Finding]:
    """Describe the run leniently (a wrong value is reported, not an error) and lint it."""
    run = describe_run(setup, strict=False)
    return sort_findings(invalid_value_findings(run) + lint_run(run, rules, cap=cap))


def invalid_value_findings(run: RunDescription) -> list[Finding]:
    """ZD003: a value of the training files that cannot be used (a zero micro batch, an unknown method).
    Values of the DeepSpeed JSON are DS001's to report, with DeepSpeed's own wording."""
    out = []
    for origin, why in run.invalid:
        if run.files.ds_doc is not None and origin.file == run.files.ds_doc.display:
            continue
        out.append(
            Finding(
                id="ZD003",
                name="setup.invalid-value",
                severity=Severity.ERROR,
                title="A setting has a value the run cannot use",
                message=f"{why}. The checks below assumed the default instead.",
                fixes=(Fix(f"Correct {origin.key or 'the value'} in {origin.file or 'the setup'}"),),
                evidence=(origin.evidence(),),
                source="lint",
            )
        )
    return out


MAX_FINDINGS_PER_RULE = 50
"""Findings one rule reports in full; past this a file is broken in bulk (100,000 unknown keys once printed
43 MB), and one summary line says how many more there are."""
MAX_COUNTED = 10_000
"""Findings counted past the cap before the rule is stopped (counting costs the rule's time per finding)."""


def _capped(rule: Rule, produced: Iterable[Finding]) -> list[Finding]:
    shown: list[Finding] = []
    more, worst = 0, Severity.INFO
    for finding in produced:
        if len(shown) < MAX_FINDINGS_PER_RULE:
            shown.append(finding)
            continue
        more += 1
        worst = max(worst, finding.severity)
        if more >= MAX_COUNTED:
            break
    if more:
        count = f"{more:,}" if more < MAX_COUNTED else f"{MAX_COUNTED:,} or more"
        shown.append(
            rule.finding(
                f"{count} further {rule.code} finding(s) are not shown (only the first {MAX_FINDINGS_PER_RULE} "
                "of one rule are); fix those and run lint again to see the rest.",
                severity=worst,
            )
        )
    return shown


def lint_run(run: RunDescription, rules: list[Rule] | None = None, *, cap: bool = True) -> list[Finding]:
    """Every selected rule's findings; with `cap`, at most MAX_FINDINGS_PER_RULE of one rule are shown (`--fix` plans
    its changes from the whole list: a file is fixed in one pass, review R9)."""
    findings: list[Finding] = []
    for rule in rules if rules is not None else select_rules():
        try:
            findings.extend(_capped(rule, rule.check(run)) if cap else rule.check(run))
        except Exception as exc:  # a rule bug must be visible, not fatal to the other rules
            raise RuleCrash(f"rule {rule.code} crashed: {exc!r}\n{traceback.format_exc()}") from exc
    return sort_findings(findings)


def _setup_finding(
    code: str, name: str, title: str, message: str, *, evidence: Evidence, fix: str | None = None
) -> Finding:
    """A warning about the files themselves (not a lint rule's): what zerodoctor could not follow or read."""
    fixes = (Fix(fix),) if fix else ()
    return Finding(id=code, name=name, severity=Severity.WARNING, title=title, message=message,
                   fixes=fixes, evidence=(evidence,), source="lint")


def setup_notes(setup: TrainingSetup) -> list[Finding]:
    """What zerodoctor could not follow (a DeepSpeed JSON that a config names but that is not on disk)."""
    notes = []
    for doc, key, target in setup.missing_references:
        unusable = unusable_reference(doc.path, target)
        where = (
            f"but {unusable}"
            if unusable
            else f"which is not next to {doc.display}, in its parent folders or in the current folder"
        )
        notes.append(
            _setup_finding(
                "ZD001",
                "setup.missing-reference",
                "A file the config names was not found",
                f"{key} names {target!r}, {where}, so the DeepSpeed config it points at was not checked. Pass "
                "the DeepSpeed JSON as another argument to lint it with these settings.",
                evidence=doc.evidence(tuple(key.split("."))),
            )
        )
    for doc in setup.documents:
        if doc.kind == "deepspeed":
            continue  # DS001 reports those, with how DeepSpeed and the frameworks read the file
        nested = [p for p, _ in doc.duplicates]
        for path, pos in doc.duplicates:
            if any(path[: len(d)] == d and path != d for d in nested):
                continue  # inside a block that is itself repeated: the block is reported
            used = json.dumps(doc.get(path), default=str)
            used = used if len(used) <= 80 else used[:77] + "..."
            reader = "yaml.safe_load" if doc.path.suffix in (".yaml", ".yml") else "json.load"
            notes.append(
                _setup_finding(
                    "ZD005",
                    "setup.duplicate-key",
                    "A key is written twice",
                    f"`{'.'.join(path)}` is written more than once in {doc.display} (again at line {pos.line}); "
                    f"the framework reads the file with {reader}, which keeps the last one, so the run uses "
                    f"{used}. Remove the other so the file says what the run does.",
                    evidence=Evidence(file=doc.display, line=pos.line, column=pos.column, key=".".join(path)),
                    fix=f"Keep only the `{path[-1]}` you mean ({used} is the one used now).",
                )
            )
    return notes
