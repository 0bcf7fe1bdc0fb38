"""Candidate strategies, the recommendation, and the verdicts as Findings.

Cost order (cheapest first): no offload > optimizer offload > optimizer + parameter offload > NVMe, and
within a tier ZeRO-2 before ZeRO-3 (less communication). pin_memory off is tried only when the pinned
variant does not fit the host. The user's method is kept unless nothing fits with it; then LoRA, then
QLoRA (with `bnb_4bit_quant_storage` = compute dtype, the documented ZeRO-3 setup).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zerodoctor.findings import Evidence, Finding, Fix, Severity
from zerodoctor.plan import host_save as hs
from zerodoctor.plan.inputs import GB, GIB, FsdpSettings, PlanInputs, Training, ZeroSettings, fsdp_as_zero
from zerodoctor.plan.nothing_fits import Advice, advise, nothing_fits_finding
from zerodoctor.plan.phases import DEFAULT_SAFETY_MARGIN, PHASE_TITLES, PHASES, StrategyPlan, plan_strategy

SOURCE = "plan"


@dataclass(frozen=True)
class PlanResult:
    """Everything `zerodoctor plan` answers: the user's configuration (when given), every candidate
    evaluated (recommended first), and the verdicts."""

    inputs: PlanInputs
    yours: StrategyPlan | None
    candidates: tuple[StrategyPlan, ...]
    recommended: StrategyPlan | None
    findings: tuple[Finding, ...]
    margin: float


def _base_zero(inputs: PlanInputs) -> ZeroSettings:
    """Knobs other than stage/offload: the user's (if given) else DeepSpeed's defaults, with HF's "auto"
    bucket values when an HF-like framework will fill them (what the emitted config will get)."""
    if inputs.zero is not None and inputs.zero.fsdp is None:
        return inputs.zero
    h = inputs.model.params.hidden_size
    if inputs.framework in ("hf", "llamafactory", "accelerate"):
        return ZeroSettings(
            stage=3,
            reduce_bucket_size=h * h,
            prefetch_bucket_size=int(0.9 * h * h),
            param_persistence_threshold=10 * h,
        )
    return ZeroSettings(stage=3)


def strategy_grid(inputs: PlanInputs) -> list[ZeroSettings]:
    base = _base_zero(inputs)
    pin = base.pin_memory
    grid = [
        replace(base, stage=2, offload_optimizer="none", offload_param="none", overlap_comm=None),
        replace(base, stage=3, offload_optimizer="none", offload_param="none", overlap_comm=None),
        replace(
            base, stage=2, offload_optimizer="cpu", offload_param="none", overlap_comm=None, pin_memory=pin
        ),
        replace(
            base, stage=3, offload_optimizer="cpu", offload_param="none", overlap_comm=None, pin_memory=pin
        ),
        replace(
            base, stage=3, offload_optimizer="cpu", offload_param="cpu", overlap_comm=None, pin_memory=pin
        ),
        replace(
            base, stage=3, offload_optimizer="nvme", offload_param="cpu", overlap_comm=None, pin_memory=pin
        ),
        replace(
            base, stage=3, offload_optimizer="nvme", offload_param="nvme", overlap_comm=None, pin_memory=pin
        ),
    ]
    # FSDP beside ZeRO for the runs that can switch with one line of their accelerate config: the user's FSDP
    # settings (or accelerate's FSDP1 defaults), full shard with and without CPU offload.
    user_fsdp = inputs.zero.fsdp if inputs.zero is not None else None
    if user_fsdp is not None or inputs.framework == "accelerate":
        f = user_fsdp or FsdpSettings()
        sharding = f.sharding if f.sharding in ("full_shard", "hybrid_shard") else "full_shard"
        grid += [
            fsdp_as_zero(replace(f, sharding=sharding, offload_params=False)),
            fsdp_as_zero(replace(f, sharding=sharding, offload_params=True)),
        ]
    return grid


def _method_variants(inputs: PlanInputs) -> list[Training]:
    t = inputs.training
    out = [t]
    if t.method == "full":
        out.append(replace(t, method="lora"))
    if t.method in ("full", "lora"):
        out.append(replace(t, method="qlora", quant_storage=_storage_for(t)))
    return out


def _needs_storage(t: Training) -> bool:
    return t.method == "qlora" and t.quant_storage == "uint8" and not t.quant_storage_by_framework


def _storage_for(t: Training) -> str:
    """bnb_4bit_quant_storage = the compute dtype (PEFT docs, "Use PEFT QLoRA and DeepSpeed with ZeRO3")."""
    return {"bf16": "bfloat16", "fp16": "float16"}.get(t.precision, "float32")


def _rank(
    plan: StrategyPlan, user_method: str, user_fsdp: bool = False
) -> tuple[int, int, int, int, int, int]:
    method_cost = {"full": 0, "lora": 1, "qlora": 2, "freeze": 0}
    keep = 0 if plan.training.method == user_method else 1 + method_cost[plan.training.method]
    status = {"fits": 0, "lower bound": 0, "save spike": 1, "tight": 2, "does not fit": 3}[plan.status]
    return (
        0 if status == 0 else 1,
        keep,
        0 if (plan.zero.fsdp is not None) == user_fsdp else 1,  # stay with the user's FSDP or ZeRO if it fits
        plan.zero.offload_rank,
        plan.zero.stage,
        0 if plan.zero.pin_memory else 1,
    )


def plan(inputs: PlanInputs, *, margin: float = DEFAULT_SAFETY_MARGIN) -> PlanResult:
    """Evaluate the user's strategy and the candidate grid; pick the recommendation; judge."""
    yours = (
        plan_strategy(inputs, inputs.zero, label="yours: " + inputs.zero.label, margin=margin)
        if inputs.zero
        else None
    )
    evaluated: list[StrategyPlan] = []
    variants = _method_variants(inputs)
    for i, training in enumerate(variants):
        if i > 0 and any(p.fits and p.training.method == inputs.training.method for p in evaluated):
            break  # keep the user's method when something fits with it
        for zero in strategy_grid(inputs):
            if training.method != "full" and zero.stage == 2 and zero.offload_optimizer != "none":
                continue  # a few MB of adapter state: offloading it buys nothing
            tr = training
            if zero.stage == 3 and _needs_storage(training):
                # ZeRO-3 candidates get the documented QLoRA setup (docs/known-failures.md); PLAN004 says so.
                tr = replace(training, quant_storage=_storage_for(training))
            cand = plan_strategy(inputs, zero, tr, margin=margin)
            evaluated.append(cand)
            if (
                cand.status == "save spike"
                and zero.stage == 3
                and zero.gather_16bit_on_save
                and not zero.fsdp
                # PEFT through the Trainer on transformers < 5.0 (or unknown): gather off writes an empty adapter
                # file (huggingface/trl#4416), so it is no way out of the spike
                and not hs.trainer_peft_z3_gathers_whole_model(
                    inputs.framework, tr.is_peft, zero.stage, inputs.transformers_version
                )
            ):
                # The rank-0 16-bit consolidation is what breaks: save ZeRO shards instead (zero_to_fp32 later).
                evaluated.append(
                    plan_strategy(inputs, replace(zero, gather_16bit_on_save=False), tr, margin=margin)
                )
            host_first = any(ph == "first_step" and w == "host" for ph, w, *_ in cand.failing_phases())
            if not cand.fits and zero.offload_rank > 0 and zero.pin_memory and host_first and not zero.fsdp:
                evaluated.append(plan_strategy(inputs, replace(zero, pin_memory=False), tr, margin=margin))
    user_fsdp = inputs.zero is not None and inputs.zero.fsdp is not None
    evaluated.sort(key=lambda s: _rank(s, inputs.training.method, user_fsdp))
    recommended = next((s for s in evaluated if s.fits), None)
    findings = judge(inputs, yours, recommended, evaluated, margin)
    return PlanResult(inputs, yours, tuple(evaluated), recommended, tuple(findings), margin)


# --------------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------------


def _g(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f} GiB"


def _why(rec: StrategyPlan, margin: float) -> str:
    gpu, gpu_phase = rec.gpu_peak()
    host, host_phase = rec.host_peak()
    bound = rec.training.lower_bound
    return (
        f"the cheapest strategy that fits with a {margin:.0%} safety margin: per-GPU peak {_g(gpu)} "
        f"({PHASE_TITLES[gpu_phase]}) of {_g(rec.cluster.gpu_memory_bytes)}, host {_g(host)} per node "
        f"({PHASE_TITLES[host_phase]}) of {_g(rec.cluster.host_ram_bytes)}"
    ) + (f"; only a lower bound: {bound}, so the real run needs more" if bound else "")


def _nothing_fits_action(advice: Advice | None) -> str:
    """When no strategy fits, PLAN001 says what PLAN006 says would (zerodoctor.plan.nothing_fits)."""
    if advice is None:
        return "add GPUs or nodes, or use GPUs with more memory"
    if advice.changes:
        ch = advice.changes[0]
        return f"no strategy fits as it is (PLAN006); with {ch.strategy}, {ch.text}"
    return f"no strategy fits (PLAN006); {advice.action}"


def _action(rec: StrategyPlan) -> str:
    if rec.zero.fsdp is not None:
        f = rec.zero.fsdp
        return (
            f"use {rec.name} (accelerate config: distributed_type: FSDP, fsdp_version: {f.version}, "
            f"fsdp_offload_params: {'true' if f.offload_params else 'false'})"
        )
    return f"use {rec.name} (zerodoctor plan --emit-ds-config ds.json writes it)"


def judge(
    inputs: PlanInputs,
    yours: StrategyPlan | None,
    rec: StrategyPlan | None,
    evaluated: list[StrategyPlan],
    margin: float,
) -> list[Finding]:
    # why nothing fits and what would (re-planned once, shared by PLAN001 and PLAN006)
    nothing_fits = advise(inputs, evaluated, margin) if rec is None else None
    out: list[Finding] = []
    t = inputs.training
    subject = yours or rec
    where = (
        Evidence()
        if yours is None
        else Evidence(key="fsdp_config" if yours.zero.fsdp else "zero_optimization")
    )
    if yours is not None:
        gpu_fail = [f for f in yours.failing_phases(with_margin=False) if f[1] == "gpu" and f[0] != "save"]
        if gpu_fail:
            order = {name: k for k, name in enumerate(PHASES)}
            ph, _, need, cap = min(gpu_fail, key=lambda f: order[f[0]])  # the first phase that breaks
            action = _action(rec) if rec is not None else _nothing_fits_action(nothing_fits)
            if ph == "eval":
                # only the evaluation breaks: its batch is the run's per_device_eval_batch_size, not the train one
                action = (
                    f"lower per_device_eval_batch_size (now {yours.training.eval_micro_batch}; transformers' default "
                    "is 8) or set prediction_loss_only / eval_accumulation_steps"
                )
            out.append(
                Finding(
                    id="PLAN001",
                    name="plan.does-not-fit",
                    severity=Severity.ERROR,
                    title=f"does not fit at the {PHASE_TITLES[ph]}",
                    message=(
                        f"{yours.zero.label} needs {_g(need)} per GPU at the {PHASE_TITLES[ph]} but a GPU has "
                        f"{_g(cap)} ({_top_items(yours, ph)}); {action}"
                    ),
                    fixes=(Fix(_upper_first(action)),),
                    evidence=(where,),
                    references=("hiyouga/LlamaFactory#7532",) if ph == "first_step" else (),
                    source=SOURCE,
                    data={"phase": ph, "need_bytes": need, "capacity_bytes": cap},
                )
            )
        host_fail = [f for f in yours.failing_phases(with_margin=False) if f[1] == "host" and f[0] != "save"]
        if host_fail:
            ph, _, need, cap = max(host_fail, key=lambda f: f[2])
            lazy = yours.phase("first_step").host_bytes - yours.phase("load").host_bytes
            out.append(
                Finding(
                    id="PLAN002",
                    name="plan.host-ram-exhausted",
                    severity=Severity.ERROR,
                    title=f"host RAM exhausted at the {PHASE_TITLES[ph]}",
                    message=(
                        f"{yours.zero.label} needs {_g(need)} of host RAM per node at the {PHASE_TITLES[ph]} "
                        f"({inputs.cluster.gpus_per_node} ranks per node; the optimizer state allocated at the first "
                        f"step adds {_g(max(lazy, 0))}) but a node has {_g(cap)}: the kernel's OOM killer ends the run "
                        f"with exit code -9; {_host_action(inputs, yours, rec)}"
                    ),
                    fixes=(Fix(_upper_first(_host_action(inputs, yours, rec))),),
                    evidence=(where,),
                    references=("deepspeedai/DeepSpeed#4380", "deepspeedai/DeepSpeed#2984"),
                    source=SOURCE,
                    data={"phase": ph, "need_bytes": need, "capacity_bytes": cap},
                )
            )
    if subject is not None:
        save = subject.phase("save")
        steady_host = subject.phase("steady").host_bytes
        spike_host = save.host_bytes - steady_host
        spike_gpu = sum(i.bytes for i in save.gpu if i.name.startswith(("16-bit gather", "FULL_STATE_DICT")))
        save_fails = [f for f in subject.failing_phases(with_margin=False) if f[0] == "save"]
        if save_fails or spike_host > 0.25 * inputs.cluster.host_ram_bytes:
            ck = subject.checkpoint
            out.append(
                Finding(
                    id="PLAN003",
                    name="plan.save-spike",
                    severity=Severity.WARNING,
                    title="checkpoint save spike" + (" does not fit" if save_fails else ""),
                    message=(
                        f"saving a checkpoint with {subject.zero.label} adds {_g(spike_host)} of host RAM on node 0 "
                        f"(total {_g(save.host_bytes)} of {_g(inputs.cluster.host_ram_bytes)}) and needs "
                        f"{_g(save.gpu_bytes)} per GPU ({_g(max(spike_gpu, 0))} gathered on top of the resident "
                        f"states); the checkpoint is {ck.full_bytes / GB:,.0f} GB on disk "
                        f"({ck.optimizer_bytes / GB:,.0f} GB optimizer state). {_save_action(inputs, subject)}"
                    ),
                    fixes=(Fix(_save_action(inputs, subject)),),
                    evidence=(
                        Evidence(
                            key="fsdp_config.fsdp_state_dict_type"
                            if subject.zero.fsdp
                            else "zero_optimization.stage3_gather_16bit_weights_on_model_save"
                        ),
                    ),
                    references=(
                        "huggingface/transformers trainer.py _save_checkpoint",
                        "hiyouga/LlamaFactory#7532",
                    ),
                    source=SOURCE,
                    data={"host_spike_bytes": spike_host, "gpu_save_bytes": save.gpu_bytes},
                )
            )
    if (
        t.method == "qlora"
        and t.quant_storage == "uint8"
        and not t.quant_storage_by_framework
        # ZeRO-3's partitioning, not FSDP's flattening: an FSDP run reports stage 3 but is not this failure
        and (inputs.zero is None or (inputs.zero.stage == 3 and inputs.zero.fsdp is None))
    ):
        ref = (yours if yours is not None and yours.zero.fsdp is None else None) or next(
            (s for s in evaluated if s.training.method == "qlora" and s.zero.stage == 3 and not s.zero.fsdp),
            None,
        )
        whole = ref.phase("load").gpu_bytes if ref is not None else 0
        out.append(
            Finding(
                id="PLAN004",
                name="plan.qlora-weights-replicated",
                severity=Severity.ERROR,
                title="QLoRA weights replicated on every GPU under ZeRO-3",
                message=(
                    f"without bnb_4bit_quant_storage the 4-bit weights are uint8 tensors ZeRO-3 cannot partition: "
                    f"the whole quantised {inputs.model.display_name} ({_g(whole)} per GPU at load, framework "
                    f"reserve included) stays on every one of the {inputs.cluster.world_size} GPUs; set "
                    f"bnb_4bit_quant_storage=torch.bfloat16 (the compute dtype) in BitsAndBytesConfig"
                ),
                fixes=(
                    Fix(
                        "Set bnb_4bit_quant_storage to the compute dtype (bfloat16) and torch_dtype to the same",
                        patch={"bnb_4bit_quant_storage": "bfloat16"},
                    ),
                ),
                references=(
                    "huggingface/peft#1972",
                    "huggingface/peft#1550",
                    "bitsandbytes-foundation/bitsandbytes#1249",
                ),
                source=SOURCE,
                data={"load_gpu_bytes": whole},
            )
        )
    if subject is not None and t.save_only_model and not subject.checkpoint.save_only_model_skips_optimizer:
        out.append(
            Finding(
                id="PLAN005",
                name="plan.save-only-model-ignored",
                severity=Severity.WARNING,
                title="save_only_model still writes the optimizer states",
                message=(
                    f"{subject.checkpoint.explanation}: each checkpoint still holds "
                    f"{subject.checkpoint.optimizer_bytes / GB:,.0f} GB of optimizer state; set "
                    "zero_optimization.stage3_gather_16bit_weights_on_model_save to true"
                ),
                fixes=(
                    Fix(
                        "Set stage3_gather_16bit_weights_on_model_save to true",
                        patch={"zero_optimization.stage3_gather_16bit_weights_on_model_save": True},
                        target="deepspeed",
                    ),
                ),
                references=("hiyouga/LlamaFactory#7532",),
                source=SOURCE,
            )
        )
    if rec is None:
        out.append(nothing_fits_finding(inputs, evaluated, margin, advice=nothing_fits))
    else:
        changed = (
            " (changes the method: nothing fits with " + t.method + ")"
            if rec.training.method != t.method
            else ""
        )
        out.append(
            Finding(
                id="PLAN007",
                name="plan.recommendation",
                severity=Severity.INFO,
                title=f"recommended: {rec.name}",
                message=f"{_why(rec, margin)}{changed}",
                source=SOURCE,
            )
        )
    steps = inputs.steps_per_epoch()
    if steps is not None and t.samples is not None:
        dp = inputs.data_parallel
        out.append(
            Finding(
                id="PLAN008",
                name="plan.steps-per-epoch",
                severity=Severity.INFO,
                title=f"{steps:,} optimizer steps per epoch",
                message=(
                    f"{t.samples:,} samples / (micro batch {t.micro_batch} x data parallel {dp} "
                    f"[{inputs.cluster.world_size} GPUs / sequence parallel {t.sequence_parallel}]) = "
                    f"{-(-t.samples // (t.micro_batch * dp)):,} micro-steps per rank, / gradient accumulation "
                    f"{t.grad_accum} = {steps:,} optimizer steps; if the run logs far fewer, check max_iters/max_steps"
                ),
                references=("huggingface/transformers trainer.py num_update_steps_per_epoch",),
                source=SOURCE,
            )
        )
    return out


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _top_items(plan: StrategyPlan, phase: str, n: int = 3) -> str:
    ph = plan.phase(phase)
    items = sorted(ph.gpu, key=lambda i: -i.bytes)[:n]
    return ", ".join(f"{i.name} {_g(i.bytes)}" for i in items)


def _host_action(inputs: PlanInputs, yours: StrategyPlan, rec: StrategyPlan | None) -> str:
    parts = []
    if yours.zero.pin_memory and yours.zero.offload_rank > 0:
        parts.append("set offload pin_memory to false (pinned blocks are rounded up to powers of two)")
    parts.append("spread the job over more nodes (host need per node falls with fewer ranks per node)")
    if yours.zero.offload_optimizer == "cpu":
        parts.append('or offload the optimizer to NVMe ("device": "nvme")')
    if rec is not None and rec.zero != yours.zero:
        parts.append(f"or {_action(rec)}")
    return ", ".join(parts)


def _save_action(inputs: PlanInputs, s: StrategyPlan) -> str:
    if s.zero.fsdp is not None:
        if s.zero.fsdp.state_dict_type == "full":
            return (
                "Set fsdp_state_dict_type: SHARDED_STATE_DICT (each rank writes its own shards instead of rank 0 "
                "gathering the fp32 model and the whole optimizer state) and save_only_model: true to skip the "
                "optimizer state"
            )
        return "Set save_only_model: true to skip the optimizer state, or spread the job over more nodes"
    if s.training.is_peft and inputs.framework not in hs.HF_TRAINER_FRAMEWORKS:
        return (
            "Save only the adapters (model.save_pretrained on the PEFT model) instead of gathering the whole "
            "16-bit base model"
        )
    if hs.trainer_peft_z3_gathers_whole_model(
        inputs.framework, s.training.is_peft, s.zero.stage, inputs.transformers_version
    ):
        return _trainer_peft_z3_save_action(inputs, s)
    if s.zero.stage == 3 and s.zero.gather_16bit_on_save:
        return (
            "Make sure node 0 has the RAM for the 16-bit consolidation, or set "
            "stage3_gather_16bit_weights_on_model_save to false and convert with zero_to_fp32.py offline; "
            "save_only_model: true drops the optimizer state from each checkpoint"
        )
    if s.zero.stage < 3:
        return (
            "Use ZeRO-3 with stage3_gather_16bit_weights_on_model_save: true (only rank 0 copies the weights)"
        )
    return "Set save_only_model: true and stage3_gather_16bit_weights_on_model_save: true to skip optimizer state"


def _trainer_peft_z3_save_action(inputs: PlanInputs, s: StrategyPlan) -> str:
    """HF Trainer, PEFT, ZeRO-3, transformers < 5.0 or unknown (plan/host_save.py): the way out is transformers
    >= 5.0 or node 0's RAM, never the gather off (an empty adapter file)."""
    version = inputs.transformers_version
    floor = hs.TRANSFORMERS_PEFT_Z3_ADAPTERS_ONLY_FROM
    empty = (
        f"keep stage3_gather_16bit_weights_on_model_save true: with false, transformers < {floor} writes an empty "
        "adapter_model.safetensors (only zero_to_fp32.py on the ZeRO checkpoint recovers the adapters; "
        "huggingface/trl#4416)"
    )
    if not s.zero.gather_16bit_on_save:
        return f"Set stage3_gather_16bit_weights_on_model_save: true, or upgrade to transformers >= {floor}: {empty}"
    save = s.phase("save")
    whole = next((i.bytes for i in save.host if i.name.startswith("rank 0: consolidated 16-bit")), 0)
    cost = (
        f"the whole 16-bit model ({_g(whole)}, frozen base included) goes to rank 0's host at every save "
        f"before PEFT keeps the adapters; transformers >= {floor} gathers only the adapters"
    )
    if version is None:
        lead = (
            f"The transformers version is unknown, so this plan charges what transformers < {floor} does for a "
            f"PEFT model under ZeRO-3: {cost}. Pass --env (`zerodoctor env --format json` output or a `pip freeze` "
            "of the training nodes) or run `zerodoctor check`, which reads the installed packages"
        )
    else:
        lead = f"transformers {version} is older than {floor}: {cost}. Upgrade transformers"
    return (
        f"{lead}, or give node 0 the RAM ({_g(save.host_bytes)} at the save); {empty}; save_only_model: true "
        "drops the optimizer state from each checkpoint"
    )
