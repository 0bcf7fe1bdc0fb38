"""Memory planning for DeepSpeed ZeRO fine-tuning: pure arithmetic plus an offline model catalog.

This package must stay import-light: `zerodoctor plan` starts without importing torch, transformers or
DeepSpeed. Import submodules explicitly (`from zerodoctor.plan.models import resolve_model`); nothing is
re-exported here so that `import zerodoctor.plan` costs nothing.
"""

from __future__ import annotations
