"""KB001 kb.known-failure: this stack and setup meet the conditions of a known failure in the knowledge base.

Why it matters: some failures are not configuration mistakes but bugs of one release, which only bite with a
certain configuration: DeepSpeed 0.14.1/0.14.2 with ZeRO-3, `offload_optimizer` and gradient clipping dies in
`unscale_and_clip_grads` with "Expected all tensors to be on the same device"; DeepSpeed 0.16.0-0.16.7 with
ZeRO-3 and gradient checkpointing runs out of GPU memory; ZeRO-1/2 on 0.13.2-0.16.5 can turn an inf gradient
norm into NaN weights. The entry (`zerodoctor kb ID`) holds the version range, the config conditions, the root
cause and the sources; this rule evaluates them against the versions of `--env` and the effective config.

Without `--env` this rule is silent (no versions, no verdict). With versions but an incomplete config it
warns and names the condition it could not check. A condition known to be false silences the entry: e.g.
0.14.2 with only `offload_param` (no optimizer offload) is not reported.

Fix: the entry's ranked fixes (usually an upgrade; sometimes a config workaround with its trade-off).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from zerodoctor.findings import Evidence, Finding, Severity
from zerodoctor.kb.preflight import known_failures
from zerodoctor.lint.rule import Rule
from zerodoctor.setup.run import RunDescription


def _where(run: RunDescription, fact_key: str, text: str) -> Evidence:
    setup = run.files
    namespace, _, key = fact_key.partition(".")
    # Values the run description resolved (e.g. LLaMA-Factory's gradient checkpointing, on unless disabled)
    # point at where they were resolved from.
    resolved = {
        "hf.gradient_checkpointing": run.gradient_checkpointing,
        "setup.gradient_checkpointing": run.gradient_checkpointing,
        "hf.gradient_checkpointing_kwargs.use_reentrant": run.use_reentrant,
    }.get(fact_key)
    if resolved is not None and (resolved.origin.file or namespace != "hf" or setup.args_doc is None):
        return resolved.origin.evidence(f"{text} ({resolved.origin.describe()})")
    if namespace == "ds" and setup.ds_written is not None:
        if setup.resolution and key in setup.resolution.filled:
            value, source = setup.resolution.filled[key]
            text = f'{text}; "auto" filled from {source} = {value!r}'
        return setup.ds_evidence(key, text)
    if namespace == "hf" and setup.args_doc is not None:
        return setup.arg_evidence(key, text)
    if namespace == "quant" and setup.quant_evidence is not None:
        return replace(setup.quant_evidence, text=text)
    return Evidence(key=fact_key, text=text)


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if setup.env is None:
        return
    for f in known_failures(setup.env.versions(), run.facts()):
        evidence = []
        for ev in f.evidence:
            key = ev.key or ""
            if key.split(".")[0] in ("ds", "hf", "quant", "setup"):
                evidence.append(_where(run, key, ev.text or key))
            else:
                evidence.append(Evidence(file=setup.env.source, key=key, text=ev.text))
        # Point at the config lines first (what CI annotates), then the installed versions.
        evidence.sort(key=lambda e: e.line is None)
        yield replace(
            f,
            id=RULE.code,
            name=f"{RULE.name}:{f.id}",
            evidence=tuple(evidence),
            source="lint",
            data={**f.data, "kb_id": f.id},
        )


RULE = Rule(
    code="KB001",
    name="kb.known-failure",
    title="Known failure for this stack and setup",
    severity=Severity.ERROR,
    references=("deepspeedai/DeepSpeed#5256", "deepspeedai/DeepSpeed#5461"),
    check=check,
)
