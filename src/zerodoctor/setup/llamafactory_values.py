"""The values LLaMA-Factory accepts for `finetuning_type`, `stage` and the preference loss, by release.

Read from the `Literal[...]` annotations of FinetuningArguments at every release tag of hiyouga/LLaMA-Factory
(src/llmtuner/hparams/finetuning_args.py up to v0.7.1, src/llamafactory/hparams/finetuning_args.py from v0.8.0),
v0.2.2 through v0.9.5 and ff6d4d12 (HfArgumentParser refuses any other value before training starts):

| field | values | accepted in |
|---|---|---|
| finetuning_type | lora, freeze, full | every release |
| finetuning_type | none | up to v0.2.1 (removed in v0.2.2) |
| finetuning_type | oft | from v0.9.4 (PR #8623, 003a2acb1, 2025-08-18) |
| stage | pt, sft, rm, ppo, dpo | from v0.2.0 (stage moved into FinetuningArguments; dpo since v0.1.6) |
| stage | orpo | v0.6.2 to v0.7.1 (from v0.8.0: stage dpo with pref_loss orpo) |
| stage | kto | from v0.8.0 |
| dpo_loss | sigmoid, hinge | v0.4.0 to v0.7.1 |
| dpo_loss | ipo | v0.5.0 to v0.7.1 |
| dpo_loss | kto | v0.5.0 to v0.5.2 (renamed kto_pair in v0.5.3) |
| dpo_loss | kto_pair | v0.5.3 to v0.7.1 |
| pref_loss | sigmoid, hinge, ipo, kto_pair, orpo, simpo | from v0.8.0 (replaces dpo_loss) |

Nothing here imports LLaMA-Factory; the release a run uses comes from the environment snapshot (`llamafactory`,
or `llmtuner` before v0.8.0) when one is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

SOURCE = (
    "hiyouga/LLaMA-Factory src/llamafactory/hparams/finetuning_args.py (src/llmtuner/hparams/ before v0.8.0)"
)
READ_RELEASES = "v0.2.2 to v0.9.5"


@dataclass(frozen=True)
class Accepted:
    """One value of one field, accepted from release `since` (None: every release read) until the release
    `removed` that refuses it again (None: still accepted at ff6d4d12)."""

    field: str
    value: str
    since: str | None = None
    removed: str | None = None

    def accepted_in(self, version: Version) -> bool:
        if self.since is not None and version < Version(self.since):
            return False
        return self.removed is None or version < Version(self.removed)

    def span(self) -> str:
        if self.since and self.removed:
            return f"accepted from {self.since} until {self.removed}"
        if self.since:
            return f"accepted from {self.since}"
        if self.removed:
            return f"removed in {self.removed}"
        return "accepted in every release"


ACCEPTED: tuple[Accepted, ...] = (
    *(Accepted("finetuning_type", v) for v in ("lora", "freeze", "full")),
    Accepted("finetuning_type", "none", removed="0.2.2"),
    Accepted("finetuning_type", "oft", since="0.9.4"),
    *(Accepted("stage", v) for v in ("pt", "sft", "rm", "ppo", "dpo")),
    Accepted("stage", "orpo", since="0.6.2", removed="0.8.0"),
    Accepted("stage", "kto", since="0.8.0"),
    *(Accepted("dpo_loss", v, since="0.4.0", removed="0.8.0") for v in ("sigmoid", "hinge")),
    Accepted("dpo_loss", "ipo", since="0.5.0", removed="0.8.0"),
    Accepted("dpo_loss", "kto", since="0.5.0", removed="0.5.3"),
    Accepted("dpo_loss", "kto_pair", since="0.5.3", removed="0.8.0"),
    *(
        Accepted("pref_loss", v, since="0.8.0")
        for v in ("sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo")
    ),
)
FIELDS = ("finetuning_type", "stage", "dpo_loss", "pref_loss")


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def refusal(field: str, value: object, version: str | None) -> str | None:
    """Why LLaMA-Factory (at `version`, or at any release read when None) refuses `field: value`; None when it
    accepts it. The text names the version and the values that version accepts."""
    if field not in FIELDS:
        return None
    text = str(value).strip()
    rows = [a for a in ACCEPTED if a.field == field]
    match = next((a for a in rows if a.value == text), None)
    v = _version(version)
    if v is None:
        if match is not None:
            return None
        known = ", ".join(dict.fromkeys(a.value for a in rows))
        return f"no LLaMA-Factory release ({READ_RELEASES}) accepts {field} {text!r} (values: {known})"
    allowed = ", ".join(a.value for a in rows if a.accepted_in(v))
    if match is not None and match.accepted_in(v):
        return None
    if match is not None:
        return f"LLaMA-Factory {v} refuses {field} {text!r} ({match.span()}; {v} accepts: {allowed or 'no value'})"
    return f"LLaMA-Factory {v} refuses {field} {text!r} (it accepts: {allowed or 'no value'})"
