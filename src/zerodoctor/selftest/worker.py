"""One rank of the selftest (run under `torchrun --nproc_per_node N -m zerodoctor.selftest.worker SPEC OUT`).

Runs the phases in order and appends one JSON line per event to OUT/rank<R>.jsonl, flushed at once, so the
launcher's watchdog always knows which phase each rank is in and for how long, and a rank that dies still
leaves its last phase behind. Values the launcher judges (losses, partition sizes, devices, saved tensors,
the plain single-process reference) are recorded as `data` events; this module judges nothing.

On an exception the traceback goes to stderr (the launcher's log, which `zerodoctor diagnose` then reads)
and the process ends at once; torchrun then stops the other ranks.

Evidence of who stopped first, for a rank that dies or hangs: `mark` events before each forward, backward
and optimizer step (a rank waiting in a collective for a hung partner has marked further than the partner),
and Python stacks written by `faulthandler` (C-level, so they come even from a rank blocked inside a
collective): on SIGUSR1, which the launcher's watchdog sends before it ends a hung run, to
OUT/rank<R>.stack; on SIGTERM (torchrun or the watchdog ending the rank) to OUT/rank<R>.term.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLIP_FORCE = 1.0e4
"""The first optimizer step's loss is multiplied by this so the gradient norm exceeds the clip value:
the clipping code path (where DeepSpeed 0.14.1/0.14.2 failed, deepspeedai/DeepSpeed#5422) always runs."""
SEED = 1234


class Recorder:
    """Append-only JSON-lines log of one rank's phases."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._f = (out_dir / f"rank{rank}.jsonl").open("a", encoding="utf-8")
        self.rank = rank
        self.open: list[str] = []  # phases started and not yet ended or failed, innermost last

    def event(self, **values: Any) -> None:
        values["t"] = time.time()
        self._f.write(json.dumps(values, default=str) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        kind, phase = values.get("event"), values.get("phase")
        if kind == "start":
            self.open.append(str(phase))
        elif kind in ("end", "error") and phase in self.open:
            self.open.remove(str(phase))

    def error(self, phase: str, exc: BaseException, seconds: float | None = None) -> None:
        self.event(
            event="error",
            phase=phase,
            type=type(exc).__name__,
            message=str(exc)[:4000],
            traceback=traceback.format_exc()[-8000:],
            seconds=seconds,
        )

    def mark(self, phase: str, step: int, micro: int, at: str) -> None:
        """This rank is about to run `at` (forward, backward, step) of a training step."""
        self.event(event="mark", phase=phase, step=step, micro=micro, at=at)

    def data(self, phase: str, **values: Any) -> None:
        self.event(event="data", phase=phase, values=values)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.event(event="start", phase=name)
        t0 = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            self.error(name, exc, round(time.perf_counter() - t0, 3))
            raise
        self.event(event="end", phase=name, seconds=round(time.perf_counter() - t0, 3))


_STACK_FILES: list[Any] = []  # faulthandler writes to these on a signal: they must stay open


def _stacks_on_signal(out_dir: Path, rank: int) -> None:
    """Dump every thread's Python stack on SIGUSR1 (asked by the watchdog; the rank runs on) and on SIGTERM
    (then the rank ends as it would have). faulthandler's handler runs in C, so a rank blocked inside a
    gloo/NCCL collective still answers."""
    for name, suffix, chain in (("SIGUSR1", "stack", False), ("SIGTERM", "term", True)):
        signum = getattr(signal, name, None)
        if signum is None:  # no SIGUSR1 on Windows: the phase log still tells
            continue
        try:
            f = (out_dir / f"rank{rank}.{suffix}").open("w", encoding="utf-8")
            faulthandler.register(signum, file=f, all_threads=True, chain=chain)
            _STACK_FILES.append(f)
        except (OSError, AttributeError, ValueError):  # faulthandler cannot register it here
            continue


def _fault(spec: dict[str, Any], rank: int, phase: str) -> None:
    """Test hook: end or stall this rank in the middle of a step, as a crash or a deadlock would."""
    fault = spec.get("fault")
    if not fault or int(fault.get("rank", -1)) != rank or fault.get("phase") != phase:
        return
    sys.stderr.write(f"zerodoctor selftest: injected fault '{fault.get('kind')}' on rank {rank} in {phase}\n")
    sys.stderr.flush()
    if fault.get("kind") == "hang":
        time.sleep(10**6)
    os._exit(int(fault.get("exit_code", 17)))


def _load_factory(ref: str) -> Any:
    path, _, func = ref.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("zerodoctor_selftest_factory", path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load model factory {ref}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, func)


def _build(spec: dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(SEED)
    if spec.get("model_factory"):
        return _load_factory(spec["model_factory"])(dict(spec["model_config"]))
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = dict(spec["model_config"])
    model_type = cfg_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg_dict)
    cls: Any = AutoModelForCausalLM
    if spec["builder"] != "causal-lm":
        # added to transformers in 2024 (huggingface/transformers#32472): imported only where a vision model
        # needs it, so a causal LM still builds on the older transformers a DeepSpeed 0.14 stack pairs with
        from transformers import AutoModelForImageTextToText

        cls = AutoModelForImageTextToText
    model = cls.from_config(config)
    if spec.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = spec.get("lora")
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = lora["targets"]
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=0.0,  # dropout would make the reference comparison random
                target_modules=targets if isinstance(targets, str) else list(targets),
                task_type="CAUSAL_LM",
            ),
        )
    return model


def _batches(spec: dict[str, Any], rank: int) -> list[Any]:
    import torch

    vocab = int(spec["vocab_size"])
    out = []
    for micro in range(int(spec["grad_accum"])):
        gen = torch.Generator().manual_seed(SEED + 1000 * rank + micro)
        out.append(torch.randint(3, vocab, (int(spec["micro_batch"]), int(spec["seq_len"])), generator=gen))
    return out


def _gather(engine: Any, stage: int, rank: int) -> dict[str, Any] | None:
    """Full parameters by name, as float32 on CPU, on rank 0 (every rank must call it under ZeRO-3)."""
    import deepspeed

    module = engine.module
    params = list(module.parameters())
    ctx = (
        deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        if stage == 3
        else contextlib.nullcontext()
    )
    with ctx:
        if rank != 0:
            return None
        return {n: p.detach().float().cpu().clone() for n, p in module.named_parameters()}


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str | None]:
    worst, where = 0.0, None
    for name, ta in a.items():
        tb = b.get(name)
        if tb is None or tuple(tb.shape) != tuple(ta.shape) or ta.numel() == 0:
            continue
        d = float((ta.float() - tb.float()).abs().max())
        scale = float(ta.float().abs().max()) or 1.0
        if d / scale > worst:
            worst, where = d / scale, name
    return worst, where


def _inspect(engine: Any, stage: int) -> dict[str, Any]:
    """Where this rank's parameters, fp32 master and optimizer states live, and how big they are."""
    out: dict[str, Any] = {"stage": stage}
    module = engine.module
    full = local = persist = nonpersist = view_empty = trainable_full = 0
    bound = 0
    devices: set[str] = set()
    for p in module.parameters():
        numel = int(getattr(p, "ds_numel", p.numel()))
        full += numel
        trainable_full += numel if p.requires_grad else 0
        if hasattr(p, "ds_tensor"):
            if getattr(p, "ds_persist", False):
                persist += numel
            else:
                nonpersist += numel
                local += int(p.ds_tensor.numel())
                bound += -(-numel // engine.dp_world_size)
                devices.add(str(p.ds_tensor.device))
                view_empty += int(p.numel() == 0)
        else:
            devices.add(str(p.device))
    out.update(
        full=full,
        trainable_full=trainable_full,
        persistent=persist,
        partitioned_full=nonpersist,
        partitioned_local=local,
        partitioned_bound=bound,
        param_devices=sorted(devices),
        module_views_empty=view_empty,
        dp_world_size=engine.dp_world_size,
    )
    opt = engine.optimizer
    master = getattr(opt, "fp32_partitioned_groups_flat", None) or getattr(
        opt, "single_partition_of_fp32_groups", None
    )
    if master:
        out["master_numel"] = sum(int(t.numel()) for t in master)
        out["master_devices"] = sorted({str(t.device) for t in master})
        out["master_groups"] = len(master)
    inner = getattr(opt, "optimizer", opt)
    out["optimizer_class"] = type(inner).__name__
    out["zero_optimizer_class"] = type(opt).__name__
    state_numel, state_devices = 0, set()
    for state in getattr(inner, "state", {}).values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state.get(key) if isinstance(state, dict) else None
            if t is not None and hasattr(t, "numel"):
                state_numel += int(t.numel()) if key == "exp_avg" else 0
                state_devices.add(str(t.device))
    out["adam_state_numel"] = state_numel
    out["adam_state_devices"] = sorted(state_devices)
    return out


def _extension_builds() -> dict[str, float]:
    """Modification time of every JIT-built extension library (torch's extension cache), by op name."""
    try:
        from torch.utils.cpp_extension import get_default_build_root

        root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
        found = list(root.glob("*/*/*.so")) + list(root.glob("*/*.so"))
        return {p.parent.name: p.stat().st_mtime for p in found}
    except Exception:  # noqa: BLE001 - only decides the wording of a timing
        return {}


def _changed(before: dict[str, float], after: dict[str, float]) -> list[str]:
    return sorted(name for name, mtime in after.items() if before.get(name) != mtime)


def _load_ops(spec: dict[str, Any]) -> dict[str, Any]:
    """Load (or JIT-build) the DeepSpeed ops the offload settings need, timed on their own."""
    zero = spec["ds_config"].get("zero_optimization") or {}
    wanted = []
    if str((zero.get("offload_optimizer") or {}).get("device", "none")).lower() in ("cpu", "nvme"):
        kind = str((spec["ds_config"].get("optimizer") or {}).get("type", "adamw")).lower()
        wanted.append(
            "CPUAdagradBuilder"
            if "adagrad" in kind
            else "CPULionBuilder"
            if "lion" in kind
            else "CPUAdamBuilder"
        )
    if "nvme" in {
        str((zero.get(k) or {}).get("device", "none")).lower() for k in ("offload_optimizer", "offload_param")
    }:
        wanted.append("AsyncIOBuilder")
    result: dict[str, Any] = {}
    import deepspeed.ops.op_builder as builders
    from deepspeed.git_version_info import installed_ops

    for name in wanted:
        builder = getattr(builders, name)()
        if type(builder).__name__ == "NotImplementedBuilder":
            # DeepSpeed 0.14's CPU accelerator offers only CPU Adam among these: deepspeed.initialize then
            # fails (or not) on its own terms, which is what the selftest must show
            result[name] = {"how": "not available on this accelerator", "seconds": 0.0}
            continue
        prebuilt = bool(installed_ops.get(builder.name))
        before = _extension_builds()
        t0 = time.perf_counter()
        builder.load()
        seconds = round(time.perf_counter() - t0, 2)
        built = builder.name in _changed(before, _extension_builds())
        how = "prebuilt" if prebuilt else ("JIT-built" if built else "loaded from the JIT cache")
        result[builder.name] = {"how": how, "seconds": seconds}
    return result


def run(spec_path: Path, out_dir: Path) -> int:
    spec = json.loads(spec_path.read_text())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rec = Recorder(out_dir, rank)
    _stacks_on_signal(out_dir, rank)
    rec.event(event="hello", pid=os.getpid(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    config = spec["ds_config"]
    stage = int(spec["zero_stage"])
    clip = spec.get("clip")
    try:
        with rec.phase("distributed-init"):
            from datetime import timedelta

            import deepspeed
            import torch
            import torch.distributed as dist
            from deepspeed.accelerator import get_accelerator

            accel = get_accelerator()
            if accel.device_name() != "cpu":
                # one device per local rank, set before the process group exists: NCCL binds each rank's
                # communicator to its current device, and zero.Init builds on it (all ranks on cuda:0 otherwise)
                accel.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            before = _extension_builds()
            t_init = time.perf_counter()
            deepspeed.init_distributed(
                timeout=timedelta(seconds=float(spec.get("collective_timeout_s", 120)))
            )
            # DeepSpeed's CPU accelerator JIT-builds its shared-memory collectives op here
            init_secs = round(time.perf_counter() - t_init, 2)
            init_builds = {name: init_secs for name in _changed(before, _extension_builds())}
            adapt = []
            wanted = spec["precision"]
            if wanted == "fp16" and not accel.is_fp16_supported():
                use = "bf16" if accel.is_bf16_supported() else "fp32"
            elif wanted == "bf16" and not accel.is_bf16_supported():
                use = "fp16" if accel.is_fp16_supported() else "fp32"
            else:
                use = wanted
            if use != wanted:
                config.setdefault(wanted, {})["enabled"] = False
                if use != "fp32":
                    config.setdefault(use, {})["enabled"] = True
                adapt.append(
                    {
                        "key": f"{wanted}.enabled",
                        "user_value": True,
                        "run_value": use,
                        "why": f"DeepSpeed's {accel.device_name()} accelerator here does not support {wanted}",
                    }
                )
            rec.data(
                "distributed-init",
                backend=dist.get_backend(),
                accelerator=accel.device_name(),
                world_size=world,
                torch=torch.__version__,
                deepspeed=deepspeed.__version__,
                precision=use,
                adaptations=adapt,
                jit_builds=init_builds,
                cuda=bool(torch.cuda.is_available()),
            )
        with rec.phase("model-build"):
            reference = _build(spec) if rank == 0 and not spec.get("model_factory") else None
            hf_keep = None
            if stage == 3 and not spec.get("model_factory"):
                # transformers builds its models under zero.Init through HfDeepSpeedConfig: HF Trainer sets it,
                # and transformers' "non-Trainer DeepSpeed integration" asks plain DeepSpeed scripts to set it
                # (a bare zero.Init around from_config fails in _init_weights on partitioned weights)
                from transformers.integrations import HfDeepSpeedConfig  # type: ignore[attr-defined]

                hf_keep = HfDeepSpeedConfig(config)  # type: ignore[no-untyped-call]
                model = _build(spec)
            elif stage == 3:
                # a training script imports transformers/peft before zero.Init; importing them inside it fails
                # on torch 2.13 (knowledge base: z3-init-dynamo-import-signature-mismatch)
                import peft  # noqa: F401
                import transformers  # noqa: F401

                with deepspeed.zero.Init(config_dict_or_path=config):
                    model = _build(spec)
            else:
                model = _build(spec)
            trainable = [p for p in model.parameters() if p.requires_grad]
            rec.data(
                "model-build",
                modules=sorted({type(m).__name__ for m in model.modules()})[:60],
                trainable_tensors=len(trainable),
                zero_init=stage == 3,
                via_hf=hf_keep is not None,
            )
        with rec.phase("engine-init"):
            ops = _load_ops(spec)
            t0 = time.perf_counter()
            engine, _opt, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
            rec.data(
                "engine-init",
                ops=ops,
                initialize_seconds=round(time.perf_counter() - t0, 2),
                micro_batch=engine.train_micro_batch_size_per_gpu(),
                grad_accum=engine.gradient_accumulation_steps(),
            )
            initial = _gather(engine, stage, rank)
        batches = _batches(spec, rank)
        step_records: list[dict[str, Any]] = []

        def train_step(step: int, phase: str) -> None:
            losses = []
            for micro, ids in enumerate(batches):
                ids = ids.to(engine.device)
                first = "forward-backward" if step == 0 and micro == 0 else phase
                rec.mark(first, step, micro, "forward")
                loss = engine(input_ids=ids, labels=ids).loss
                losses.append(float(loss.detach().float()))
                _fault(spec, rank, phase)
                rec.mark(first, step, micro, "backward")
                engine.backward(loss * (CLIP_FORCE if step == 0 and clip else 1.0))
                if step == 0 and micro == 0:
                    rec.event(event="end", phase="forward-backward", seconds=None)
                    rec.event(event="start", phase=phase)
                rec.mark(phase, step, micro, "step")
                engine.step()
            norm = engine.get_global_grad_norm()
            applied = engine.was_step_applied() if hasattr(engine, "was_step_applied") else True
            step_records.append(
                {
                    "step": step,
                    "losses": losses,
                    "grad_norm": None if norm is None else float(norm),
                    "applied": bool(applied),
                }
            )

        rec.event(event="start", phase="forward-backward")
        train_step(0, "clip-step")
        rec.event(event="end", phase="clip-step")
        rec.data("clip-step", **step_records[0])
        with rec.phase("optimizer-steps"):
            for step in range(1, int(spec["steps"])):
                train_step(step, "optimizer-steps")
            rec.data("optimizer-steps", steps=step_records[1:])
        with rec.phase("inspect"):
            rec.data("inspect", **_inspect(engine, stage))
        work = out_dir / "work"
        ckpt = work / "checkpoint"
        with rec.phase("checkpoint-save"):
            saved = _save(spec, engine, stage, rank, ckpt, work / "export", rec)
        with rec.phase("reload"):
            _reload(spec, engine, stage, rank, ckpt, saved, batches, rec)
        if rank == 0 and reference is not None and initial is not None:
            with rec.phase("reference"):
                rec.data("reference", **_reference(spec, reference, initial, world, step_records))
        rec.event(event="done")
        _shutdown()
        return 0
    except BaseException as exc:  # the traceback is what diagnose reads
        if rec.open:
            # the training phases (forward/backward, the clipping step) are marked by hand, not by rec.phase:
            # their exception is recorded here, so it is the rank's own error, not a silent death
            rec.error(rec.open[-1], exc)
        traceback.print_exc()
        sys.stderr.flush()
        return 1


def _save(
    spec: dict[str, Any], engine: Any, stage: int, rank: int, ckpt: Path, export: Path, rec: Recorder
) -> dict[str, Any] | None:
    import torch

    lora = bool(spec.get("lora"))
    exclude_frozen = lora and spec["save_path"] == "trainer"
    engine.save_checkpoint(str(ckpt), tag="selftest", exclude_frozen_parameters=exclude_frozen)
    path = spec["save_path"]
    file: Path | None = None
    note = ""
    if path == "save_16bit_model":
        export.mkdir(parents=True, exist_ok=True)
        ok = engine.save_16bit_model(str(export))
        file = export / "pytorch_model.bin" if ok else None
        note = "" if ok else "save_16bit_model returned False and wrote nothing"
    elif path == "trainer":
        if stage == 3 and (lora or spec["gather_on_save"]):
            sd = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=lora)
        elif stage == 3:
            sd = None
            note = (
                "stage3_gather_16bit_weights_on_model_save is false: HF Trainer saves the DeepSpeed "
                "checkpoint only, and the weights come from zero_to_fp32"
            )
        else:
            sd = engine.module.state_dict()
        if sd is not None and rank == 0:
            export.mkdir(parents=True, exist_ok=True)
            file = export / "model.pt"
            torch.save({k: v.detach().cpu() for k, v in sd.items()}, file)
    elif path == "state_dict":
        sd = engine.module.state_dict()
        if rank == 0:
            export.mkdir(parents=True, exist_ok=True)
            file = export / "model.pt"
            torch.save({k: v.detach().cpu() for k, v in sd.items()}, file)
    current = _gather(engine, stage, rank)
    if rank != 0:
        return None
    values: dict[str, Any] = {
        "save_path": path,
        "file": str(file) if file else None,
        "note": note,
        "checkpoint": str(ckpt),
    }
    if file is not None and file.exists():
        saved = torch.load(file, map_location="cpu", weights_only=True)
        expected = {n: tuple(p.shape) for n, p in current.items()} if current else {}
        empty = sorted(k for k, v in saved.items() if v.numel() == 0)
        missing = sorted(n for n in expected if n not in saved and not (lora and "lora_" not in n))
        diff, where = _max_diff(current or {}, saved)
        values.update(
            file_bytes=file.stat().st_size,
            tensors=len(saved),
            empty=empty[:20],
            empty_count=len(empty),
            missing=missing[:20],
            missing_count=len(missing),
            max_rel_diff=diff,
            max_rel_diff_at=where,
            numel=sum(int(v.numel()) for v in saved.values()),
        )
    rec.data("checkpoint-save", **values)
    return current


def _reload(
    spec: dict[str, Any],
    engine: Any,
    stage: int,
    rank: int,
    ckpt: Path,
    saved: dict[str, Any] | None,
    batches: list[Any],
    rec: Recorder,
) -> None:
    # one more step moves the weights away from the checkpoint, so the reload has something to restore
    for ids in batches:
        ids = ids.to(engine.device)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    lora = bool(spec.get("lora"))
    engine.load_checkpoint(str(ckpt), tag="selftest", load_module_strict=not lora)
    after = _gather(engine, stage, rank)
    if rank != 0 or saved is None or after is None:
        return
    diff, where = _max_diff(saved, after)
    values: dict[str, Any] = {"reload_max_rel_diff": diff, "reload_max_rel_diff_at": where}
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        t0 = time.perf_counter()
        fp32 = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="selftest")
        trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
        zdiff, zwhere = _max_diff(saved, {k: v for k, v in fp32.items()})
        values.update(
            zero_to_fp32_ok=True,
            zero_to_fp32_seconds=round(time.perf_counter() - t0, 2),
            zero_to_fp32_tensors=len(fp32),
            zero_to_fp32_empty=sorted(k for k, v in fp32.items() if v.numel() == 0)[:20],
            zero_to_fp32_missing=sorted(n for n in trainable if n not in fp32)[:20],
            zero_to_fp32_max_rel_diff=zdiff,
            zero_to_fp32_max_rel_diff_at=zwhere,
        )
    except Exception as exc:  # noqa: BLE001 - a failed conversion is a finding, not a crash of the selftest
        values.update(zero_to_fp32_ok=False, zero_to_fp32_error=f"{type(exc).__name__}: {exc}"[:2000])
    rec.data("reload", **values)


def _reference(
    spec: dict[str, Any], model: Any, initial: dict[str, Any], world: int, steps: list[dict[str, Any]]
) -> dict[str, Any]:
    """The same steps in one plain PyTorch process: fp32, no DeepSpeed, every rank's micro batches in turn."""
    import torch

    opt_cfg = spec["ds_config"].get("optimizer") or {}
    kind = str(opt_cfg.get("type", "AdamW")).lower()
    params_cfg = dict(opt_cfg.get("params") or {})
    if kind not in ("adam", "adamw"):
        return {"skipped": f"no plain reference for optimizer type {opt_cfg.get('type')!r}"}
    if kind == "adam" and params_cfg.get("adam_w_mode") is False or params_cfg.get("torch_adam"):
        return {"skipped": "no plain reference for this Adam variant (adam_w_mode false / torch_adam)"}
    missing, unexpected = model.load_state_dict(initial, strict=False)
    model.float().train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(
        trainable,
        lr=float(params_cfg.get("lr", 1e-3)),
        betas=tuple(params_cfg.get("betas", (0.9, 0.999))),
        eps=float(params_cfg.get("eps", 1e-8)),
        weight_decay=float(params_cfg.get("weight_decay", 0.0)),
    )
    clip = spec.get("clip")
    per_rank = [_batches(spec, r) for r in range(world)]
    accum = int(spec["grad_accum"])
    out = []
    for record in steps:
        optim.zero_grad(set_to_none=True)
        losses = []
        scale = CLIP_FORCE if record["step"] == 0 and clip else 1.0
        for micro in range(accum):
            for r in range(world):
                ids = per_rank[r][micro]
                loss = model(input_ids=ids, labels=ids).loss
                losses.append(float(loss.detach()))
                (loss * scale / (accum * world)).backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable, clip if clip else float("inf"))
        if record["applied"]:
            optim.step()
        out.append({"step": record["step"], "loss": sum(losses) / len(losses), "grad_norm": float(norm)})
    return {"steps": out, "unmatched_keys": len(unexpected), "missing_keys": len(missing)}


def _shutdown() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - teardown is best effort; the verdict is recorded already
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m zerodoctor.selftest.worker SPEC.json OUT_DIR\n")
        return 2
    return run(Path(args[0]), Path(args[1]))


if __name__ == "__main__":
    from zerodoctor.engine.tiny_job import exit_without_teardown

    exit_without_teardown(main())
