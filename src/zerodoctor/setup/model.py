"""TrainingSetup: every file of one training run, read together, with what the framework will do to them.

A DeepSpeed JSON on its own is judged as DeepSpeed would read it; with the HF / LLaMA-Factory arguments
that use it, "auto" values are filled the way HF Trainer fills them and mismatches HF would reject at
launch are known; with an accelerate YAML, the DeepSpeed config accelerate builds from it is used.
"""

from __future__ import annotations

import errno
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerodoctor.errors import InputError
from zerodoctor.facts import truthy
from zerodoctor.findings import Evidence
from zerodoctor.setup.deepspeed_config import (
    ACCELERATE_TO_DS,
    accelerate_plugin_config,
    apply_mixed_precision,
    canonical,
    spelled,
    with_defaults,
)
from zerodoctor.setup.document import ConfigDocument
from zerodoctor.setup.hf_args import AutoResolution, effective_args, resolve_hf_auto
from zerodoctor.setup.python_reader import Symbol
from zerodoctor.versions import parse_version

if TYPE_CHECKING:
    from zerodoctor.env.model import Environment

FRAMEWORKS = ("hf", "llamafactory", "accelerate", "xtuner", "deepspeed")
# Frameworks that fill DeepSpeed's "auto" placeholders before DeepSpeed sees them.
FILLS_AUTO = {"hf", "llamafactory", "accelerate", "xtuner"}
MODEL_REF_KEYS = ("model_name_or_path", "base_model")
"""The arguments file's model: HF / TRL / LLaMA-Factory `model_name_or_path`, axolotl `base_model`."""


@dataclass
class TrainingSetup:
    documents: list[ConfigDocument]
    framework: str | None = None  # None: only a DeepSpeed JSON was given, launcher unknown
    framework_explicit: bool = False
    ds_doc: ConfigDocument | None = None  # the file the DeepSpeed config is written in
    ds_written: dict[str, Any] | None = None  # canonical DeepSpeed config as written (or built by accelerate)
    ds_from_accelerate_plugin: bool = False
    args_doc: ConfigDocument | None = None  # HF / LLaMA-Factory arguments
    args: dict[str, Any] = field(default_factory=dict)  # effective HF arguments (defaults applied)
    accelerate_doc: ConfigDocument | None = None
    xtuner_doc: ConfigDocument | None = None
    env: Environment | None = None
    world_size: int | None = None
    world_size_source: str | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    hidden_size: int | None = None
    resolution: AutoResolution | None = None
    quant: dict[str, Any] = field(default_factory=dict)
    quant_evidence: Evidence | None = None
    method: str | None = None
    adapter: str | None = (
        None  # "oft": LLaMA-Factory's finetuning_type oft, planned as LoRA's adapter-only set
    )
    model_ref: str | None = None
    device_map_evidence: Evidence | None = None
    missing_references: list[tuple[ConfigDocument, str, str]] = field(
        default_factory=list
    )  # (doc, key, path)
    mixed_precision_evidence: Evidence | None = None  # where accelerate's fp16/bf16 choice comes from
    dataset_samples: int | None = None  # --samples: training examples per epoch, for step-count checks
    model_spec: Any = (
        None  # zerodoctor.models.spec.ModelSpec when the model is known (catalog or config.json)
    )
    model_note: str | None = None  # why the model is not known, when a model was named

    def attach_model(self, spec: Any) -> None:
        """Know the model: its size for memory rules and its hidden size for HF's bucket "auto" values."""
        self.model_spec = spec
        self.hidden_size = int(spec.params.hidden_size) if spec is not None else self.hidden_size
        if self.ds_written is not None and self.args_doc is not None:
            self.resolution = resolve_hf_auto(
                self.ds_written,
                self.args,
                world_size=self.world_size,
                hidden_size=self.hidden_size,
                zero3=(self.zero_stage == 3),
            )

    @property
    def total_params(self) -> int | None:
        return int(self.model_spec.params.total) if self.model_spec is not None else None

    # ---- the DeepSpeed config -------------------------------------------------------------------------
    @property
    def effective_ds(self) -> dict[str, Any] | None:
        """The DeepSpeed config after the framework filled "auto" (where it can be known before launch)."""
        if self.ds_written is None:
            return None
        return self.resolution.config if self.resolution else self.ds_written

    def ds_value(self, key: str, default: Any = None) -> Any:
        node: Any = self.effective_ds
        for k in key.split("."):
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    def ds_written_value(self, key: str, default: Any = None) -> Any:
        node: Any = self.ds_written
        for k in key.split("."):
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    def ds_flat(self) -> dict[str, Any]:
        """Effective DeepSpeed config, flattened, with DeepSpeed's code defaults for absent keys."""
        if self.effective_ds is None:
            return {}
        return with_defaults(self.effective_ds, self.package_version("deepspeed"))

    @property
    def zero_stage(self) -> int | None:
        if self.ds_written is None:
            return None
        return _int_or_none(self.ds_flat().get("zero_optimization.stage"))

    def ds_evidence(self, key: str, text: str | None = None) -> Evidence:
        """Where a (canonical, dotted) DeepSpeed key is written: the JSON file, or the accelerate YAML key
        it came from. Falls back to the nearest enclosing key, then to the file."""
        if self.ds_from_accelerate_plugin and self.accelerate_doc is not None:
            if key in ("fp16.enabled", "bf16.enabled") and self.mixed_precision_evidence is not None:
                return self.mixed_precision_evidence
            for acc_key, ds_key in ACCELERATE_TO_DS.items():
                if ds_key == key and self.accelerate_doc.has(("deepspeed_config", acc_key)):
                    return self.accelerate_doc.evidence(("deepspeed_config", acc_key), text)
            return self.accelerate_doc.evidence(("deepspeed_config",), text)
        if self.ds_doc is None:
            return Evidence(key=key, text=text)
        spelled_key = spelled(self.ds_doc.data, key)
        if (
            key in ("fp16.enabled", "bf16.enabled")
            and self.mixed_precision_evidence is not None
            and not self.ds_doc.has(spelled_key)
        ):
            return self.mixed_precision_evidence  # the block was added by accelerate's mixed precision
        return self.ds_doc.evidence(spelled_key, text)

    # ---- arguments, versions ----------------------------------------------------------------------------
    def arg_evidence(self, name: str, text: str | None = None) -> Evidence:
        if self.args_doc is not None:
            return self.args_doc.evidence((name,), text)
        return Evidence(key=name, text=text)

    def package_version(self, name: str) -> str | None:
        if self.env is None:
            return None
        return self.env.versions().get(name)

    @property
    def uses_hf_integration(self) -> bool | None:
        if self.framework is None:
            return None
        return self.framework in FILLS_AUTO

    # ---- facts for the knowledge base ------------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        f: dict[str, Any] = {}
        if self.ds_written is not None:
            f.update({f"ds.{k}": v for k, v in self.ds_flat().items()})
        if self.args_doc is not None:
            f.update({f"hf.{k}": v for k, v in self.args.items() if not isinstance(v, dict)})
            reentrant = self.use_reentrant()
            if reentrant is not None:
                f["hf.gradient_checkpointing_kwargs.use_reentrant"] = reentrant
        client = self.client_optimizer()
        if client is not None:
            f["setup.client_optimizer"] = client
        f.update({f"quant.{k}": v for k, v in self.quant.items()})
        if self.framework:
            f["setup.framework"] = self.framework
            f["setup.uses_hf_integration"] = self.framework in FILLS_AUTO
        if self.method:
            f["setup.method"] = self.method
        if self.world_size:
            f["setup.world_size"] = self.world_size
        if self.device_map_evidence is not None:
            f["setup.device_map"] = True
        if self.accelerate_doc is not None:
            f["setup.zero3_init"] = self.zero3_init_flag()
        if self.ds_written is not None:
            f["setup.has_auto_values"] = _has_auto(self.ds_written)
        if self.model_spec is not None:
            p = self.model_spec.params
            f["setup.model_type"] = self.model_spec.model_type
            f["setup.is_moe"] = bool(p.is_moe)
            f["setup.is_multimodal"] = bool(p.is_multimodal)
        if self.env is not None:
            f.update(self.env.facts())
        return f

    def use_reentrant(self) -> bool | None:
        """Activation checkpointing's `use_reentrant`: as given (gradient_checkpointing_kwargs, or the PEFT example
        scripts' `use_reentrant` argument), else the installed transformers' default: False in 5.23
        (modeling_utils `_activation_checkpointing_enable`); for other versions we do not know it."""
        if self.args_doc is not None and self.args_doc.kind == "llamafactory":
            # LLaMA-Factory passes {"use_reentrant": model_args.use_reentrant_gc} itself; its default is True
            # (hparams/model_args.py `use_reentrant_gc`, model/model_utils/checkpointing.py).
            return truthy(self.args_doc.get("use_reentrant_gc", True)) is not False
        gck = self.args.get("gradient_checkpointing_kwargs")
        if isinstance(gck, dict) and "use_reentrant" in gck:
            return bool(gck["use_reentrant"])
        if "use_reentrant" in self.args:
            from zerodoctor.setup.hf_args import coerce

            value = coerce(self.args["use_reentrant"], bool)
            return value if isinstance(value, bool) else None
        tf = parse_version(self.package_version("transformers"))
        if tf is not None and tf >= parse_version("5.23.0"):  # type: ignore[operator]
            return False
        return None

    def client_optimizer(self) -> bool | None:
        """Does deepspeed.initialize get an optimizer built outside DeepSpeed (and not converted)?
        An `optimizer` block means DeepSpeed builds it. HF Trainer / LLaMA-Factory / accelerate: accelerate swaps
        a torch optimizer for DeepSpeedCPUAdam when offloading (accelerator.py prepare_deepspeed), so no.
        XTuner: mmengine hands the config's torch optimizer over as is (docs/framework-facts.md d.4), so yes."""
        if self.ds_written is None:
            return None
        if isinstance(self.ds_written.get("optimizer"), dict):
            return False
        if self.framework in ("hf", "llamafactory", "accelerate"):
            return False
        if self.framework == "xtuner":
            return True
        return None

    def zero3_init_flag(self) -> bool | None:
        """accelerate's zero3_init_flag; its default is "is the config ZeRO-3" (DeepSpeedPlugin.__post_init__)."""
        if self.accelerate_doc is None:
            return None
        section = self.accelerate_doc.get("deepspeed_config") or {}
        flag = section.get("zero3_init_flag")
        if flag is None:
            return self.zero_stage == 3
        return bool(flag)


def _check_accelerate_section(doc: ConfigDocument) -> None:
    """accelerate reads `deepspeed_config:` as a mapping of plugin settings (accelerate config's
    DeepSpeedPlugin fields); any other value (a list, a string, a number, true) is refused here, by key and line."""
    section = doc.get("deepspeed_config")
    if section is None or isinstance(section, dict):
        return
    pos = doc.position(("deepspeed_config",))
    raise InputError(
        doc.display,
        f"deepspeed_config: expected a mapping of DeepSpeed plugin settings, got {type(section).__name__} "
        f"{section!r:.60}",
        line=pos.line if pos else None,
        hint="write `deepspeed_config:` followed by indented keys such as `zero_stage: 3`, "
        "or `deepspeed_config_file: ds.json`",
    )


def _has_auto(node: Any) -> bool:
    if isinstance(node, dict):
        return any(_has_auto(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_auto(v) for v in node)
    return isinstance(node, str) and node.strip().lower() == "auto"


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def build_setup(
    documents: list[ConfigDocument],
    *,
    env: Environment | None = None,
    framework: str | None = None,
    world_size: int | None = None,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    hidden_size: int | None = None,
) -> TrainingSetup:
    by_kind: dict[str, list[ConfigDocument]] = {}
    for d in documents:
        by_kind.setdefault(d.kind, []).append(d)
    s = TrainingSetup(documents=documents, env=env, num_nodes=num_nodes, gpus_per_node=gpus_per_node)

    def first(*kinds: str) -> ConfigDocument | None:
        return next((by_kind[k][0] for k in kinds if by_kind.get(k)), None)

    s.args_doc = first("llamafactory", "hf")
    s.accelerate_doc = first("accelerate")
    s.xtuner_doc = first("xtuner")
    s.ds_doc = first("deepspeed")
    if s.accelerate_doc is not None:
        _check_accelerate_section(s.accelerate_doc)

    # Framework: said explicitly, or implied by the files.
    if framework:
        s.framework, s.framework_explicit = framework, True
    elif s.xtuner_doc:
        s.framework = "xtuner"
    elif s.args_doc is not None:
        s.framework = "llamafactory" if s.args_doc.kind == "llamafactory" else "hf"
    elif s.accelerate_doc:
        s.framework = "accelerate"

    # World size: explicit, or from the accelerate config (num_processes counts all machines' processes).
    if world_size:
        s.world_size, s.world_size_source = world_size, "--world-size"
    elif num_nodes and gpus_per_node:
        s.world_size, s.world_size_source = num_nodes * gpus_per_node, "--nodes x --gpus-per-node"
    elif s.accelerate_doc is not None and _int_or_none(s.accelerate_doc.get("num_processes")):
        s.world_size = _int_or_none(s.accelerate_doc.get("num_processes"))
        s.world_size_source = f"{s.accelerate_doc.display}: num_processes"

    # Mixed precision accelerate applies: HF TrainingArguments' fp16/bf16 win over the launcher's YAML
    # (transformers 5.23 TrainingArguments.__post_init__ sets mixed_precision from them and the Trainer builds
    # its Accelerator with it); without them the YAML's `mixed_precision` applies.
    mixed = s.accelerate_doc.get("mixed_precision") if s.accelerate_doc is not None else None
    if mixed is not None and s.accelerate_doc is not None:
        s.mixed_precision_evidence = s.accelerate_doc.evidence(("mixed_precision",))
    if s.args_doc is not None:
        hf_args = effective_args(dict(s.args_doc.data), axolotl_version=s.package_version("axolotl"))
        for name in ("bf16", "fp16"):
            if hf_args.get(name) is True:
                mixed = name
                s.mixed_precision_evidence = s.args_doc.evidence((name,))
                break
    # The DeepSpeed config: a JSON file, or the one accelerate builds from its YAML section.
    if s.ds_doc is not None:
        s.ds_written = canonical(s.ds_doc.data)
    elif s.accelerate_doc is not None and isinstance(s.accelerate_doc.get("deepspeed_config"), dict):
        section = s.accelerate_doc.get("deepspeed_config")
        if not section.get("deepspeed_config_file"):
            s.ds_written = canonical(accelerate_plugin_config(section, mixed))
            s.ds_from_accelerate_plugin = True
    if s.ds_written is not None and s.accelerate_doc is not None and not s.ds_from_accelerate_plugin:
        apply_mixed_precision(s.ds_written, mixed)

    # Arguments and "auto" resolution.
    if s.args_doc is not None:
        given = dict(s.args_doc.data)
        s.args = effective_args(given, axolotl_version=s.package_version("axolotl"))
        s.model_ref = next((given[k] for k in MODEL_REF_KEYS if given.get(k)), None)
        _read_quantization_from_args(s, given)
    if s.xtuner_doc is not None:
        _read_xtuner(s)
    s.hidden_size = hidden_size
    if s.ds_written is not None and s.args_doc is not None:
        s.resolution = resolve_hf_auto(
            s.ds_written, s.args, world_size=s.world_size, hidden_size=hidden_size, zero3=(s.zero_stage == 3)
        )
    elif s.ds_written is not None and s.xtuner_doc is not None:
        _resolve_xtuner_auto(s)
    _find_device_map(s)
    return s


_TORCH_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "uint8": "uint8",
}


def normalize_dtype(value: Any) -> str | None:
    """ "torch.bfloat16", "bf16", Symbol(torch.bfloat16) -> "bfloat16"."""
    if value is None:
        return None
    text = str(value).strip().lower().removeprefix("torch.")
    return _TORCH_DTYPES.get(text, text)


def _compute_dtype_from_args(args: dict[str, Any]) -> str | None:
    if args.get("bf16") is True:
        return "bfloat16"
    if args.get("fp16") is True:
        return "float16"
    return None


def _read_quantization_from_args(s: TrainingSetup, given: dict[str, Any]) -> None:
    doc = s.args_doc
    assert doc is not None
    if doc.kind == "llamafactory":
        # LLaMA-Factory: finetuning_type defaults to "lora"; quantization_bit 4/8 with bitsandbytes.
        # It sets bnb_4bit_quant_storage = compute dtype itself (model/model_utils/quantization.py).
        ftype = str(given.get("finetuning_type", "lora")).lower()
        qbit = _int_or_none(given.get("quantization_bit"))
        qmethod = str(given.get("quantization_method", "bnb")).lower()
        if qbit == 4 and qmethod in ("bnb", "bitsandbytes"):
            s.quant = {
                "load_in_4bit": True,
                "bnb_4bit_quant_storage": _compute_dtype_from_args(s.args),
                "bnb_4bit_compute_dtype": _compute_dtype_from_args(s.args),
                "quant_storage_set_by_framework": True,
            }
            s.quant_evidence = doc.evidence(("quantization_bit",))
        elif qbit == 8:
            s.quant = {"load_in_8bit": True}
            s.quant_evidence = doc.evidence(("quantization_bit",))
        # OFT (LLaMA-Factory >= 0.9.4, PEFT OFTConfig on the same targets, quantized too: adapter.py
        # `finetuning_type in ["lora", "oft"]`) trains an adapter only, like LoRA: planned as one (run.py sizes it).
        s.adapter = ftype if ftype == "oft" else None
        s.method = ("qlora" if qbit else "lora") if ftype in ("lora", "oft") else ftype
        return
    # HF-style arguments: a `quantization_config` block, the PEFT example scripts' arguments
    # (use_4bit_quantization, bnb_4bit_quant_storage_dtype, ...) or TRL's ModelConfig (load_in_4bit).
    qc = given.get("quantization_config")
    block: dict[str, Any] = qc if isinstance(qc, dict) else {}
    load4 = block.get("load_in_4bit", given.get("load_in_4bit", given.get("use_4bit_quantization")))
    load8 = block.get("load_in_8bit", given.get("load_in_8bit", given.get("use_8bit_quantization")))
    storage_key = next(
        (k for k in ("bnb_4bit_quant_storage", "bnb_4bit_quant_storage_dtype") if k in block or k in given),
        None,
    )
    storage = (
        (block.get(storage_key) if storage_key in block else given.get(storage_key)) if storage_key else None
    )
    compute = block.get(
        "bnb_4bit_compute_dtype",
        given.get("bnb_4bit_compute_dtype", given.get("torch_dtype", given.get("dtype"))),
    )
    peft = any(given.get(k) for k in ("use_peft_lora", "use_peft", "lora_r", "lora_target_modules")) or str(
        given.get("adapter", "")
    ).lower() in ("lora", "qlora")  # axolotl's `adapter`
    if _truthy(load4):
        # TRL's ModelConfig (`load_in_4bit` at top level, no block): its get_quantization_config has passed
        # bnb_4bit_quant_storage=torch_dtype in some releases and its own bnb_4bit_quant_storage argument in
        # others, so with a torch_dtype/dtype and no explicit storage the storage is not known here.
        trl_style = "load_in_4bit" in given and not block and storage_key is None
        dtype_given = normalize_dtype(given.get("torch_dtype", given.get("dtype"))) in (
            "bfloat16",
            "float16",
            "float32",
        )
        s.quant = {
            "load_in_4bit": True,
            "bnb_4bit_quant_storage": normalize_dtype(storage),
            "quant_storage_maybe_from_dtype": trl_style and dtype_given,
            "bnb_4bit_compute_dtype": normalize_dtype(compute) or _compute_dtype_from_args(s.args),
        }
        key = (
            "quantization_config"
            if block
            else next(k for k in ("load_in_4bit", "use_4bit_quantization") if k in given)
        )
        s.quant_evidence = doc.evidence((key,))
        s.method = "qlora"
    elif _truthy(load8):
        s.quant = {"load_in_8bit": True}
        s.method = "lora" if peft else "full"
    else:
        s.method = "lora" if peft else "full"


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "yes", "1", "on")
    return bool(v)


# What `xtuner train` writes into the DeepSpeed config before deepspeed.initialize (xtuner/tools/train.py;
# docs/framework-facts.md d.2): only these "auto" keys are filled, MMEngine's values win over concrete ones.
XTUNER_FILLS = {
    "gradient_accumulation_steps": ("optim_wrapper", "accumulative_counts"),
    "train_micro_batch_size_per_gpu": ("train_dataloader", "batch_size"),
    "gradient_clipping": ("optim_wrapper", "clip_grad", "max_norm"),
}


def _resolve_xtuner_auto(s: TrainingSetup) -> None:
    doc = s.xtuner_doc
    assert doc is not None and s.ds_written is not None
    import copy

    cfg = copy.deepcopy(s.ds_written)
    res = AutoResolution(cfg)
    for ds_key, path in XTUNER_FILLS.items():
        value = doc.get(path)
        if ds_key == "gradient_clipping" and value is None:
            value = 1.0 if doc.get(("optim_wrapper", "clip_grad")) is not None else None
        if isinstance(value, Symbol):
            value = None
        if value is None:
            if isinstance(cfg.get(ds_key), str) and cfg[ds_key].strip().lower() == "auto":
                res.unresolved.append(ds_key)
            continue
        cfg[ds_key] = value  # MMEngine wins, "auto" or not
        res.filled[ds_key] = (value, ".".join(path))
    s.resolution = res


def _read_xtuner(s: TrainingSetup) -> None:
    doc = s.xtuner_doc
    assert doc is not None
    raw_model = doc.get("model")
    model: dict[str, Any] = raw_model if isinstance(raw_model, dict) else {}
    raw_llm = model.get("llm")
    llm: dict[str, Any] = raw_llm if isinstance(raw_llm, dict) else {}
    s.model_ref = s.model_ref or (
        doc.get("pretrained_model_name_or_path")
        if isinstance(doc.get("pretrained_model_name_or_path"), str)
        else None
    )
    raw_qc = llm.get("quantization_config")
    qc: dict[str, Any] | None = raw_qc if isinstance(raw_qc, dict) else None
    has_lora = isinstance(model.get("lora"), dict)
    if qc and _truthy(qc.get("load_in_4bit")):
        s.quant = {
            "load_in_4bit": True,
            "bnb_4bit_quant_storage": normalize_dtype(qc.get("bnb_4bit_quant_storage")),
            "bnb_4bit_compute_dtype": normalize_dtype(qc.get("bnb_4bit_compute_dtype")),
        }
        s.quant_evidence = doc.evidence(("model", "llm", "quantization_config"))
        s.method = "qlora"
    else:
        s.method = "lora" if has_lora else "full"


def _find_device_map(s: TrainingSetup) -> None:
    """A `device_map` given anywhere we can see it (TRL model_init_kwargs, XTuner llm dict, HF args)."""
    for doc in s.documents:
        for path in doc.positions:
            if path and path[-1] == "device_map":
                value = doc.get(path)
                if value is not None and not (isinstance(value, Symbol) and value.source == "None"):
                    s.device_map_evidence = doc.evidence(path)
                    return


def _reference_candidates(base: Path, ref: str, search_dirs: list[Path] | None = None) -> list[Path]:
    p = Path(ref)
    if p.is_absolute():
        return [p]
    candidates = [d / p for d in [base.parent, *base.parent.parents][:4]]
    candidates += [Path.cwd() / p, *((d / p) for d in (search_dirs or []))]
    # A bare file name next to the naming file (people move the JSON beside the YAML).
    return [*candidates, base.parent / p.name]


def resolve_reference(base: Path, ref: str, search_dirs: list[Path] | None = None) -> Path | None:
    """Find a file a config names (e.g. `deepspeed: examples/deepspeed/ds_z3_config.json`): relative to the
    naming file's folder and its parents (LLaMA-Factory paths are relative to its repo root), then the CWD."""
    return next((c for c in _reference_candidates(base, ref, search_dirs) if _is_file(c)), None)


def unusable_reference(base: Path, ref: str) -> str | None:
    """Why a name a config gives is there but not a file to read (a directory, a FIFO, a device, a symbolic
    link loop or a dangling link), as "PATH is ..."; None when nothing of that name exists."""
    for c in _reference_candidates(base, ref):
        try:
            mode = c.stat().st_mode
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{c} is a symbolic link loop"
            if exc.errno == errno.ENOENT and _is_symlink(c):
                return f"{c} is a symbolic link to nothing"
            continue  # (nothing of that name, or a name the file system refuses: too long)
        except ValueError:
            continue
        if stat.S_ISDIR(mode):
            return f"{c} is a directory"
        if stat.S_ISFIFO(mode):
            return f"{c} is a named pipe (FIFO), not a file"
        if not stat.S_ISREG(mode):
            return f"{c} is a device or special file, not a regular file"
    return None


def _is_symlink(path: Path) -> bool:
    """`Path.is_symlink`, where a name the file system refuses is simply not a link."""
    try:
        return path.is_symlink()
    except (OSError, ValueError):
        return False


def _is_file(path: Path) -> bool:
    """`Path.is_file`, where a name the file system refuses (too long, a NUL byte) is simply not a file."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False
