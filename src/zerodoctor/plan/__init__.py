"""Memory planning for DeepSpeed ZeRO fine-tuning: pure arithmetic plus an offline model catalog.

Modules, in the order the planner uses them:

* `models`: resolve `--model` to exact parameter counts (bundled config.json catalog).
* `inputs`: options + user files (`zerodoctor.setup`) + environment snapshot -> `PlanInputs`.
* `model_states`, `activations`: bytes of model states per rank and of activations per micro-batch.
* `phases`: one strategy's memory per phase (load, first optimizer step, steady step, save).
* `candidates`: the strategy grid, the recommendation and the verdicts (`Finding`s).
* `emit`: a ready DeepSpeed config for a strategy.

This package must stay import-light: `zerodoctor plan` starts without importing torch, transformers or
DeepSpeed. Import submodules explicitly (`from zerodoctor.models.spec import resolve_model`); nothing is
re-exported here so that `import zerodoctor.plan` costs nothing.
"""

from __future__ import annotations
