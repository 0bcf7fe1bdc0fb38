"""A user's config file as data plus the line and column of every key (so every finding can point at it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerodoctor.findings import Evidence

KeyPath = tuple[str, ...]

# The kinds of file zerodoctor reads, and what each is.
KINDS: dict[str, str] = {
    "deepspeed": "DeepSpeed config JSON",
    "hf": "HF TrainingArguments (YAML or JSON)",
    "llamafactory": "LLaMA-Factory training YAML",
    "accelerate": "accelerate config YAML (with a deepspeed_config section)",
    "xtuner": "XTuner Python config (read with ast, never executed)",
    "model": "HF model config.json",
}


@dataclass(frozen=True)
class Position:
    line: int
    column: int


@dataclass
class ConfigDocument:
    """One parsed file. `positions` maps key paths (e.g. ("zero_optimization", "stage")) to where the key is."""

    path: Path
    kind: str
    data: dict[str, Any]
    positions: dict[KeyPath, Position] = field(default_factory=dict)
    text: str = ""
    duplicates: list[tuple[KeyPath, Position]] = field(default_factory=list)
    # XTuner: names that are references to imported objects (TrainLoop, AdamW, ...), by variable path.
    symbols: dict[KeyPath, str] = field(default_factory=dict)

    @property
    def display(self) -> str:
        return str(self.path)

    def get(self, path: str | KeyPath, default: Any = None) -> Any:
        keys = tuple(path.split(".")) if isinstance(path, str) else path
        node: Any = self.data
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    def has(self, path: str | KeyPath) -> bool:
        sentinel = object()
        return self.get(path, sentinel) is not sentinel

    def position(self, path: str | KeyPath) -> Position | None:
        keys = tuple(path.split(".")) if isinstance(path, str) else path
        while keys:
            if keys in self.positions:
                return self.positions[keys]
            keys = keys[:-1]  # fall back to the nearest enclosing key that exists
        return None

    def evidence(self, path: str | KeyPath, text: str | None = None) -> Evidence:
        keys = tuple(path.split(".")) if isinstance(path, str) else path
        pos = self.position(keys)
        if text is None and self.has(keys):
            value = self.get(keys)
            text = f"{keys[-1]}: {value!r}" if not isinstance(value, dict) else None
        return Evidence(
            file=self.display,
            line=pos.line if pos else None,
            column=pos.column if pos else None,
            key=".".join(keys),
            text=text,
        )

    def file_evidence(self, text: str | None = None) -> Evidence:
        return Evidence(file=self.display, text=text)


def source_of(path: Path) -> str:
    """A config file's text, read through the bounded input layer (`zerodoctor.safeio.read_text`)."""
    from zerodoctor.safeio import read_text

    return read_text(path)
