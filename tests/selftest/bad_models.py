"""Models the selftest's tests build through the test-only factory hook (never from the command line)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn


class TableAtInit(nn.Module):
    """Precomputes a table from its embedding weight in __init__, as some remote-code models do with rotary
    caches or position embeddings. Under zero.Init the weight is already partitioned (an empty tensor) when
    __init__ reads it: torch raises "'weight' must be 2-D" (failures.md: z3-weight-must-be-2d)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embed = nn.Embedding(int(cfg["vocab_size"]), int(cfg["hidden_size"]))
        self.register_buffer("table", nn.functional.embedding(torch.arange(4), self.embed.weight))


def table_at_init(cfg: dict[str, Any]) -> nn.Module:
    return TableAtInit(cfg)


class _FailOnSecondBackward(torch.autograd.Function):
    """Identity whose backward raises on rank 1's second call: an exception in the middle of the first
    optimizer step (its second micro batch), where DeepSpeed 0.14.1/0.14.2's clipping bug raised."""

    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _FailOnSecondBackward.calls += 1
        if _FailOnSecondBackward.calls == 2 and os.environ.get("RANK") == "1":
            raise RuntimeError("injected failure in the second backward on rank 1")
        return grad


class FailsInClipStep(nn.Module):
    """A two-layer language model (embedding, head) whose backward fails on rank 1 in the clipping step."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embed = nn.Embedding(int(cfg["vocab_size"]), int(cfg["hidden_size"]))
        self.head = nn.Linear(int(cfg["hidden_size"]), int(cfg["vocab_size"]), bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        logits = self.head(_FailOnSecondBackward.apply(self.embed(input_ids)))
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        return SimpleNamespace(loss=loss)


def fails_in_clip_step(cfg: dict[str, Any]) -> nn.Module:
    return FailsInClipStep(cfg)
