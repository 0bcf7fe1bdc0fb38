"""SelftestSpec: everything the selftest runs, read from the user's setup in ONE place (`spec_from_setup`).

The selftest runs the user's own ZeRO setup in miniature: the same architecture family shrunk, the exact
DeepSpeed config after the framework's "auto" filling (its size knobs scaled to the tiny model), the same
method (LoRA adapters when the setup uses LoRA), micro batch, gradient accumulation, precision, clipping and
gather-on-save. Every difference from the user's setup is an `Adaptation` with its reason, shown to the user.

Nothing here imports torch or DeepSpeed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from zerodoctor.errors import SetupError
from zerodoctor.facts import as_number, is_auto, truthy
from zerodoctor.selftest.shrink import (
    MONITOR_KEYS,
    Adaptation,
    hidden_ratio,
    param_ratio,
    scale_ds_config,
    shrink_model,
)

if TYPE_CHECKING:
    from zerodoctor.models import ModelSpec
    from zerodoctor.setup.model import TrainingSetup
    from zerodoctor.setup.run import Known, RunDescription

DEFAULT_MODEL = "llama-3.1-8b"
"""The catalog model the selftest shrinks when the setup names none."""

SAVE_PATHS = {
    "trainer": "HF Trainer.save_model: the 16-bit gather under ZeRO-3 when configured, else the DeepSpeed "
    "checkpoint only (zero_to_fp32 recovers the weights); PEFT adapters are always gathered",
    "save_16bit_model": "DeepSpeed engine.save_16bit_model (writes nothing under ZeRO-3 unless "
    "stage3_gather_16bit_weights_on_model_save is true)",
    "state_dict": "torch.save(model.state_dict()) / model.save_pretrained() on the wrapped module, as custom "
    "training scripts do (no gather)",
    "checkpoint": "DeepSpeed save_checkpoint only (weights recovered offline with zero_to_fp32)",
}
FRAMEWORK_SAVE_PATH = {"hf": "trainer", "llamafactory": "trainer", "accelerate": "trainer"}
AUTO_FILLERS = frozenset({"hf", "llamafactory", "accelerate", "xtuner"})
"""Frameworks that fill DeepSpeed's "auto" values (the rest hand the config to DeepSpeed as written)."""

SELFTEST_LR = 1e-2
"""Learning rate of the selftest: large enough that a few steps move the loss measurably."""
MAX_MICRO_BATCH = 4
MAX_GRAD_ACCUM = 4
MAX_SEQ_LEN = 32
DEFAULT_STEPS = 3

# The zero3_offload.json that LLaVA, MiniCPM-V and LLaMA-Factory ship, as HF Trainer fills its "auto"
# values for Llama-3.1-8B (hidden size 4096) with per_device_train_batch_size 2, gradient_accumulation_steps
# 2, max_grad_norm 1.0 and bf16.
DEFAULT_DS_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1_000_000_000,
        "reduce_bucket_size": 4096 * 4096,
        "stage3_prefetch_bucket_size": int(0.9 * 4096 * 4096),
        "stage3_param_persistence_threshold": 10 * 4096,
        "stage3_max_live_parameters": 1_000_000_000,
        "stage3_max_reuse_distance": 1_000_000_000,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}


@dataclass(frozen=True)
class LoraSpec:
    r: int
    alpha: int
    dropout: float
    targets: str | tuple[str, ...]  # "all-linear" or module names

    def to_dict(self) -> dict[str, Any]:
        return {
            "r": self.r,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "targets": self.targets if isinstance(self.targets, str) else list(self.targets),
        }


@dataclass(frozen=True)
class SelftestSpec:
    """What one selftest runs. `ds_config` is the user's DeepSpeed config after "auto" filling, scaled to the
    tiny model (`ds_user` is it unscaled); the batch size for the number of ranks is set by `run_config`."""

    source: str
    framework: str
    model_name: str
    model_family: str
    model_config: dict[str, Any]
    builder: str
    keeps: tuple[str, ...]
    model_notes: tuple[str, ...]
    real_params: int | None
    tiny_params: int
    method: str  # "full" or "lora"
    lora: LoraSpec | None
    ds_config: dict[str, Any]
    ds_user: dict[str, Any]
    ds_file: str | None
    adaptations: tuple[Adaptation, ...]
    user_world_size: int | None
    micro_batch: int
    grad_accum: int
    seq_len: int
    steps: int
    precision: str  # bf16, fp16 or fp32
    clip: float | None
    zero_stage: int
    offload_optimizer: str
    offload_param: str
    gather_on_save: bool
    save_path: str
    gradient_checkpointing: bool
    facts: dict[str, Any] = field(default_factory=dict)
    # For tests only (never set from the command line): a file:function that builds the model instead of
    # transformers, and a fault to inject ({"rank": 1, "phase": "optimizer-steps", "kind": "exit"|"hang"}).
    model_factory: str | None = None
    fault: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "framework": self.framework,
            "model_name": self.model_name,
            "model_family": self.model_family,
            "model_config": self.model_config,
            "builder": self.builder,
            "keeps": list(self.keeps),
            "model_notes": list(self.model_notes),
            "real_params": self.real_params,
            "tiny_params": self.tiny_params,
            "method": self.method,
            "lora": self.lora.to_dict() if self.lora else None,
            "ds_config": self.ds_config,
            "ds_file": self.ds_file,
            "adaptations": [a.to_dict() for a in self.adaptations],
            "user_world_size": self.user_world_size,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "seq_len": self.seq_len,
            "steps": self.steps,
            "precision": self.precision,
            "clip": self.clip,
            "zero_stage": self.zero_stage,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
            "gather_on_save": self.gather_on_save,
            "save_path": self.save_path,
            "gradient_checkpointing": self.gradient_checkpointing,
            "model_factory": self.model_factory,
            "fault": self.fault,
        }


# ---------------------------------------------------------------------------------------------------------
# The one place that reads the setup
# ---------------------------------------------------------------------------------------------------------


def spec_from_setup(
    setup: TrainingSetup,
    *,
    save_path: str | None = None,
    steps: int = DEFAULT_STEPS,
    source: str | None = None,
) -> SelftestSpec:
    """Read a TrainingSetup into a SelftestSpec: through the run description every judge reads
    (`zerodoctor.setup.run.describe_run`), so the selftest never derives a value on its own."""
    from zerodoctor.setup.run import describe_run

    return spec_from_run(describe_run(setup, strict=True), save_path=save_path, steps=steps, source=source)


def spec_from_run(
    run: RunDescription,
    *,
    save_path: str | None = None,
    steps: int = DEFAULT_STEPS,
    source: str | None = None,
) -> SelftestSpec:
    """The selftest of a run as `check` describes it (`zerodoctor.setup.run.RunDescription`): the same model,
    method, LoRA rank/targets, micro batch, accumulation, sequence length and gradient checkpointing that every
    other judge reads; the DeepSpeed config after the framework's "auto" filling. Raises SetupError when the
    run has no DeepSpeed config."""
    setup = run.files
    effective = setup.effective_ds
    if effective is None:
        raise SetupError(
            "the files given hold no DeepSpeed config: the selftest runs your ZeRO config",
            hint="pass the DeepSpeed JSON, or the training arguments that name it (deepspeed: ds_config.json)",
        )
    framework = run.framework.name or "deepspeed"
    notes: list[str] = []
    model_spec = run.model
    if model_spec is None:
        from zerodoctor.models import resolve_model

        model_spec = resolve_model(DEFAULT_MODEL)
        why = run.model_note or "the files name no model and no --model was given"
        notes.append(f"{why}: shrinking {model_spec.display_name} from the catalog")
    method = run.method.value
    lora: LoraSpec | None = None
    if method in ("lora", "qlora"):
        args = dict(setup.args or {})
        base = _lora_from_args(
            args
        )  # alpha and dropout are the adapter's own; rank and targets are the run's
        lora = replace(base, r=run.lora_rank.value, targets=run.lora_targets.value)
    if method == "qlora":
        notes.append(
            "QLoRA: the selftest trains LoRA on a 16-bit base; bitsandbytes 4-bit layers are not built "
            "(they need a GPU), so a 4-bit base replicated on every rank is not shown here (`zerodoctor lint`/"
            "`plan` judge that)"
        )
    elif method == "freeze":
        notes.append("freeze tuning is run as full fine-tuning of the tiny model")
    return _make_spec(
        effective,
        source=source or ", ".join(d.display for d in setup.documents),
        framework=framework,
        model_spec=model_spec,
        method="lora" if lora else "full",
        lora=lora,
        ds_file=setup.ds_doc.display if setup.ds_doc is not None else None,
        user_world_size=run.world_size,
        micro_default=run.micro_batch.value if _given(run.micro_batch) else None,
        accum_default=run.grad_accum.value if _given(run.grad_accum) else None,
        seq_given=run.seq_len.value if _given(run.seq_len) else None,
        steps=steps,
        save_path=save_path or FRAMEWORK_SAVE_PATH.get(framework, "checkpoint"),
        gradient_checkpointing=run.gradient_checkpointing.value and _given(run.gradient_checkpointing),
        facts=_json_facts(run.facts()),
        notes=notes,
    )


def _given(k: Known[Any]) -> bool:
    """A value the setup (or a framework default) gave, not one zerodoctor assumed."""
    return k.origin.kind != "default"


def default_spec(*, save_path: str | None = None, steps: int = DEFAULT_STEPS) -> SelftestSpec:
    """No setup given: the common zero3_offload.json (both offloads, clipping 1.0, bf16, 16-bit gather on
    save) as HF Trainer fills it, on a shrunken Llama-3.1-8B."""
    from zerodoctor.models import resolve_model

    return _make_spec(
        DEFAULT_DS_CONFIG,
        source="default ZeRO-3 offload setup (no files given)",
        framework="hf",
        model_spec=resolve_model(DEFAULT_MODEL),
        method="full",
        lora=None,
        ds_file=None,
        user_world_size=None,
        micro_default=None,
        accum_default=None,
        seq_given=None,
        steps=steps,
        save_path=save_path or "trainer",
        gradient_checkpointing=False,
        facts={"setup.framework": "hf", "setup.method": "full"},
        notes=[],
    )


def _lora_from_args(args: Mapping[str, Any]) -> LoraSpec:
    r = int(as_number(next((args[k] for k in ("lora_rank", "lora_r", "r") if k in args), 8)) or 8)
    alpha = int(as_number(args.get("lora_alpha", 2 * r)) or 2 * r)
    dropout = float(as_number(args.get("lora_dropout", 0.0)) or 0.0)
    raw = next(
        (args[k] for k in ("lora_target", "lora_target_modules", "target_modules") if k in args), "all"
    )
    targets: str | tuple[str, ...]
    if isinstance(raw, str):
        names = [t.strip() for t in raw.split(",") if t.strip()]
        targets = "all-linear" if not names or names in (["all"], ["all-linear"]) else tuple(names)
    elif isinstance(raw, (list, tuple)):
        targets = tuple(str(t) for t in raw) or "all-linear"
    else:
        targets = "all-linear"
    return LoraSpec(r=r, alpha=alpha, dropout=dropout, targets=targets)


def _json_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in facts.items() if isinstance(v, (str, int, float, bool)) or v is None}


def _int(value: Any) -> int | None:
    n = as_number(value)
    return int(n) if n is not None and not is_auto(value) else None


def _make_spec(
    effective: Mapping[str, Any],
    *,
    source: str,
    framework: str,
    model_spec: ModelSpec,
    method: str,
    lora: LoraSpec | None,
    ds_file: str | None,
    user_world_size: int | None,
    micro_default: float | None,
    accum_default: float | None,
    seq_given: float | None,
    steps: int,
    save_path: str,
    gradient_checkpointing: bool,
    facts: dict[str, Any],
    notes: list[str],
) -> SelftestSpec:
    from zerodoctor.models import model_from_config

    if save_path not in SAVE_PATHS:
        raise SetupError(f"unknown save path {save_path!r}", hint=f"use one of: {', '.join(SAVE_PATHS)}")
    tiny = shrink_model(model_spec.config, model_spec.display_name)
    tiny_counts = model_from_config(tiny.config, name="selftest-tiny", source=model_spec.source).params
    real = model_spec.params
    scaled, changes = scale_ds_config(
        effective,
        param_ratio=param_ratio(tiny_counts.total, real.total),
        hidden_ratio=hidden_ratio(real.hidden_size),
        tiny_largest_tensor=max(tiny_counts.largest_module_numel, 1),
        scaled_from=f"tiny {tiny_counts.total:,} vs {real.total:,} parameters",
    )
    adaptations = list(changes)
    for key in MONITOR_KEYS:
        if key in scaled:
            adaptations.append(
                Adaptation(key, "configured", "removed", "no monitoring output from the selftest")
            )
            scaled.pop(key)
    if "scheduler" in scaled:
        adaptations.append(
            Adaptation(
                "scheduler",
                scaled["scheduler"].get("type")
                if isinstance(scaled["scheduler"], dict)
                else scaled["scheduler"],
                "removed",
                "constant learning rate, so the plain single-process reference can follow every step",
            )
        )
        scaled.pop("scheduler")
    opt = scaled.get("optimizer")
    if not isinstance(opt, dict):
        scaled["optimizer"] = {"type": "AdamW", "params": {"lr": SELFTEST_LR, "weight_decay": 0.0}}
        adaptations.append(
            Adaptation(
                "optimizer",
                None,
                "AdamW (DeepSpeed's)",
                "the config has no optimizer block: DeepSpeed's AdamW stands in for the one your "
                "framework builds",
            )
        )
    else:
        params = opt.setdefault("params", {})
        if isinstance(params, dict) and params.get("lr") != SELFTEST_LR:
            adaptations.append(
                Adaptation(
                    "optimizer.params.lr",
                    params.get("lr"),
                    SELFTEST_LR,
                    "large enough that a few steps move the loss measurably",
                )
            )
            params["lr"] = SELFTEST_LR
    micro = _int(scaled.get("train_micro_batch_size_per_gpu")) or int(micro_default or 1)
    accum = _int(scaled.get("gradient_accumulation_steps")) or int(accum_default or 1)
    run_micro, run_accum = min(micro, MAX_MICRO_BATCH), min(accum, MAX_GRAD_ACCUM)
    for key, was, now in (
        ("train_micro_batch_size_per_gpu", micro, run_micro),
        ("gradient_accumulation_steps", accum, run_accum),
    ):
        if key in scaled and not is_auto(scaled[key]) and was != now:
            scaled[key] = now
            adaptations.append(Adaptation(key, was, now, "capped to keep the selftest under a minute"))
    seq = int(min(seq_given or MAX_SEQ_LEN, MAX_SEQ_LEN))
    if seq_given and seq_given > MAX_SEQ_LEN:
        adaptations.append(Adaptation("sequence length", int(seq_given), seq, "tiny model, synthetic tokens"))
    zero_raw = scaled.get("zero_optimization")
    zero: dict[str, Any] = zero_raw if isinstance(zero_raw, dict) else {}
    stage = _int(zero.get("stage")) or 0

    def device(part: str) -> str:
        block = zero.get(part)
        return str(block.get("device", "none")).lower() if isinstance(block, dict) else "none"

    gather = any(
        truthy(zero.get(k)) is True
        for k in ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save")
    )
    precision = "fp32"
    for name in ("bf16", "fp16"):
        block = scaled.get(name) or (scaled.get("bfloat16") if name == "bf16" else None)
        if isinstance(block, dict) and truthy(block.get("enabled")) is True:
            precision = name
            break
    clip_raw = scaled.get("gradient_clipping")
    clip = (
        float(clip_raw)
        if isinstance(clip_raw, (int, float)) and not isinstance(clip_raw, bool) and clip_raw > 0
        else None
    )
    return SelftestSpec(
        source=source,
        framework=framework,
        model_name=model_spec.display_name,
        model_family=tiny.family,
        model_config=tiny.config,
        builder=tiny.builder,
        keeps=tiny.keeps,
        model_notes=tuple(notes) + tiny.notes,
        real_params=real.total,
        tiny_params=tiny_counts.total,
        method=method,
        lora=lora,
        ds_config=scaled,
        ds_user=copy.deepcopy(dict(effective)),
        ds_file=ds_file,
        adaptations=tuple(adaptations),
        user_world_size=user_world_size,
        micro_batch=run_micro,
        grad_accum=run_accum,
        seq_len=seq,
        steps=max(2, steps),
        precision=precision,
        clip=clip,
        zero_stage=stage,
        offload_optimizer=device("offload_optimizer"),
        offload_param=device("offload_param"),
        gather_on_save=gather,
        save_path=save_path,
        gradient_checkpointing=gradient_checkpointing,
        facts=facts,
    )


def run_config(spec: SelftestSpec, ranks: int) -> tuple[dict[str, Any], list[Adaptation]]:
    """The DeepSpeed config for `ranks` processes. A `train_batch_size` that fits the user's world size is
    rescaled to `ranks`; one that does not fit it is kept, so DeepSpeed rejects it here as it would there."""
    cfg = copy.deepcopy(spec.ds_config)
    changes: list[Adaptation] = []
    tbs = cfg.get("train_batch_size")
    if is_auto(tbs) and spec.framework in AUTO_FILLERS:
        # HF fills train_batch_size at launch from the world size it sees (trainer_config_finalize)
        cfg["train_batch_size"] = spec.micro_batch * spec.grad_accum * ranks
        changes.append(
            Adaptation(
                "train_batch_size",
                tbs,
                cfg["train_batch_size"],
                f"filled as {spec.framework} does at launch, for {ranks} selftest ranks",
            )
        )
    n = _int(tbs)
    if n is not None:
        user_micro = _int(spec.ds_user.get("train_micro_batch_size_per_gpu")) or spec.micro_batch
        user_accum = _int(spec.ds_user.get("gradient_accumulation_steps")) or spec.grad_accum
        world = spec.user_world_size
        fits = world is not None and n == user_micro * user_accum * world
        if fits:
            new = spec.micro_batch * spec.grad_accum * ranks
            if new != n:
                cfg["train_batch_size"] = new
                changes.append(
                    Adaptation(
                        "train_batch_size",
                        n,
                        new,
                        f"micro batch x gradient accumulation x {ranks} selftest ranks "
                        f"(yours fits your {world} ranks)",
                    )
                )
        elif world is not None and world != ranks and n * ranks % world == 0:
            cfg["train_batch_size"] = n * ranks // world
            changes.append(
                Adaptation(
                    "train_batch_size",
                    n,
                    n * ranks // world,
                    f"scaled from your {world} ranks to {ranks}; it does not match your "
                    "micro batch and accumulation, and DeepSpeed will say so",
                )
            )
    return cfg, changes


def with_test_hooks(
    spec: SelftestSpec, *, model_factory: str | None = None, fault: dict[str, Any] | None = None
) -> SelftestSpec:
    """A copy of `spec` with the test-only hooks set (a model factory, an injected fault)."""
    return replace(spec, model_factory=model_factory, fault=fault)
