"""Models the selftest's tests build through the test-only factory hook (never from the command line)."""

from __future__ import annotations

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
