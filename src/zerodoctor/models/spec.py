"""Model shapes for the memory planner: resolve `--model` and count parameters exactly, offline.

`--model` is either a path to a Hugging Face `config.json` (or a directory holding one), a slug of the
bundled catalog (`llama-3.1-8b`), or a hub id (`meta-llama/Llama-3.1-8B-Instruct`, case-insensitive; a
local path such as `/models/Yi-34B-200K` that does not exist here is matched by its basename). The catalog
is data: one real `config.json` per model under `catalog/`, plus a `_zerodoctor` key with the hub ids,
display name and where the numbers were checked.

Why count analytically instead of building the model:

* The planner must start in well under a second, so this module never imports torch or transformers
  (checked by a test). Building Llama-3.1-405B on the meta device costs about 3 s per process
  (docs/memory-model.md).
* Architectures that need remote code (MiniCPM-V) can only be counted analytically: zerodoctor never
  sets `trust_remote_code` and never touches the network.

The analytic counts reproduce what transformers 5.23 builds, module by module. `tests/plan/test_models.py`
holds them equal to the meta-device build (`from_config` under `torch.device("meta")`) for every catalog
entry whose architecture transformers knows, so the arithmetic cannot drift silently.

Two traps that these counts avoid (docs/memory-model.md):

* Tied embeddings are one tensor. A model built on the meta device (`init_empty_weights` + `from_config`)
  can have its input and output embeddings untied -- counted twice -- until `tie_weights()` runs (seen with
  Gemma-2, whose `tie_word_embeddings` is true). Deduplicating by `data_ptr()` does not help either: on
  the meta device every pointer is 0. Here a tied `lm_head` contributes 0 to the total but still counts
  as a module of V x h for the largest-module figure, exactly like DeepSpeed's `largest_layer_params`.
* "Largest layer" means DeepSpeed's definition (largest single module's own parameters,
  `recurse=False`), which sizes ZeRO-3's gathered-parameter term, not accelerate's "largest decoder
  block". Transformers 5 stores all experts of a MoE layer as one fused module (`MixtralExperts`,
  `DeepseekV2Experts`: 3-D `gate_up_proj` and `down_proj` tensors), so for Mixtral and DeepSeek-V2 the
  largest module is a layer's experts block, not `lm_head`. With transformers 4.x (one `nn.Linear` per
  expert) it was `lm_head`/`embed_tokens`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from zerodoctor.errors import PlanError
from zerodoctor.versions import parse_version

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
"""Bundled `config.json` copies, one `<slug>.json` per model (listed in pyproject package-data)."""

CATALOG_META_KEY = "_zerodoctor"
"""Top-level key of a catalog file that holds zerodoctor's own metadata, not part of the HF config."""

LORA_ALL_LINEAR = "all-linear"

SIZES_ABOVE_ZERO = frozenset(
    {
        "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size",
        "intermediate_size", "head_dim", "n_head", "n_embd", "n_layer", "num_layers", "ffn_hidden_size",
        "multi_query_group_num", "moe_intermediate_size", "num_experts", "n_routed_experts",
        "moe_layer_freq",
    }
)  # fmt: skip
"""config.json sizes a model cannot have as 0 (they are divided by, or multiply every layer)."""

MAX_LAYERS = 1024
"""More decoder layers than any published model has (405B: 126): a larger value is a broken config, and
building it would only cost time."""

COUNT_LIMITS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("num_hidden_layers", "num_layers", "n_layer", "num_decoder_layers", "depth"), MAX_LAYERS),
    (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4096),
)
"""Counts that multiply modules (transformers builds one module per layer, some models one per expert, and
config classes build per-layer lists; the analytic counters here walk the layers): checked when the value is
read, before any per-layer work, so a broken value is an error, not a loop that runs for minutes. The
analytic builders (`_Cfg.int_`) and the meta-device build (`meta_build`) share this one table."""


def count_limit_error(source: Path, where: str, value: int) -> PlanError | None:
    """The error for a layer or expert count (`where`, dotted) above `COUNT_LIMITS`, or None if within."""
    name = where.rsplit(".", 1)[-1]
    for names, limit in COUNT_LIMITS:
        if name in names and value > limit:
            return PlanError(
                f"{source}: {where} = {value} is more than any published model has (limit {limit})",
                hint="pass the model's config.json as published with its weights",
            )
    return None
"""PEFT's shorthand: every `nn.Linear` except the output layer (`lm_head`)."""

# Component names used in `ModuleShape.component`.
TEXT = "text"
VISION = "vision"
PROJECTOR = "projector"

# Module kinds. Only LINEAR modules are `nn.Linear` (what PEFT's LoRA can wrap by name).
LINEAR = "linear"
EMBEDDING = "embedding"
NORM = "norm"
CONV = "conv"
EXPERTS = "experts"  # transformers 5 fused experts: 3-D gate_up_proj + down_proj parameters
ROUTER = "router"  # MoE router weight (not an nn.Linear in transformers 5)
PARAMS = "params"  # a module's own loose nn.Parameters (image_newline, class_embedding, resampler query)


# --------------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleShape:
    """One kind of module as transformers builds it, repeated `count` times.

    `numel` is the module's own parameters (`recurse=False`). `path` is a template of its qualified name
    in the transformers model (`{i}` stands for the layer index). `tied_to` names the module whose tensor
    this one shares (a tied `lm_head`): it counts 0 towards the total but keeps its size for the
    largest-module figure, as DeepSpeed's `largest_layer_params` sees it.
    """

    path: str
    kind: str
    numel: int
    count: int = 1
    component: str = TEXT
    in_features: int = 0
    out_features: int = 0
    bias: bool = False
    tied_to: str | None = None

    @property
    def name(self) -> str:
        """Last component of the qualified name: what PEFT `target_modules` entries match."""
        return self.path.rsplit(".", 1)[-1]

    @property
    def total(self) -> int:
        """Parameters this entry adds to the model total (0 for a tied module)."""
        return 0 if self.tied_to else self.numel * self.count


@dataclass(frozen=True)
class ParamCounts:
    """Exact parameter counts and the shape facts the planner needs.

    All counts are integers (elements, not bytes). Per-layer figures are for one decoder layer of that
    type; `total == embedding + lm_head + dense_layer * num_dense_layers + moe_layer * num_moe_layers +
    final_norm + vision_tower + projector` always holds. Shape fields describe the language model
    (`text_config` for LLaVA). MoE: `active_per_token` is the total minus the routed experts a token
    does not use (all embeddings, attention, shared experts and routers count as active).
    """

    total: int
    trainable: int
    embedding: int
    lm_head: int
    dense_layer: int
    moe_layer: int
    num_dense_layers: int
    num_moe_layers: int
    final_norm: int
    vision_tower: int
    projector: int
    largest_module_numel: int
    largest_module_name: str
    largest_linear_in: int
    largest_linear_out: int
    largest_linear_name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool
    is_moe: bool
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    active_per_token: int
    is_multimodal: bool
    vision_num_layers: int
    vision_hidden_size: int

    @property
    def decoder_layers(self) -> int:
        """All decoder layers together."""
        return self.dense_layer * self.num_dense_layers + self.moe_layer * self.num_moe_layers

    @property
    def largest_linear(self) -> tuple[int, int]:
        """(in_features, out_features) of the largest `nn.Linear`."""
        return (self.largest_linear_in, self.largest_linear_out)


@dataclass(frozen=True)
class LinearModule:
    """One kind of `nn.Linear`, repeated `count` times: what LoRA can adapt."""

    name: str
    path: str
    in_features: int
    out_features: int
    bias: bool
    count: int
    component: str


@dataclass(frozen=True)
class Quantization:
    """What a pre-quantized checkpoint stores instead of 16-bit weights (a GPTQ / AWQ / bitsandbytes QLoRA base).

    `method` is "gptq", "awq", "bnb", another transformers `quant_method` read from a config.json ("fp8",
    "compressed-tensors", ...), or None when the hub id names the bits but not the method (`-4bit`). `bits` is
    None when the file does not say. `group_size` is GPTQ/AWQ's `group_size` (-1: one group per column), None
    when unknown (the name never says it). `source` says where this was read: a config.json's
    `quantization_config` block, or the hub id's suffix with the publisher whose naming it follows.
    """

    method: str | None
    bits: int | None
    group_size: int | None = None
    source: str = ""

    @property
    def planner_refusal(self) -> str | None:
        """Why the planner cannot model this base, or None: it models 4-bit GPTQ / AWQ / bitsandbytes bases
        only (`plan/phases.py` `qlora_frozen_bytes`)."""
        what = (
            f"{self.method or 'pre-quantized'} {self.bits}-bit"
            if self.bits
            else f"{self.method} (bits unknown)"
        )
        if self.bits != 4:
            return (
                f"a {what} base ({self.source}): the planner models 4-bit quantized bases only; pass the "
                "16-bit model (or its 4-bit GPTQ/AWQ checkpoint) to plan this run"
            )
        if self.method not in (None, "gptq", "awq", "bnb"):
            return (
                f"a {what} base ({self.source}): the planner models GPTQ, AWQ and bitsandbytes 4-bit bases only; "
                "pass the 16-bit model to plan this run"
            )
        return None


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: its config, where it came from, and its exact parameter counts.

    `config` is the parsed `config.json` without zerodoctor's `_zerodoctor` key (read-only view).
    `source` is the file the config was read from (a bundled catalog file or the user's path).
    `count_method` says how `params` was obtained: "analytic (equal to the transformers meta-device
    build, tested)" or "analytic only (remote code; ...)".
    """

    name: str
    display_name: str
    model_type: str
    config: Mapping[str, Any]
    source: Path
    params: ParamCounts
    modules: tuple[ModuleShape, ...]
    hub_ids: tuple[str, ...] = ()
    catalog_slug: str | None = None
    count_method: str = ""
    notes: str = ""
    loss_in_model_dtype: bool = False
    """True when the model's own forward computes the loss on 16-bit logits (remote-code models such as
    Qwen (v1) `modeling_qwen.py`: `CrossEntropyLoss()(shift_logits, ...)` without `.float()`); False for
    transformers' native models, whose `ForCausalLMLoss` upcasts the logits (`loss/loss_utils.py`). Set in
    a config's `_zerodoctor` block as `"loss_dtype": "model"`."""
    quantization: Quantization | None = None
    """Set for a pre-quantized checkpoint (`Quantization`): read from its config.json's `quantization_config`, or
    from its hub id's suffix when the id resolves to its 16-bit base (`resolve_model`). The counts are the 16-bit
    architecture's; what a quantized weight occupies is the planner's business."""

    @property
    def remote_code(self) -> bool:
        """The model type needs `trust_remote_code` (its modeling file is not in transformers): counted
        analytically only (`_ANALYTIC_ONLY`)."""
        return self.model_type in _ANALYTIC_ONLY

    def linear_modules(self, *, components: Iterable[str] | None = None) -> tuple[LinearModule, ...]:
        """Every kind of `nn.Linear` in the model, with in/out features and how many there are.

        `components` restricts to e.g. `("text",)`; the default is all (PEFT matches names anywhere in
        the model, so `q_proj` also hits a CLIP vision tower's `q_proj`). Fused MoE experts are not
        `nn.Linear` in transformers 5 and are not listed.
        """
        wanted = None if components is None else set(components)
        return tuple(
            LinearModule(m.name, m.path, m.in_features, m.out_features, m.bias, m.count, m.component)
            for m in self.modules
            if m.kind == LINEAR and (wanted is None or m.component in wanted)
        )

    def lora_params(
        self,
        rank: int,
        target_modules: str | Sequence[str] = LORA_ALL_LINEAR,
        *,
        components: Iterable[str] | None = None,
    ) -> int:
        """Trainable LoRA parameters: rank x (in + out) for every targeted `nn.Linear`.

        `target_modules` follows PEFT: `"all-linear"` is every `nn.Linear` except the output layer
        (`lm_head`); a list matches module names exactly or as a dotted suffix of the path. LoRA biases
        are not counted (PEFT's default `bias="none"`).
        """
        if rank <= 0:
            raise PlanError(f"LoRA rank must be positive, got {rank}")
        linears = self.linear_modules(components=components)
        if isinstance(target_modules, str) and target_modules == LORA_ALL_LINEAR:
            chosen = [lin for lin in linears if not is_output_layer(lin.path)]
        else:
            names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
            chosen = [lin for lin in linears if any(_matches(lin.path, n) for n in names)]
            if not chosen:
                known = sorted({lin.name for lin in linears})
                raise PlanError(
                    f"LoRA target_modules {names} match no nn.Linear of {self.name}",
                    hint=f"its linear modules are: {', '.join(known)}; or use '{LORA_ALL_LINEAR}'",
                )
        return sum(rank * (lin.in_features + lin.out_features) * lin.count for lin in chosen)


def _matches(path: str, target: str) -> bool:
    path_no_index = path.replace(".{i}", "")
    return path.rsplit(".", 1)[-1] == target or path_no_index.endswith("." + target) or path == target


# --------------------------------------------------------------------------------------------------
# Catalog and resolution
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogEntry:
    """A bundled model: slug (file stem), display name, hub ids."""

    slug: str
    display_name: str
    hub_ids: tuple[str, ...]
    path: Path = field(compare=False)
    model_type: str = field(default="", compare=False)


@lru_cache(maxsize=1)
def catalog() -> tuple[CatalogEntry, ...]:
    """All bundled models, sorted by slug. Reads only the small JSON files."""
    entries = []
    for path in sorted(CATALOG_DIR.glob("*.json")):
        raw = _read_json(path)
        meta = raw.get(CATALOG_META_KEY, {})
        entries.append(
            CatalogEntry(
                slug=path.stem,
                display_name=str(meta.get("display_name", path.stem)),
                hub_ids=tuple(str(h) for h in meta.get("hub_ids", ())),
                path=path,
                model_type=str(raw.get("model_type", "")),
            )
        )
    return tuple(entries)


@lru_cache(maxsize=1)
def _name_index() -> dict[str, str]:
    """Lower-cased slug, hub id and hub-id basename -> slug."""
    index: dict[str, str] = {}
    for entry in catalog():
        index[entry.slug.lower()] = entry.slug
        for hub_id in entry.hub_ids:
            index[hub_id.lower()] = entry.slug
    # Basenames last, so that they never shadow a slug or a full hub id.
    for entry in catalog():
        for hub_id in entry.hub_ids:
            index.setdefault(hub_id.rsplit("/", 1)[-1].lower(), entry.slug)
    return index


def _lookup(name: str) -> str | None:
    key = name.strip().rstrip("/").lower()
    if key and "/" not in key and _is(CATALOG_DIR / f"{key}.json", "file"):
        return key  # a slug: no need to read the whole catalog
    index = _name_index()
    if key in index:
        return index[key]
    # `/models/Yi-34B-200K`, `~/ckpt/Llama-3.1-8B-Instruct`, `hf://meta-llama/...`: match the basename,
    # then the last two components as an owner/name hub id.
    parts = [p for p in key.replace("\\", "/").split("/") if p]
    if len(parts) >= 2 and "/".join(parts[-2:]) in index:
        return index["/".join(parts[-2:])]
    if parts and parts[-1] in index:
        return index[parts[-1]]
    return None


# Name words -> the architecture (model_type) they denote, most specific first. A distilled model names its
# student after "distill" (DeepSeek-R1-Distill-Llama-70B is a Llama), so that part is read first.
_FAMILY_WORDS: tuple[tuple[str, str], ...] = (
    (r"distill-llama", "llama"),
    (r"distill-qwen3", "qwen3"),
    (r"distill-qwen", "qwen2"),
    (r"llava-?v?1\.[67]|llava-next|llava-onevision", "llava_next"),
    (r"llava", "llava"),
    (r"minicpm-?v|minicpm-llama3-v", "minicpmv"),
    # vision-language and newer families: a text-only model of the same maker is another architecture
    (r"qwen3-vl", "qwen3_vl"),
    (r"qwen2\.5-vl", "qwen2_5_vl"),
    (r"qwen2-vl", "qwen2_vl"),
    (r"qwen-vl", "qwen_vl"),
    (r"internvl", "internvl"),
    (r"llama-?3\.2-\d+b-vision", "mllama"),
    (r"llama-?4", "llama4"),
    (r"gpt-?oss", "gpt_oss"),
    (r"gemma-?3-(4|12|27)b", "gemma3"),
    (r"glm-?4\.[56]", "glm4_moe"),
    (r"qwen3-[\d.]+b-a[\d.]+b|qwen3-coder-30b", "qwen3_moe"),
    (r"qwen1\.5-moe|qwen2-57b-a14b", "qwen2_moe"),
    (r"qwen3", "qwen3"),
    (r"qwen|qwq", "qwen2"),
    (r"mixtral", "mixtral"),
    (r"mistral|ministral|codestral|zephyr|openhermes", "mistral"),
    (r"gemma-?3", "gemma3_text"),
    (r"gemma-?2", "gemma2"),
    (r"gemma", "gemma"),
    (r"phi-?[34]", "phi3"),
    (r"deepseek-(coder-)?v2", "deepseek_v2"),
    (r"deepseek-(v3|r1)", "deepseek_v3"),
    (r"falcon", "falcon"),
    (r"gpt-?neox|pythia|dolly", "gpt_neox"),
    (r"(^|[/_-])opt-|galactica", "opt"),
    (r"bloom", "bloom"),
    (r"internlm2", "internlm2"),
    (r"baichuan", "baichuan"),
    (r"chatglm|glm-4", "chatglm"),
    (r"llama|vicuna|alpaca|yi-|deepseek-(llm|coder)|smollm", "llama"),
)


def family_from_name(name: str) -> str | None:
    """The architecture a model name denotes (`DeepSeek-R1-Distill-Llama-70B` -> "llama"), or None."""
    import re

    low = name.strip().lower()
    for pattern, model_type in _FAMILY_WORDS:
        if re.search(pattern, low):
            return model_type
    return None


_TYPO_CUTOFF = 0.85
"""difflib ratio above which a name whose architecture is unknown is taken as a misspelling of a bundled
one (`qwen2.5-7b-instrcut`); below it, a look-alike name (`gpt-oss-20b` / `gpt-neox-20b`) may be any
architecture, so nothing is offered."""


def close_matches(name: str, n: int = 5) -> list[str]:
    """Catalog slugs and hub ids that look like `name` (difflib), best first -- only of the architecture the
    name denotes when it denotes one (`family_from_name`), so a distilled Llama is never offered a MoE;
    for a name that denotes none, only near-identical spellings (`_TYPO_CUTOFF`)."""
    family = family_from_name(name)
    cutoff = 0.5 if family is not None else _TYPO_CUTOFF
    entries = [e for e in catalog() if family is None or e.model_type == family]
    spelled = {e.slug.lower(): e.slug for e in entries}
    for e in entries:
        for h in e.hub_ids:
            spelled[h.lower()] = h
            spelled.setdefault(h.rsplit("/", 1)[-1].lower(), h)
    key = name.strip().rstrip("/").lower()
    base = key.rsplit("/", 1)[-1]
    found: list[str] = []
    for probe in (key, base):
        for hit in difflib.get_close_matches(probe, list(spelled), n=n, cutoff=cutoff):
            if spelled[hit] not in found:
                found.append(spelled[hit])
    return found[:n]


# --------------------------------------------------------------------------------------------------
# Pre-quantized checkpoints (GPTQ / AWQ / bitsandbytes): the 16-bit base's shapes, the quantization recorded
# --------------------------------------------------------------------------------------------------

_PREQUANTIZED_SUFFIXES: tuple[tuple[str, str | None, int, frozenset[str], str, str], ...] = (
    ("-gptq-int4", "gptq", 4, frozenset(), "Qwen's naming", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"),
    ("-gptq-int8", "gptq", 8, frozenset(), "Qwen's naming", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8"),
    ("-bnb-4bit", "bnb", 4, frozenset(), "unsloth's naming", "unsloth/llama-3-8b-bnb-4bit"),
    (
        "-gptq",
        "gptq",
        4,
        frozenset(),
        "TheBloke's naming (main branch 4-bit)",
        "TheBloke/Llama-2-70B-chat-GPTQ",
    ),
    ("-awq", "awq", 4, frozenset(), "Qwen's and TheBloke's naming", "Qwen/Qwen2.5-72B-Instruct-AWQ"),
    ("-int4", "gptq", 4, frozenset({"qwen"}), "Qwen (v1) naming, auto-gptq", "Qwen/Qwen-72B-Chat-Int4"),
    ("-int8", "gptq", 8, frozenset({"qwen"}), "Qwen (v1) naming, auto-gptq", "Qwen/Qwen-7B-Chat-Int8"),
    (
        "-4bits",
        "awq",
        4,
        frozenset({"01-ai"}),
        "Yi README: 4-bit models quantized by AWQ",
        "01-ai/Yi-34B-Chat-4bits",
    ),
    (
        "-8bits",
        "gptq",
        8,
        frozenset({"01-ai"}),
        "Yi README: 8-bit models quantized by GPTQ",
        "01-ai/Yi-34B-Chat-8bits",
    ),
    (
        "-4bit",
        None,
        4,
        frozenset(),
        "bits only, the method not named",
        "CohereForAI/c4ai-command-r-v01-4bit, Duxiaoman-DI/XuanYuan-70B-Chat-4bit",
    ),
    ("-8bit", None, 8, frozenset(), "bits only, the method not named", "Duxiaoman-DI/XuanYuan-70B-Chat-8bit"),
)
"""Hub-id suffixes publishers give pre-quantized checkpoints, longest first: (suffix, method, bits, publishers,
whose naming -- the words a user is shown --, real ids that carry it -- the source, never shown as the user's). Every id is registered in LLaMA-Factory's src/llamafactory/extras/constants.py
(before commit 5cccaeec8 for the Qwen (v1), Yi and XuanYuan ones) or published by that org.

A suffix that names the method (`-GPTQ`, `-AWQ`, `-bnb-4bit`) says it for every publisher. `-Int4` / `-Int8` and
`-4bits` / `-8bits` say the method only for the `publishers` whose naming it is (the id's owner, or for a path, an
owner of the bundled base): THUDM's `chatglm2-6b-int4` is ChatGLM's own int4 format, not GPTQ, and
`baichuan-inc/Baichuan2-13B-Chat-4bits` is not Yi's AWQ. Elsewhere, and for `-4bit` / `-8bit` (Cohere's are
bitsandbytes, XuanYuan's undocumented), the method is None: the name says the bits, the run (or the checkpoint's
config.json) says the method."""

_QUANTIZED_CONFIG_CHANGES: Mapping[str, tuple[Mapping[str, int], str]] = MappingProxyType(
    {
        **dict.fromkeys(
            ("qwen2-72b-instruct-gptq-int4", "qwen2-72b-instruct-gptq-int8", "qwen2-72b-instruct-awq"),
            (
                {"intermediate_size": 29696},
                "Qwen pads the 72B MLP from 29568 to 29696 in its quantized releases (QwenLM/Qwen2#578, #787)",
            ),
        ),
        **dict.fromkeys(
            (
                "qwen2-vl-72b-instruct-awq",
                "qwen2-vl-72b-instruct-gptq-int4",
                "qwen2-vl-72b-instruct-gptq-int8",
            ),
            (
                {"intermediate_size": 29696},
                "Qwen re-quantized the 72B checkpoints with the MLP padded to 29696 (QwenLM/Qwen2-VL#230)",
            ),
        ),
        "qwen2.5-72b-instruct-awq": (
            {"intermediate_size": 29696},
            "the published config.json of Qwen/Qwen2.5-72B-Instruct-AWQ has intermediate_size 29696 (29568 padded)",
        ),
    }
)
"""Quantized releases whose config.json differs from the 16-bit base's (zero-padded for tensor-parallel kernels):
the base's sizes with these changes, each with its source. Ids not listed keep the base's sizes."""

_QUANT_METHOD_ALIASES = {"bitsandbytes": "bnb"}


def split_prequantized(name: str, base_owners: Iterable[str] = ()) -> tuple[str, Quantization] | None:
    """`Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4` -> (`Qwen/Qwen2.5-7B-Instruct`, gptq 4-bit), or None when the name
    ends in none of the publishers' suffixes (`_PREQUANTIZED_SUFFIXES`). Only the suffix is removed: the base name
    must then resolve exactly (an alias of a bundled entry, or a hub id in the local cache), never fuzzily.

    A publisher-specific suffix (`-Int4`, `-4bits`) names its method when the id's owner is that publisher, or,
    for a name without an owner (a path, a bare name), when one of `base_owners` (the owners of the resolved base's
    hub ids) is; otherwise the method is None."""
    text = name.strip().rstrip("/")
    low = text.lower()
    parts = [p for p in low.replace("\\", "/").split("/") if p]
    is_hub_id = len(parts) == 2 and not low.startswith(("/", ".", "~"))
    owner = parts[0] if is_hub_id else None
    for suffix, method, bits, publishers, whose, _ in _PREQUANTIZED_SUFFIXES:
        if low.endswith(suffix) and len(low) > len(suffix) and low[-len(suffix) - 1] != "/":
            said = text[-len(suffix) :]
            if publishers:
                owners = {owner} if owner is not None else {o.lower() for o in base_owners}
                if not owners & publishers:
                    method = None
                    whose = f"{bits}-bit; the method is named by this suffix only for {', '.join(sorted(publishers))}: {whose}"
            return text[: -len(suffix)], Quantization(method, bits, None, f"hub id suffix '{said}' ({whose})")
    return None


def quantization_from_config(config: Mapping[str, Any], source: Path) -> Quantization | None:
    """The `quantization_config` block of a config.json (transformers' `QuantizationConfigMixin.quant_method`,
    `GPTQConfig` / `AwqConfig` `bits` and `group_size`, `BitsAndBytesConfig` `load_in_4bit` / `load_in_8bit`),
    or None without one. A field of the wrong type is a PlanError naming the file and the key."""
    block = config.get("quantization_config")
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise PlanError(
            f"{source}: field 'quantization_config' must be an object, found {block!r}",
            hint="fix the config.json or pass a catalog name",
        )
    cfg = _Cfg(block, source, prefix="quantization_config.")
    bits = cfg.opt_int("bits")
    # As transformers reads it (quantizers/auto.py AutoQuantizationConfig.from_dict): `load_in_4bit` /
    # `load_in_8bit` make it bitsandbytes whatever `quant_method` says; otherwise `quant_method` is required.
    if cfg.bool_("load_in_4bit", False) or cfg.bool_("load_in_8bit", False):
        method, bits = "bnb", 4 if cfg.bool_("load_in_4bit", False) else 8
    elif not isinstance(block.get("quant_method"), str) or not block["quant_method"]:
        raise PlanError(
            f"{source}: 'quantization_config' has no 'quant_method' string (found {block.get('quant_method')!r}); "
            "transformers cannot load such a checkpoint either",
            hint="use the config.json published with the quantized weights (quant_method: gptq, awq, bitsandbytes ...)",
        )
    else:
        method = str(block["quant_method"]).lower()
        method = _QUANT_METHOD_ALIASES.get(method, method)
    if method == "awq" and bits is None:
        bits = 4  # transformers AwqConfig(bits=4)
    group = block.get("group_size")
    if group is not None and (
        isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1
    ):
        raise PlanError(
            f"{source}: field 'quantization_config.group_size' must be a whole number above 0 or -1, found {group!r}",
            hint="fix the config.json or pass a catalog name",
        )
    return Quantization(method, bits, group, f"{source}: quantization_config")


def _resolve_prequantized(text: str) -> ModelSpec | None:
    """A pre-quantized hub id (`split_prequantized`) as its 16-bit base from the local cache or the catalog, named
    as the user named it, with the quantization recorded; None when the base does not resolve exactly."""
    found = split_prequantized(text)
    if found is None:
        return None
    base, quant = found
    config_path = None
    # TheBloke names Meta's `Llama-2-70b-chat-hf` `Llama-2-70B-chat-GPTQ`: the `-hf` of Meta's transformers-format
    # repos is dropped, so that exact spelling is tried second (still an alias, never a look-alike).
    for candidate in (base, base + "-hf"):
        cached = hf_cached_config(candidate) if "/" in candidate else None
        slug = _lookup(candidate) if cached is None else None
        if cached is not None or slug is not None:
            config_path = cached or CATALOG_DIR / f"{slug}.json"
            base = candidate
            break
    if config_path is None:
        return None
    spec = model_from_config_file(config_path)
    owners = {h.split("/", 1)[0] for h in (*spec.hub_ids, base) if "/" in h}
    quant = (split_prequantized(text, owners) or (base, quant))[1]  # the base's publisher names the method
    notes = [f"pre-quantized checkpoint of {base}: sizes from {config_path.name}" + (
        f" (catalog entry {spec.catalog_slug})" if spec.catalog_slug else "")]  # fmt: skip
    changes = _QUANTIZED_CONFIG_CHANGES.get(text.rsplit("/", 1)[-1].lower())
    if changes is not None:
        sizes, why = changes
        spec = model_from_config(
            {**spec.config, **sizes},
            name=spec.name,
            source=spec.source,
            display_name=spec.display_name,
            catalog_slug=spec.catalog_slug,
            loss_in_model_dtype=spec.loss_in_model_dtype,
        )
        notes.append(f"{', '.join(f'{k} {v}' for k, v in sizes.items())}: {why}")
    if spec.notes:
        notes.append(spec.notes)
    return replace(
        spec,
        name=text,
        display_name=text,
        hub_ids=(text,),
        quantization=spec.quantization or quant,
        notes="; ".join(notes),
    )


def hf_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub cache may be, in huggingface_hub's order: `HF_HUB_CACHE`, `HF_HOME`/hub,
    then ~/.cache/huggingface/hub."""
    import os

    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def hf_cached_config(hub_id: str) -> Path | None:
    """`config.json` of `hub_id` in the local hub cache (`models--org--name/snapshots/<rev>/config.json`,
    the revision `refs/main` points to, else the newest snapshot), or None. Never touches the network."""
    parts = [p for p in hub_id.strip().strip("/").split("/") if p]
    if len(parts) != 2:
        return None
    for cache in hf_cache_dirs():
        repo = cache / f"models--{parts[0]}--{parts[1]}"
        snapshots = repo / "snapshots"
        if not _is(snapshots, "dir"):
            continue
        ref = repo / "refs" / "main"
        if _is(ref, "file"):
            cfg = snapshots / ref.read_text(encoding="utf-8").strip() / "config.json"
            if _is(cfg, "file"):
                return cfg
        found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0]
    return None


def _is(path: Path, kind: str) -> bool:
    """`path.is_dir()` / `is_file()` that answers False for a name the file system refuses (ENAMETOOLONG,
    EACCES ...): a --model value is a name first and a path only if it exists."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except (OSError, ValueError):
        return False


def resolve_model(name_or_path: str) -> ModelSpec:
    """Resolve `--model` to a `ModelSpec`; raises `PlanError` with close matches when it cannot.

    Order: an existing file or directory on disk wins; then a hub id found in the local Hugging Face cache
    (`hf_cached_config`); then catalog slug / hub id (case-insensitive); then the basename of a path-like
    name. Never imports torch, never uses the network.
    """
    text = str(name_or_path).strip()
    if not text:
        raise PlanError(
            "--model is empty", hint="pass a catalog name such as llama-3.1-8b or a config.json path"
        )
    path = Path(text).expanduser()
    if _is(path, "dir"):
        config_path = path / "config.json"
        if not _is(config_path, "file"):
            slug = _lookup(text)  # e.g. an empty /models/Llama-3.1-8B mount point: use the catalog
            if slug is not None:
                return model_from_config_file(CATALOG_DIR / f"{slug}.json")
            quantized = _resolve_prequantized(text)
            if quantized is not None:
                return quantized
            raise PlanError(
                f"{path}: directory has no config.json",
                hint="pass the model directory that holds config.json, or a catalog name",
            )
        return model_from_config_file(config_path)
    if _is(path, "file"):
        return model_from_config_file(path)

    cached = hf_cached_config(text) if "/" in text else None
    if cached is not None:  # the user's own copy wins over the bundled one
        spec = model_from_config_file(cached)
        return replace(spec, name=text, display_name=text, hub_ids=(text,))
    slug = _lookup(text)
    if slug is None:
        quantized = _resolve_prequantized(text)
        if quantized is not None:
            return quantized
        matches = close_matches(text)
        family = family_from_name(text)
        same = f" of the same architecture ({family})" if family else ""
        similar = f"; close matches{same}: {', '.join(matches)}" if matches else ""
        if family and not matches:
            similar = (
                f"; the name denotes a {family} model and none is bundled (no other architecture is offered)"
            )
        split = split_prequantized(text)
        if split is not None:
            similar = (
                f"; a pre-quantized checkpoint ({split[1].source.split(' (')[0]}) whose 16-bit base {split[0]} is "
                f"neither bundled nor in the local cache{similar}"
            )
        raise PlanError(
            f"unknown model '{text if len(text) <= 200 else text[:200] + '...'}': not a file here and not in the "
            f"bundled catalog{similar}",
            hint="pass the path to the model's config.json (or its directory), a hub id in the local Hugging "
            "Face cache (HF_HOME / HF_HUB_CACHE), or a bundled name such as "
            f"llama-3.1-8b ({len(catalog())} bundled: see zerodoctor.models.catalog())",
        )
    return model_from_config_file(CATALOG_DIR / f"{slug}.json")


def model_from_config_file(path: Path) -> ModelSpec:
    """Read a `config.json` (json only: no transformers, no remote code) and count its parameters."""
    raw = _read_json(path)
    meta = raw.get(CATALOG_META_KEY, {})
    is_catalog = path.resolve().parent == CATALOG_DIR
    if is_catalog:
        name = path.stem
    elif path.name == "config.json" and path.parent.name:
        name = path.parent.name
    else:
        name = path.stem
    return model_from_config(
        {k: v for k, v in raw.items() if k != CATALOG_META_KEY},
        name=name,
        source=path,
        display_name=str(meta.get("display_name", name)),
        hub_ids=tuple(str(h) for h in meta.get("hub_ids", ())),
        catalog_slug=path.stem if is_catalog else None,
        notes=str(meta.get("notes", "")),
        loss_in_model_dtype=str(meta.get("loss_dtype", "fp32")) == "model",
        quantization=quantization_from_config(raw, path),
    )


def model_from_config(
    config: Mapping[str, Any],
    *,
    name: str,
    source: Path,
    display_name: str | None = None,
    hub_ids: tuple[str, ...] = (),
    catalog_slug: str | None = None,
    notes: str = "",
    loss_in_model_dtype: bool = False,
    quantization: Quantization | None = None,
) -> ModelSpec:
    """Count the parameters of a parsed config dict (see `resolve_model` for the usual entry point)."""
    cfg = _Cfg(config, source)
    model_type = cfg.str_("model_type")
    builder = _BUILDERS.get(model_type)
    count_method = _ANALYTIC_ONLY.get(model_type, _TESTED_AGAINST_META)
    layer_sizes: tuple[int, int] | None = None
    from zerodoctor.models import meta_build  # imports torch only when asked to build

    if builder is None and len(meta_build.defaulted_sizes(config)) == len(meta_build.SIZE_KEYS):
        # Built from such a config, transformers would answer with its default model's sizes.
        raise PlanError(
            f"{source}: the {model_type} config states no size (none of "
            f"{', '.join(row[0] for row in meta_build.SIZE_KEYS)}, also not in text_config)",
            hint="pass the model's full config.json as published with its weights, or a catalog name",
        )
    built_on_meta = meta_build.count_shapes(config, source) if builder is None else None
    if built_on_meta is not None:
        # No builder of its own, but transformers knows the architecture: its meta-device build is exact.
        modules, shape, layer_sizes, built = built_on_meta
        count_method = (
            f"exact: transformers {meta_build.transformers_version()} built {built} on the meta device "
            f"('{model_type}' has no analytic counter here; shapes read from the built modules)"
        )
        defaulted = meta_build.defaulted_sizes(config)
        if defaulted:
            count_method += f"; the config does not state {', '.join(defaulted)}: transformers' defaults used"
    elif builder is None:
        if any(k in config for k in _MOE_KEYS) or not all(k in config for k in _GENERIC_KEYS):
            raise PlanError(
                f"{source}: model_type '{model_type}' is not supported by the parameter counter",
                hint=f"supported model types: {', '.join(sorted(_BUILDERS))}; with torch and transformers "
                "installed, every model type transformers registers is counted exactly from its meta-device "
                f"build; otherwise a decoder-only model is counted approximately when its config has "
                f"{', '.join(_GENERIC_KEYS)} and no MoE keys",
            )
        builder = _dense_decoder
        cfg = _Cfg({**config, "model_type": _GENERIC}, source)
        count_method = (
            f"approximate: '{model_type}' has no builder of its own; counted as a Llama-style decoder "
            "(SwiGLU MLP, RMSNorm, q/k/v/o from hidden_size, heads, num_key_value_heads, head_dim; "
            "attention_bias, mlp_bias, tie_word_embeddings) -- LayerNorm biases, fused or GELU MLPs and "
            "learned position embeddings are not counted"
        )
    if layer_sizes is None:
        assert builder is not None
        modules, shape = builder(cfg)
    _check_shape(shape, source)
    params = _summarise(modules, shape, layer_sizes)
    if params.total > MAX_PARAMS:
        raise PlanError(
            f"{source}: the config describes {params.total:.3g} parameters, more than any model "
            f"({MAX_PARAMS:.0e}); check hidden_size, vocab_size, num_hidden_layers and the expert counts",
            hint="fix the config.json or pass a catalog name",
        )
    return ModelSpec(
        name=name,
        display_name=display_name or name,
        model_type=model_type,
        config=MappingProxyType(dict(config)),
        source=source,
        params=params,
        modules=tuple(modules),
        hub_ids=hub_ids,
        catalog_slug=catalog_slug,
        count_method=count_method,
        notes=notes,
        loss_in_model_dtype=loss_in_model_dtype or _loss_in_16_bit_by_model_code(model_type, config),
        quantization=quantization,
    )


def _loss_in_16_bit_by_model_code(model_type: str, config: Mapping[str, Any]) -> bool:
    """A model whose own (remote) code computes the loss on the 16-bit logits, recognised from a user's config.json as
    well as from the catalog's `loss_dtype`: Baichuan2's `BaichuanForCausalLM.forward` calls CrossEntropyLoss on
    `shift_logits` with no `.float()` (jrd77/Baichuan2-13B-Chat@35e3d5af modeling_baichuan.py). Baichuan2 is
    model_type "baichuan" with its 125,696-token vocabulary or its `z_loss_weight` key; Baichuan-1 (64,000) is not."""
    return model_type == "baichuan" and (config.get("vocab_size") == 125_696 or "z_loss_weight" in config)


MAX_PARAMS = 10**14
"""More parameters than this (100 trillion, ~50x the largest published model) is a config error, not a model: the
planner's byte arithmetic and its allocator replay are not meant for sizes no machine holds."""


def _check_shape(shape: _Shape, source: Path) -> None:
    """What transformers' own modules require of the counted shape, checked before anything is planned with it: every
    key/value head serves num_attention_heads // num_key_value_heads query heads (`repeat_kv`, modeling_llama.py), so
    the KV heads must divide the query heads; a MoE layer routes each token to `num_experts_per_tok` of its experts
    (`torch.topk(router_logits, top_k)`, modeling_mixtral.py), so there must be at least one expert and at least as
    many experts as a token is routed to. A config that breaks these would not build or run; planning it gives a
    silent wrong answer."""
    if (
        shape.kv_heads
        and shape.num_heads
        and (shape.kv_heads > shape.num_heads or shape.num_heads % shape.kv_heads)
    ):
        raise PlanError(
            f"{source}: num_key_value_heads ({shape.kv_heads}) must divide num_attention_heads ({shape.num_heads}): each "
            "key/value head serves num_attention_heads // num_key_value_heads query heads",
            hint="fix the config.json or pass a catalog name",
        )
    if shape.num_moe_layers:
        if shape.num_experts < 1:
            raise PlanError(
                f"{source}: a MoE model with {shape.num_experts} experts per layer: its router needs at least one",
                hint="fix the expert count in the config.json (num_local_experts / num_experts / n_routed_experts)",
            )
        if not 1 <= shape.experts_per_token <= shape.num_experts:
            raise PlanError(
                f"{source}: num_experts_per_tok ({shape.experts_per_token}) must be between 1 and the "
                f"{shape.num_experts} experts of a layer (each token is routed to that many of them)",
                hint="fix num_experts_per_tok in the config.json",
            )


def _read_json(path: Path) -> dict[str, Any]:
    """A config.json through the bounded input layer (size cap, special files refused, UTF-8, nesting and
    number limits); every problem is a PlanError naming the file (and line and key where there is one)."""
    from zerodoctor.errors import InputError
    from zerodoctor.safeio import load_json, read_text

    try:
        data = load_json(read_text(path, what="a model config.json"), path)
    except InputError as err:
        raise PlanError(err.message, hint=err.hint or "pass a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a config.json must be a JSON object, found {type(data).__name__}")
    return data


# --------------------------------------------------------------------------------------------------
# Config access with errors that name the file and the field
# --------------------------------------------------------------------------------------------------


class _Cfg:
    """Typed access to a config dict; a missing or ill-typed field raises PlanError naming file+field."""

    def __init__(self, data: Mapping[str, Any], source: Path, prefix: str = "") -> None:
        self.data = data
        self.source = source
        self.prefix = prefix

    def _where(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def sub(self, key: str, defaults: Mapping[str, Any] | None = None) -> _Cfg:
        value = self.data.get(key)
        if value is None and defaults is not None:
            value = {}
        if not isinstance(value, Mapping):
            raise self._missing(key, "an object")
        merged = {**(defaults or {}), **value}
        return _Cfg(merged, self.source, prefix=f"{self.prefix}{key}.")

    def _missing(self, key: str, what: str) -> PlanError:
        model_type = self.data.get("model_type", "?")
        if key in self.data and self.data[key] is not None:
            return PlanError(
                f"{self.source}: field '{self._where(key)}' must be {what}, found {self.data[key]!r}",
                hint="fix the config.json or pass a catalog name",
            )
        return PlanError(
            f"{self.source}: config has no '{self._where(key)}' (needed to count the parameters of a "
            f"{model_type} model)",
            hint="pass the model's full config.json as published with its weights, or a catalog name",
        )

    def int_(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            raise self._missing(key, "an integer")
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self._missing(key, "an integer")
        if value < 0 or (value == 0 and key in SIZES_ABOVE_ZERO):
            raise self._missing(key, "a whole number above 0" if key in SIZES_ABOVE_ZERO else "0 or more")
        too_many = count_limit_error(self.source, self._where(key), value)
        if too_many is not None:
            raise too_many
        return value

    def opt_int(self, key: str) -> int | None:
        return None if self.data.get(key) is None else self.int_(key)

    def bool_(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._missing(key, "true or false")
        return value

    def str_(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str) or not value:
            raise self._missing(key, "a string")
        return value


# --------------------------------------------------------------------------------------------------
# Analytic counting, per architecture family
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """Shape facts collected by a builder (everything except the counts)."""

    num_layers: int
    num_dense_layers: int
    num_moe_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    per_expert: int = 0  # parameters of one routed expert (for active params)
    vision_num_layers: int = 0
    vision_hidden_size: int = 0
    prefix: str = "model."  # where the language model's layers live


def _linear(
    path: str, n_in: int, n_out: int, *, bias: bool = False, count: int = 1, component: str = TEXT
) -> ModuleShape:
    return ModuleShape(
        path, LINEAR, n_in * n_out + (n_out if bias else 0), count, component, n_in, n_out, bias
    )


def _norm(path: str, dim: int, *, count: int = 1, component: str = TEXT, bias: bool = False) -> ModuleShape:
    return ModuleShape(path, NORM, dim * (2 if bias else 1), count, component)


@dataclass(frozen=True)
class _Dims:
    """The standard decoder keys every Llama-style config has (hidden, layers, heads, kv heads, head_dim, ...)."""

    hidden: int
    layers: int
    heads: int
    inter: int
    vocab: int
    kv: int
    head_dim: int
    tied: bool


def _llama_dims(cfg: _Cfg, *, head_dim_default: int | None = None, tied_default: bool = False) -> _Dims:
    hidden = cfg.int_("hidden_size")
    layers = cfg.int_(
        "num_hidden_layers"
    )  # read in the published configs' order: the first missing key is named
    heads = cfg.int_("num_attention_heads")
    if head_dim_default is not None:
        head_dim = cfg.int_("head_dim", head_dim_default)
    else:
        # transformers: `getattr(config, "head_dim", None) or hidden_size // num_attention_heads`
        head_dim = cfg.int_("head_dim", hidden // heads) or hidden // heads
    return _Dims(
        hidden=hidden,
        layers=layers,
        heads=heads,
        inter=cfg.int_("intermediate_size"),
        vocab=cfg.int_("vocab_size"),
        kv=cfg.int_("num_key_value_heads", heads) or heads,
        head_dim=head_dim,
        tied=cfg.bool_("tie_word_embeddings", tied_default),
    )


def _decoder_tail(d: _Dims, lp: str, prefix: str, norms: Sequence[str]) -> list[ModuleShape]:
    """Per-layer norms, the final norm and the LM head (tied to `{prefix}embed_tokens` when tied)."""
    return [
        *(_norm(lp + n, d.hidden, count=d.layers) for n in norms),
        _norm(f"{prefix}norm", d.hidden),
        _lm_head(d.hidden, d.vocab, d.tied, prefix),
    ]


def _moe_shape(d: _Dims, dense: int, moe: int, experts: int, top_k: int, moe_inter: int) -> _Shape:
    return _Shape(
        d.layers,
        dense,
        moe,
        d.hidden,
        d.inter,
        d.vocab,
        d.heads,
        d.kv,
        d.head_dim,
        d.tied,
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=moe_inter,
        per_expert=3 * d.hidden * moe_inter,
    )


_QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3_text"})
"""Per-head RMSNorms on q and k (`self_attn.q_norm`, `self_attn.k_norm`, head_dim each)."""
_FOUR_NORMS = frozenset({"gemma2", "gemma3_text"})
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3_text"})
_HEAD_DIM_256 = frozenset({"gemma", "gemma2", "gemma3_text"})


def _dense_decoder(cfg: _Cfg, prefix: str = "model.") -> tuple[list[ModuleShape], _Shape]:
    """Llama, Mistral, Qwen2, Qwen3, Yi (converted to Llama), Gemma 1/2/3 (text), Phi-3, and the generic
    Llama-style decoder (`_GENERIC`: any other decoder-only config with the standard keys).

    Differences that matter for the count:
    * Qwen2: biases on q/k/v (not o), hard-coded in `Qwen2Attention`.
    * Llama (and the generic decoder): `attention_bias` puts biases on q/k/v/o, `mlp_bias` on gate/up/down.
    * Qwen3 / Gemma-3: per-head `q_norm` and `k_norm` (head_dim each); no attention biases by default.
    * Gemma: `head_dim` defaults to 256 and is not hidden/heads; embeddings tied by default; Gemma-2 and
      Gemma-3 have four RMSNorms per layer (input, post_attention, pre_feedforward, post_feedforward).
    * Phi-3: fused `qkv_proj` (h -> (heads + 2 kv) x head_dim) and `gate_up_proj` (h -> 2i): the same count
      as Llama, different module names (what LoRA targets see).
    """
    model_type = cfg.str_("model_type")
    d = _llama_dims(
        cfg,
        head_dim_default=256 if model_type in _HEAD_DIM_256 else None,
        tied_default=model_type in _TIED_BY_DEFAULT,
    )
    hidden, layers, heads, inter, vocab, kv, head_dim = (
        d.hidden, d.layers, d.heads, d.inter, d.vocab, d.kv, d.head_dim
    )  # fmt: skip

    if model_type == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif model_type == "mistral":
        qkv_bias = o_bias = mlp_bias = False
    elif model_type in ("llama", _GENERIC):
        qkv_bias = o_bias = cfg.bool_("attention_bias", False)
        mlp_bias = cfg.bool_("mlp_bias", False)
    else:  # qwen3, gemma*, phi3
        qkv_bias = o_bias = cfg.bool_("attention_bias", False)
        mlp_bias = False

    lp = f"{prefix}layers.{{i}}."
    mods = [ModuleShape(f"{prefix}embed_tokens", EMBEDDING, vocab * hidden)]
    if model_type == "phi3":
        mods.append(_linear(lp + "self_attn.qkv_proj", hidden, (heads + 2 * kv) * head_dim, count=layers))
        mods.append(_linear(lp + "self_attn.o_proj", heads * head_dim, hidden, count=layers))
        mods.append(_linear(lp + "mlp.gate_up_proj", hidden, 2 * inter, count=layers))
        mods.append(_linear(lp + "mlp.down_proj", inter, hidden, count=layers))
    else:
        mods += _attention_gqa(lp, hidden, heads, kv, head_dim, qkv_bias, o_bias, layers)
        mods += _mlp(lp + "mlp.", hidden, inter, mlp_bias, layers)
    if model_type in _QK_NORM:
        mods += [_norm(lp + f"self_attn.{n}", head_dim, count=layers) for n in ("q_norm", "k_norm")]
    norms = ["input_layernorm", "post_attention_layernorm"]
    if model_type in _FOUR_NORMS:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    mods += _decoder_tail(d, lp, prefix, norms)
    shape = _Shape(layers, layers, 0, hidden, inter, vocab, heads, kv, head_dim, d.tied, prefix=prefix)
    return mods, shape


def _qwen_moe(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """Qwen2-MoE / Qwen3-MoE: Qwen2 (biased q/k/v) or Qwen3 (q/k norms) attention; every
    `decoder_sparse_step`-th layer not in `mlp_only_layers` has a router (E x h), E routed experts of
    `moe_intermediate_size` and, for Qwen2-MoE, one shared SwiGLU expert of
    `shared_expert_intermediate_size` with a 1 x h `shared_expert_gate`; the other layers a dense MLP."""
    model_type = cfg.str_("model_type")
    d = _llama_dims(cfg)
    hidden, layers, heads, vocab, kv, head_dim = d.hidden, d.layers, d.heads, d.vocab, d.kv, d.head_dim
    experts = cfg.int_("num_experts")
    top_k = cfg.int_("num_experts_per_tok")
    moe_inter = cfg.int_("moe_intermediate_size")
    step = cfg.int_("decoder_sparse_step", 1) or 1
    raw_only = cfg.data.get("mlp_only_layers") or []
    only = {int(i) for i in raw_only} if isinstance(raw_only, list) else set()
    moe_layers = sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)
    dense_layers = layers - moe_layers
    qwen2 = model_type == "qwen2_moe"
    lp = "model.layers.{i}."
    mods = [ModuleShape("model.embed_tokens", EMBEDDING, vocab * hidden)]
    bias = cfg.bool_("attention_bias", False) if not qwen2 else True
    mods += _attention_gqa(lp, hidden, heads, kv, head_dim, bias, False, layers)
    if not qwen2:
        mods += [_norm(lp + f"self_attn.{n}", head_dim, count=layers) for n in ("q_norm", "k_norm")]
    if dense_layers:
        mods += _mlp(lp + "mlp.", hidden, d.inter, False, dense_layers)
    if moe_layers:
        mods.append(ModuleShape(lp + "mlp.gate", ROUTER, experts * hidden, moe_layers))
        mods.append(_experts(lp + "mlp.experts", experts, hidden, moe_inter, moe_layers))
        if qwen2:
            shared = cfg.int_("shared_expert_intermediate_size")
            mods += _mlp(lp + "mlp.shared_expert.", hidden, shared, False, moe_layers)
            mods.append(_linear(lp + "mlp.shared_expert_gate", hidden, 1, count=moe_layers))
    mods += _decoder_tail(d, lp, "model.", ("input_layernorm", "post_attention_layernorm"))
    return mods, _moe_shape(d, dense_layers, moe_layers, experts, top_k, moe_inter)


def _attention_gqa(
    lp: str, hidden: int, heads: int, kv: int, head_dim: int, qkv_bias: bool, o_bias: bool, count: int
) -> list[ModuleShape]:
    return [
        _linear(lp + "self_attn.q_proj", hidden, heads * head_dim, bias=qkv_bias, count=count),
        _linear(lp + "self_attn.k_proj", hidden, kv * head_dim, bias=qkv_bias, count=count),
        _linear(lp + "self_attn.v_proj", hidden, kv * head_dim, bias=qkv_bias, count=count),
        _linear(lp + "self_attn.o_proj", heads * head_dim, hidden, bias=o_bias, count=count),
    ]


def _mlp(mp: str, hidden: int, inter: int, bias: bool, count: int) -> list[ModuleShape]:
    return [
        _linear(mp + "gate_proj", hidden, inter, bias=bias, count=count),
        _linear(mp + "up_proj", hidden, inter, bias=bias, count=count),
        _linear(mp + "down_proj", inter, hidden, bias=bias, count=count),
    ]


def _lm_head(hidden: int, vocab: int, tied: bool, prefix: str) -> ModuleShape:
    return ModuleShape(
        "lm_head",
        LINEAR,
        vocab * hidden,
        1,
        TEXT,
        hidden,
        vocab,
        False,
        tied_to=f"{prefix}embed_tokens" if tied else None,
    )


def _experts(path: str, num: int, hidden: int, inter: int, count: int) -> ModuleShape:
    # transformers 5: gate_up_proj (E, 2*I, H) + down_proj (E, H, I) on one module.
    return ModuleShape(path, EXPERTS, num * 3 * hidden * inter, count, TEXT)


EXPERTS_FUSED_FROM = (5, 0)
"""The first transformers release that builds a MoE layer's experts as ONE module (transformers 5.23
`MixtralExperts`, `Qwen2MoeExperts`, `DeepseekV2Experts`: 3-D `gate_up_proj` (E, 2I, H) + `down_proj` (E, H, I)).
Before it, every expert is its own SwiGLU module with three `nn.Linear`s: transformers v4.36.0
src/transformers/models/mixtral/modeling_mixtral.py `MixtralBlockSparseTop2MLP` (`w1`, `w2`, `w3`) in
`MixtralSparseMoeBlock.experts = nn.ModuleList(...)`; v4.40.0 models/qwen2_moe/modeling_qwen2_moe.py `Qwen2MoeMLP`
(`gate_proj`, `up_proj`, `down_proj`) per expert, as Qwen3-MoE and DeepSeek-V2/V3 in 4.x. ZeRO-3 fetches per module
and frees each gradient per parameter, so the layout decides the largest module and the largest tensor."""

_PER_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
"""(gate, up, down) `nn.Linear` names of one expert under transformers 4.x; others: gate_proj, up_proj, down_proj
(read in the 4.45.2 and 4.57.1 wheels: mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3)."""

_MOE_BLOCK_4X = {"mixtral": "block_sparse_moe"}
"""The MoE block's attribute on a 4.x decoder layer where it is not `mlp` (Mixtral: `self.block_sparse_moe`, whose
router `gate` is an `nn.Linear(hidden, num_experts, bias=False)`)."""


def with_transformers_layout(spec: ModelSpec, transformers_version: str | None) -> ModelSpec:
    """`spec` as the given transformers release builds it: before 5.0 (`EXPERTS_FUSED_FROM`) each fused experts
    module becomes E x 3 `nn.Linear`s (h -> I gate and up, I -> h down), which changes the largest module and
    tensor (and makes the experts LoRA/bitsandbytes targets, as they were in 4.x). An unknown or current version,
    or a model without fused experts, is returned unchanged; the total is the same either way."""
    version = parse_version(transformers_version)
    if version is None or version.release >= EXPERTS_FUSED_FROM:
        return spec
    p = spec.params
    hidden, inter, num = p.hidden_size, p.moe_intermediate_size, p.num_experts
    if not any(m.kind == EXPERTS and m.numel == num * 3 * hidden * inter for m in spec.modules):
        return spec
    gate, up, down = _PER_EXPERT_NAMES.get(spec.model_type, ("gate_proj", "up_proj", "down_proj"))
    block = _MOE_BLOCK_4X.get(spec.model_type)
    mods: list[ModuleShape] = []
    for m in spec.modules:
        if block is not None and m.path.endswith(".mlp.gate") and m.kind == ROUTER:
            path = m.path.replace(".mlp.", f".{block}.")
            mods.append(_linear(path, hidden, num, count=m.count, component=m.component))
            continue
        if m.kind != EXPERTS or m.numel != num * 3 * hidden * inter:
            mods.append(m)
            continue
        per = (m.path.replace(".mlp.", f".{block}.") if block else m.path) + ".{e}."
        count = m.count * num
        mods += [
            _linear(per + gate, hidden, inter, count=count),
            _linear(per + up, hidden, inter, count=count),
            _linear(per + down, inter, hidden, count=count),
        ]
    biggest = max(mods, key=lambda m: m.numel)
    biggest_linear = max((m for m in mods if m.kind == LINEAR), key=lambda m: m.in_features * m.out_features)
    params = replace(
        p,
        largest_module_numel=biggest.numel,
        largest_module_name=biggest.path,
        largest_linear_in=biggest_linear.in_features,
        largest_linear_out=biggest_linear.out_features,
        largest_linear_name=biggest_linear.path,
    )
    note = (
        f"MoE experts laid out as transformers {transformers_version} builds them: one nn.Linear per expert "
        f"({gate}/{up}/{down}), largest module {biggest.path} {biggest.numel:,} (fused experts module from transformers 5)"
    )
    notes = "; ".join(n for n in (spec.notes, note) if n)
    return replace(spec, modules=tuple(mods), params=params, notes=notes)


def _mixtral(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """Mixtral: Mistral attention + per layer a router (E x h, no bias) and E SwiGLU experts."""
    d = _llama_dims(cfg)
    experts = cfg.int_("num_local_experts")
    lp = "model.layers.{i}."
    mods = [ModuleShape("model.embed_tokens", EMBEDDING, d.vocab * d.hidden)]
    mods += _attention_gqa(lp, d.hidden, d.heads, d.kv, d.head_dim, False, False, d.layers)
    mods.append(ModuleShape(lp + "mlp.gate", ROUTER, experts * d.hidden, d.layers))
    mods.append(_experts(lp + "mlp.experts", experts, d.hidden, d.inter, d.layers))
    mods += _decoder_tail(d, lp, "model.", ("input_layernorm", "post_attention_layernorm"))
    return mods, _moe_shape(d, 0, d.layers, experts, cfg.int_("num_experts_per_tok"), d.inter)


def _deepseek_v2(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """DeepSeek-V2 / Coder-V2: multi-head latent attention (MLA) + fine-grained MoE with shared experts.

    MLA per layer: either `q_proj` (h -> heads*(nope+rope)) when `q_lora_rank` is null (V2-Lite), or
    `q_a_proj` (h -> q_lora) + `q_a_layernorm` + `q_b_proj` (q_lora -> heads*(nope+rope)); then
    `kv_a_proj_with_mqa` (h -> kv_lora + rope) + `kv_a_layernorm` (kv_lora) + `kv_b_proj`
    (kv_lora -> heads*(nope+v)) and `o_proj` (heads*v -> h). `attention_bias` adds biases to q_a, kv_a
    and o (as in transformers and the original remote code).
    The first `first_k_dense_replace` layers have a dense SwiGLU MLP of `intermediate_size`; the rest
    (every `moe_layer_freq`-th, 1 in all published configs) have a router (E x h), E routed experts of
    `moe_intermediate_size` and one shared SwiGLU MLP of `n_shared_experts * moe_intermediate_size`.
    """
    hidden = cfg.int_("hidden_size")
    layers = cfg.int_("num_hidden_layers")
    heads = cfg.int_("num_attention_heads")
    inter = cfg.int_("intermediate_size")
    vocab = cfg.int_("vocab_size")
    q_lora = cfg.opt_int("q_lora_rank")
    kv_lora = cfg.int_("kv_lora_rank")
    nope = cfg.int_("qk_nope_head_dim")
    rope = cfg.int_("qk_rope_head_dim")
    v_dim = cfg.int_("v_head_dim")
    experts = cfg.int_("n_routed_experts")
    shared = cfg.int_("n_shared_experts", 0)
    moe_inter = cfg.int_("moe_intermediate_size")
    top_k = cfg.int_("num_experts_per_tok")
    first_dense = cfg.int_("first_k_dense_replace", 0)
    freq = cfg.int_("moe_layer_freq", 1)
    attn_bias = cfg.bool_("attention_bias", False)
    mlp_bias = cfg.bool_("mlp_bias", False)
    tied = cfg.bool_("tie_word_embeddings", False)
    kv_heads = cfg.int_("num_key_value_heads", heads)

    moe_layers = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
    dense_layers = layers - moe_layers
    qk = nope + rope
    lp = "model.layers.{i}."
    mods = [ModuleShape("model.embed_tokens", EMBEDDING, vocab * hidden)]
    if q_lora is None:
        mods.append(_linear(lp + "self_attn.q_proj", hidden, heads * qk, count=layers))
    else:
        mods.append(_linear(lp + "self_attn.q_a_proj", hidden, q_lora, bias=attn_bias, count=layers))
        mods.append(_norm(lp + "self_attn.q_a_layernorm", q_lora, count=layers))
        mods.append(_linear(lp + "self_attn.q_b_proj", q_lora, heads * qk, count=layers))
    mods.append(
        _linear(lp + "self_attn.kv_a_proj_with_mqa", hidden, kv_lora + rope, bias=attn_bias, count=layers)
    )
    mods.append(_norm(lp + "self_attn.kv_a_layernorm", kv_lora, count=layers))
    mods.append(_linear(lp + "self_attn.kv_b_proj", kv_lora, heads * (nope + v_dim), count=layers))
    mods.append(_linear(lp + "self_attn.o_proj", heads * v_dim, hidden, bias=attn_bias, count=layers))
    if dense_layers:
        mods += _mlp(lp + "mlp.", hidden, inter, mlp_bias, dense_layers)
    if moe_layers:
        mods.append(ModuleShape(lp + "mlp.gate", ROUTER, experts * hidden, moe_layers))
        mods.append(_experts(lp + "mlp.experts", experts, hidden, moe_inter, moe_layers))
        if shared:
            mods += _mlp(lp + "mlp.shared_experts.", hidden, moe_inter * shared, mlp_bias, moe_layers)
    mods += [_norm(lp + n, hidden, count=layers) for n in ("input_layernorm", "post_attention_layernorm")]
    mods.append(_norm("model.norm", hidden))
    mods.append(_lm_head(hidden, vocab, tied, "model."))
    shape = _Shape(
        layers,
        dense_layers,
        moe_layers,
        hidden,
        inter,
        vocab,
        heads,
        kv_heads,
        qk,
        tied,
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=moe_inter,
        per_expert=3 * hidden * moe_inter,
    )
    return mods, shape


def _vit_layers(lp: str, hidden: int, inter: int, layers: int) -> list[ModuleShape]:
    """One CLIP / SigLIP encoder layer: q/k/v/out_proj and fc1/fc2 with biases, two LayerNorms."""
    mods = [
        _linear(lp + f"self_attn.{n}", hidden, hidden, bias=True, count=layers, component=VISION)
        for n in ("k_proj", "v_proj", "q_proj", "out_proj")
    ]
    mods += [
        _norm(lp + "layer_norm1", hidden, count=layers, component=VISION, bias=True),
        _linear(lp + "mlp.fc1", hidden, inter, bias=True, count=layers, component=VISION),
        _linear(lp + "mlp.fc2", inter, hidden, bias=True, count=layers, component=VISION),
        _norm(lp + "layer_norm2", hidden, count=layers, component=VISION, bias=True),
    ]
    return mods


# transformers' LlavaNextConfig fills a missing vision_config with CLIP ViT-L/14-336 and a missing
# text_config with LlamaConfig defaults; sub-config fields left out fall back to the class defaults.
_CLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
}
_LLAVA_NEXT_VISION_DEFAULTS: dict[str, Any] = {
    "model_type": "clip_vision_model",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "image_size": 336,
    "patch_size": 14,
    "num_channels": 3,
}
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "vocab_size": 32000,
    },
    "mistral": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    },
    "qwen2": {
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 151936,
    },
}


def _ln(path: str, dim: int, count: int = 1) -> ModuleShape:
    """A LayerNorm with weight and bias."""
    return _norm(path, dim, count=count, bias=True)


def _gpt_style(
    *,
    prefix: str,
    embed: str,
    layers: int,
    hidden: int,
    inter: int,
    vocab: int,
    heads: int,
    kv: int,
    tied: bool,
    attn: list[ModuleShape],
    mlp: list[ModuleShape],
    norms: list[ModuleShape],
    extra: list[ModuleShape],
    final_norm: ModuleShape,
    head_path: str = "lm_head",
) -> tuple[list[ModuleShape], _Shape]:
    mods = [ModuleShape(embed, EMBEDDING, vocab * hidden), *extra, *attn, *mlp, *norms, final_norm]
    head = ModuleShape(
        head_path, LINEAR, vocab * hidden, 1, TEXT, hidden, vocab, False, tied_to=embed if tied else None
    )
    mods.append(head)
    return mods, _Shape(
        layers, layers, 0, hidden, inter, vocab, heads, kv, hidden // heads, tied, prefix=prefix
    )


def _gpt_neox(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """GPT-NeoX / Pythia: fused biased query_key_value, biased dense and a 2-matrix GELU MLP, two biased
    LayerNorms per layer, untied `embed_in` / `lm_head` by default."""
    h, n, heads = cfg.int_("hidden_size"), cfg.int_("num_hidden_layers"), cfg.int_("num_attention_heads")
    inter, vocab = cfg.int_("intermediate_size"), cfg.int_("vocab_size")
    lp = "gpt_neox.layers.{i}."
    return _gpt_style(
        prefix="gpt_neox.",
        embed="gpt_neox.embed_in",
        layers=n,
        hidden=h,
        inter=inter,
        vocab=vocab,
        heads=heads,
        kv=heads,
        tied=cfg.bool_("tie_word_embeddings", False),
        attn=[
            _linear(lp + "attention.query_key_value", h, 3 * h, bias=True, count=n),
            _linear(lp + "attention.dense", h, h, bias=True, count=n),
        ],
        mlp=[
            _linear(lp + "mlp.dense_h_to_4h", h, inter, bias=True, count=n),
            _linear(lp + "mlp.dense_4h_to_h", inter, h, bias=True, count=n),
        ],
        norms=[_ln(lp + "input_layernorm", h, n), _ln(lp + "post_attention_layernorm", h, n)],
        extra=[],
        final_norm=_ln("gpt_neox.final_layer_norm", h),
    )


def _falcon(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """Falcon: fused query_key_value (multi-query: h + 2 head_dim; new decoder architecture: (heads + 2 kv) x
    head_dim), dense, a 2-matrix GELU MLP of `ffn_hidden_size` (4h), biased LayerNorms: one per layer with
    parallel attention, two (`ln_attn`, `ln_mlp`) in the new architecture; `bias` on every Linear; tied."""
    h, n, heads = cfg.int_("hidden_size"), cfg.int_("num_hidden_layers"), cfg.int_("num_attention_heads")
    vocab = cfg.int_("vocab_size")
    inter = cfg.int_("ffn_hidden_size", 4 * h) or 4 * h
    hd = h // heads
    new_arch = cfg.bool_("new_decoder_architecture", False)
    bias = cfg.bool_("bias", False)
    multi_query = cfg.bool_("multi_query", True)
    kv = cfg.int_("num_kv_heads", heads) if new_arch else (1 if multi_query else heads)
    lp = "transformer.h.{i}."
    if new_arch:
        norms = [_ln(lp + "ln_attn", h, n), _ln(lp + "ln_mlp", h, n)]
    elif cfg.bool_("parallel_attn", True):
        norms = [_ln(lp + "input_layernorm", h, n)]
    else:
        norms = [_ln(lp + "input_layernorm", h, n), _ln(lp + "post_attention_layernorm", h, n)]
    return _gpt_style(
        prefix="transformer.",
        embed="transformer.word_embeddings",
        layers=n,
        hidden=h,
        inter=inter,
        vocab=vocab,
        heads=heads,
        kv=kv,
        tied=cfg.bool_("tie_word_embeddings", True),
        attn=[
            _linear(lp + "self_attention.query_key_value", h, (heads + 2 * kv) * hd, bias=bias, count=n),
            _linear(lp + "self_attention.dense", h, h, bias=bias, count=n),
        ],
        mlp=[
            _linear(lp + "mlp.dense_h_to_4h", h, inter, bias=bias, count=n),
            _linear(lp + "mlp.dense_4h_to_h", inter, h, bias=bias, count=n),
        ],
        norms=norms,
        extra=[],
        final_norm=_ln("transformer.ln_f", h),
    )


def _bloom(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """BLOOM: an embedding LayerNorm, fused biased query_key_value, biased dense, a 4h GELU MLP with biases,
    two biased LayerNorms per layer (ALiBi: no position parameters); tied."""
    h = cfg.int_("hidden_size")
    n = cfg.int_("n_layer")
    heads = cfg.int_("n_head")
    vocab = cfg.int_("vocab_size")
    lp = "transformer.h.{i}."
    return _gpt_style(
        prefix="transformer.",
        embed="transformer.word_embeddings",
        layers=n,
        hidden=h,
        inter=4 * h,
        vocab=vocab,
        heads=heads,
        kv=heads,
        tied=cfg.bool_("tie_word_embeddings", True),
        attn=[
            _linear(lp + "self_attention.query_key_value", h, 3 * h, bias=True, count=n),
            _linear(lp + "self_attention.dense", h, h, bias=True, count=n),
        ],
        mlp=[
            _linear(lp + "mlp.dense_h_to_4h", h, 4 * h, bias=True, count=n),
            _linear(lp + "mlp.dense_4h_to_h", 4 * h, h, bias=True, count=n),
        ],
        norms=[_ln(lp + "input_layernorm", h, n), _ln(lp + "post_attention_layernorm", h, n)],
        extra=[_ln("transformer.word_embeddings_layernorm", h)],
        final_norm=_ln("transformer.ln_f", h),
    )


def _opt(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """OPT: learned positions (`max_position_embeddings` + 2), biased q/k/v/out_proj (`enable_bias`), fc1/fc2,
    two biased LayerNorms per layer and a final one (`do_layer_norm_before`; OPT-350m's projections are not
    modelled: refused), tied."""
    h = cfg.int_("hidden_size")
    n = cfg.int_("num_hidden_layers")
    heads = cfg.int_("num_attention_heads")
    ffn = cfg.int_("ffn_dim")
    vocab = cfg.int_("vocab_size")
    if cfg.int_("word_embed_proj_dim", h) != h or not cfg.bool_("do_layer_norm_before", True):
        raise PlanError(
            f"{cfg.source}: OPT with word_embed_proj_dim != hidden_size (opt-350m) is not supported",
            hint="pass another model or a config.json of a supported architecture",
        )
    bias = cfg.bool_("enable_bias", True)
    lp = "model.decoder.layers.{i}."
    attn = [_linear(lp + f"self_attn.{x}", h, h, bias=bias, count=n) for x in ("q_proj", "k_proj", "v_proj")]
    attn.append(_linear(lp + "self_attn.out_proj", h, h, bias=bias, count=n))
    return _gpt_style(
        prefix="model.decoder.",
        embed="model.decoder.embed_tokens",
        layers=n,
        hidden=h,
        inter=ffn,
        vocab=vocab,
        heads=heads,
        kv=heads,
        tied=cfg.bool_("tie_word_embeddings", True),
        attn=attn,
        mlp=[
            _linear(lp + "fc1", h, ffn, bias=bias, count=n),
            _linear(lp + "fc2", ffn, h, bias=bias, count=n),
        ],
        norms=[_ln(lp + "self_attn_layer_norm", h, n), _ln(lp + "final_layer_norm", h, n)],
        extra=[
            ModuleShape(
                "model.decoder.embed_positions", EMBEDDING, (cfg.int_("max_position_embeddings") + 2) * h
            )
        ],
        final_norm=_ln("model.decoder.final_layer_norm", h),
    )


def _qwen_v1(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """Qwen (v1, remote code `modeling_qwen.py`): `transformer.wte`, per layer `attn.c_attn` (h -> 3h, always
    biased), `attn.c_proj`, `mlp.w1` / `mlp.w2` (h -> intermediate_size / 2 each) and `mlp.c_proj`, RMSNorms
    `ln_1` / `ln_2`, `transformer.ln_f` and an untied `lm_head`; `no_bias` removes the other biases."""
    h, n, heads = cfg.int_("hidden_size"), cfg.int_("num_hidden_layers"), cfg.int_("num_attention_heads")
    ff, vocab = cfg.int_("intermediate_size") // 2, cfg.int_("vocab_size")
    bias = not cfg.bool_("no_bias", True)
    lp = "transformer.h.{i}."
    return _gpt_style(
        prefix="transformer.",
        embed="transformer.wte",
        layers=n,
        hidden=h,
        inter=ff,
        vocab=vocab,
        heads=heads,
        kv=heads,
        tied=False,
        attn=[
            _linear(lp + "attn.c_attn", h, 3 * h, bias=True, count=n),
            _linear(lp + "attn.c_proj", h, h, bias=bias, count=n),
        ],
        mlp=[
            _linear(lp + "mlp.w1", h, ff, bias=bias, count=n),
            _linear(lp + "mlp.w2", h, ff, bias=bias, count=n),
            _linear(lp + "mlp.c_proj", ff, h, bias=bias, count=n),
        ],
        norms=[_norm(lp + "ln_1", h, count=n), _norm(lp + "ln_2", h, count=n)],
        extra=[],
        final_norm=_norm("transformer.ln_f", h),
    )


def _internlm2(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """InternLM2 / 2.5 (remote code `modeling_internlm2.py`): Llama counts with fused `attention.wqkv`
    ((heads + 2 kv) x head_dim), `attention.wo`, `feed_forward.w1/w3/w2`, `attention_norm`, `ffn_norm`,
    `tok_embeddings` and an untied `output` head; `bias` on the attention Linears."""
    h, n, heads = cfg.int_("hidden_size"), cfg.int_("num_hidden_layers"), cfg.int_("num_attention_heads")
    inter, vocab = cfg.int_("intermediate_size"), cfg.int_("vocab_size")
    kv = cfg.int_("num_key_value_heads", heads) or heads
    hd = h // heads
    bias = cfg.bool_("bias", False)
    lp = "model.layers.{i}."
    return _gpt_style(
        prefix="model.",
        embed="model.tok_embeddings",
        layers=n,
        hidden=h,
        inter=inter,
        vocab=vocab,
        heads=heads,
        kv=kv,
        tied=cfg.bool_("tie_word_embeddings", False),
        attn=[
            _linear(lp + "attention.wqkv", h, (heads + 2 * kv) * hd, bias=bias, count=n),
            _linear(lp + "attention.wo", heads * hd, h, bias=bias, count=n),
        ],
        mlp=[
            _linear(lp + "feed_forward.w1", h, inter, count=n),
            _linear(lp + "feed_forward.w3", h, inter, count=n),
            _linear(lp + "feed_forward.w2", inter, h, count=n),
        ],
        norms=[_norm(lp + "attention_norm", h, count=n), _norm(lp + "ffn_norm", h, count=n)],
        extra=[],
        final_norm=_norm("model.norm", h),
        head_path="output",
    )


def _baichuan(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """Baichuan / Baichuan2 (remote code): Llama counts (MHA) with a fused `self_attn.W_pack` (h -> 3h) and an
    untied `lm_head` (Baichuan2's NormHead keeps a vocab x h weight)."""
    h, n, heads = cfg.int_("hidden_size"), cfg.int_("num_hidden_layers"), cfg.int_("num_attention_heads")
    inter, vocab = cfg.int_("intermediate_size"), cfg.int_("vocab_size")
    lp = "model.layers.{i}."
    return _gpt_style(
        prefix="model.",
        embed="model.embed_tokens",
        layers=n,
        hidden=h,
        inter=inter,
        vocab=vocab,
        heads=heads,
        kv=heads,
        tied=False,
        attn=[
            _linear(lp + "self_attn.W_pack", h, 3 * h, count=n),
            _linear(lp + "self_attn.o_proj", h, h, count=n),
        ],
        mlp=_mlp(lp + "mlp.", h, inter, False, n),
        norms=[_norm(lp + "input_layernorm", h, count=n), _norm(lp + "post_attention_layernorm", h, count=n)],
        extra=[],
        final_norm=_norm("model.norm", h),
    )


def _chatglm(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """ChatGLM2/3, GLM-4 (remote code `modeling_chatglm.py`): `query_key_value` (h -> heads x kv_channels +
    2 x multi_query_group_num x kv_channels, biased with `add_qkv_bias`), `dense`, `dense_h_to_4h`
    (h -> 2 ffn, SwiGLU) and `dense_4h_to_h`, RMSNorms, separate `output_layer`."""
    h, n, heads = cfg.int_("hidden_size"), cfg.int_("num_layers"), cfg.int_("num_attention_heads")
    ffn, vocab = cfg.int_("ffn_hidden_size"), cfg.int_("padded_vocab_size")
    kvc = cfg.int_("kv_channels", h // heads)
    groups = cfg.int_("multi_query_group_num", heads) if cfg.bool_("multi_query_attention", True) else heads
    qkv_bias = cfg.bool_("add_qkv_bias", False)
    lin_bias = cfg.bool_("add_bias_linear", False)
    lp = "transformer.encoder.layers.{i}."
    return _gpt_style(
        prefix="transformer.encoder.",
        embed="transformer.embedding.word_embeddings",
        layers=n,
        hidden=h,
        inter=ffn,
        vocab=vocab,
        heads=heads,
        kv=groups,
        tied=False,
        attn=[
            _linear(
                lp + "self_attention.query_key_value",
                h,
                heads * kvc + 2 * groups * kvc,
                bias=qkv_bias,
                count=n,
            ),  # fmt: skip
            _linear(lp + "self_attention.dense", heads * kvc, h, bias=lin_bias, count=n),
        ],
        mlp=[
            _linear(lp + "mlp.dense_h_to_4h", h, 2 * ffn, bias=lin_bias, count=n),
            _linear(lp + "mlp.dense_4h_to_h", ffn, h, bias=lin_bias, count=n),
        ],
        norms=[_norm(lp + "input_layernorm", h, count=n), _norm(lp + "post_attention_layernorm", h, count=n)],
        extra=[],
        final_norm=_norm("transformer.encoder.final_layernorm", h),
        head_path="transformer.output_layer",
    )


def _llava_next(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """LLaVA-NeXT (LLaVA-1.6) as `LlavaNextForConditionalGeneration` builds it in transformers 5.

    = text model (`model.language_model.*` + `lm_head`) + CLIP vision tower (`CLIPVisionModel`: class
    embedding, bias-free patch conv, (image/patch)^2+1 position embeddings, pre- and post-LayerNorm,
    *all* `num_hidden_layers` layers even though `vision_feature_layer=-2` reads the second-to-last)
    + projector (`linear_1`: vision_hidden*len(feature layers) -> text_hidden, GELU, `linear_2`, both
    with bias) + `image_newline` (text_hidden), a loose parameter on `model`.
    """
    text_raw = cfg.data.get("text_config") or {}
    text_type = text_raw.get("model_type", "llama") if isinstance(text_raw, Mapping) else "llama"
    text = cfg.sub("text_config", {"model_type": "llama", **_TEXT_DEFAULTS.get(text_type, {})})
    if text.str_("model_type") not in ("llama", "mistral", "qwen2", "gemma2"):
        raise PlanError(
            f"{cfg.source}: llava_next with text model_type '{text.str_('model_type')}' is not supported",
            hint="supported text models: llama, mistral, qwen2, gemma2",
        )
    vis_raw = cfg.data.get("vision_config") or {}
    vis_type = vis_raw.get("model_type", "clip_vision_model") if isinstance(vis_raw, Mapping) else ""
    if vis_type != "clip_vision_model":
        raise PlanError(
            f"{cfg.source}: llava_next with vision model_type '{vis_type}' is not supported",
            hint="supported vision towers: clip_vision_model",
        )
    vis = cfg.sub("vision_config", _LLAVA_NEXT_VISION_DEFAULTS)
    # The top-level tie flag governs LlavaNextForConditionalGeneration's lm_head.
    text_data = dict(text.data)
    text_data["tie_word_embeddings"] = cfg.bool_("tie_word_embeddings", False)
    text = _Cfg(text_data, cfg.source, prefix="text_config.")
    mods, shape = _dense_decoder(text, prefix="model.language_model.")

    v_hidden = vis.int_("hidden_size")
    v_inter = vis.int_("intermediate_size")
    v_layers = vis.int_("num_hidden_layers")
    patch = vis.int_("patch_size")
    image = vis.int_("image_size")
    channels = vis.int_("num_channels", 3)
    positions = (image // patch) ** 2 + 1
    vp = "model.vision_tower."
    mods += [
        ModuleShape(vp + "embeddings", PARAMS, v_hidden, 1, VISION),  # class_embedding
        ModuleShape(vp + "embeddings.patch_embedding", CONV, channels * patch * patch * v_hidden, 1, VISION),
        ModuleShape(vp + "embeddings.position_embedding", EMBEDDING, positions * v_hidden, 1, VISION),
        _norm(vp + "pre_layrnorm", v_hidden, component=VISION, bias=True),
    ]
    mods += _vit_layers(vp + "encoder.layers.{i}.", v_hidden, v_inter, v_layers)
    mods.append(_norm(vp + "post_layernorm", v_hidden, component=VISION, bias=True))

    feature_layer = cfg.data.get("vision_feature_layer", -2)
    n_feature = len(feature_layer) if isinstance(feature_layer, list) else 1
    proj_bias = cfg.bool_("multimodal_projector_bias", True)
    t_hidden = shape.hidden_size
    mods += [
        _linear(
            "model.multi_modal_projector.linear_1",
            v_hidden * n_feature,
            t_hidden,
            bias=proj_bias,
            component=PROJECTOR,
        ),
        _linear(
            "model.multi_modal_projector.linear_2", t_hidden, t_hidden, bias=proj_bias, component=PROJECTOR
        ),
        ModuleShape("model", PARAMS, t_hidden, 1, PROJECTOR),  # image_newline
    ]
    shape = _Shape(**{**shape.__dict__, "vision_num_layers": v_layers, "vision_hidden_size": v_hidden})
    return mods, shape


def _minicpmv(cfg: _Cfg) -> tuple[list[ModuleShape], _Shape]:
    """MiniCPM-Llama3-V 2.5 (`model_type: minicpmv`): ANALYTIC ONLY, the model is remote code.

    Assumptions, from the repo's `modeling_minicpmv.py` and `resampler.py` (version 2.5):
    * `llm = LlamaForCausalLM(config)`: the top-level fields are a Llama-3-8B config.
    * `vpm = Idefics2VisionTransformer(vision_config)` (SigLIP-so400m): patch conv *with* bias,
      (image_size/patch)^2 position embeddings (no class token; 980/14 -> 4900), layers with biased
      q/k/v/out_proj and fc1/fc2, post_layernorm; `drop_vision_last_layer` removes one layer.
    * `resampler = Resampler(num_queries=query_num, embed_dim=hidden, num_heads=hidden//128,
      kv_dim=vision hidden)`: `query` (Q x E) and `proj` (E x E) loose parameters, `kv_proj`
      (kv_dim -> E, no bias, only when kv_dim != E), `nn.MultiheadAttention` (in_proj 3E x E + 3E,
      out_proj E x E + E), LayerNorms `ln_q`, `ln_kv`, `ln_post`. The 2-D sin-cos position table is a
      non-persistent buffer, not a parameter.
    Module paths follow the remote code (`llm.model.*`, `vpm.*`, `resampler.*`). Other MiniCPM-V
    versions (2.0 uses SigLIP-400M + MiniCPM-2B, 2.6 uses Qwen2-7B) are not covered by this formula.
    """
    version = str(cfg.data.get("version", "2.5"))
    if version not in ("2.5",):
        raise PlanError(
            f"{cfg.source}: MiniCPM-V version {version} is not supported by the analytic counter (only 2.5)",
            hint="use the catalog entry minicpm-llama3-v-2.5, or a model whose architecture transformers knows",
        )
    llm_data = dict(cfg.data)
    llm_data["model_type"] = "llama"
    mods, shape = _dense_decoder(_Cfg(llm_data, cfg.source), prefix="llm.model.")
    mods = [
        ModuleShape(
            "llm.lm_head",
            m.kind,
            m.numel,
            m.count,
            m.component,
            m.in_features,
            m.out_features,
            m.bias,
            m.tied_to,
        )
        if m.path == "lm_head"
        else m
        for m in mods
    ]
    vis = cfg.sub("vision_config")
    v_hidden = vis.int_("hidden_size")
    v_inter = vis.int_("intermediate_size")
    v_layers = vis.int_("num_hidden_layers") - (1 if cfg.bool_("drop_vision_last_layer", False) else 0)
    patch = vis.int_("patch_size")
    image = vis.int_("image_size")
    channels = vis.int_("num_channels", 3)
    mods += [
        ModuleShape(
            "vpm.embeddings.patch_embedding", CONV, channels * patch * patch * v_hidden + v_hidden, 1, VISION
        ),
        ModuleShape(
            "vpm.embeddings.position_embedding", EMBEDDING, (image // patch) ** 2 * v_hidden, 1, VISION
        ),
    ]
    mods += _vit_layers("vpm.encoder.layers.{i}.", v_hidden, v_inter, v_layers)
    mods.append(_norm("vpm.post_layernorm", v_hidden, component=VISION, bias=True))

    embed = shape.hidden_size
    queries = cfg.int_("query_num")
    mods.append(
        ModuleShape("resampler", PARAMS, queries * embed + embed * embed, 1, PROJECTOR)
    )  # query, proj
    if v_hidden != embed:
        mods.append(_linear("resampler.kv_proj", v_hidden, embed, component=PROJECTOR))
    mods += [
        ModuleShape("resampler.attn", PARAMS, 3 * embed * embed + 3 * embed, 1, PROJECTOR),  # in_proj
        _linear("resampler.attn.out_proj", embed, embed, bias=True, component=PROJECTOR),
    ]
    mods += [
        _norm(f"resampler.{n}", embed, component=PROJECTOR, bias=True) for n in ("ln_q", "ln_kv", "ln_post")
    ]
    shape = _Shape(**{**shape.__dict__, "vision_num_layers": v_layers, "vision_hidden_size": v_hidden})
    return mods, shape


_GENERIC = "(generic)"
"""Builder key of the generic Llama-style decoder used for model types without their own builder."""

_BUILDERS = {
    "llama": _dense_decoder,
    "mistral": _dense_decoder,
    "qwen2": _dense_decoder,
    "qwen3": _dense_decoder,
    "gemma": _dense_decoder,
    "gemma2": _dense_decoder,
    "gemma3_text": _dense_decoder,
    "phi3": _dense_decoder,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bloom": _bloom,
    "opt": _opt,
    "qwen": _qwen_v1,
    "internlm2": _internlm2,
    "baichuan": _baichuan,
    "chatglm": _chatglm,
    "llava_next": _llava_next,
    "minicpmv": _minicpmv,
}

_GENERIC_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
"""A config with these keys and no MoE keys can be counted as a Llama-style decoder."""
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")

_TESTED_AGAINST_META = "analytic (equal to the transformers 5.23 meta-device build, tested)"

_REMOTE = "analytic only (remote code, never run: module shapes from the published modeling file)"
_ANALYTIC_ONLY = {
    "qwen": _REMOTE.replace("the published", "Qwen/Qwen-7B modeling_qwen.py, the"),
    "internlm2": _REMOTE.replace("the published", "internlm/internlm2-chat-7b modeling_internlm2.py, the"),
    "baichuan": _REMOTE.replace("the published", "baichuan-inc/Baichuan2-7B-Base modeling_baichuan.py, the"),
    "chatglm": _REMOTE.replace("the published", "THUDM/chatglm3-6b modeling_chatglm.py, the"),
    "minicpmv": "analytic only (remote code, never run: Llama LLM + Idefics2/SigLIP vision checked against "
    "transformers on the meta device, resampler from the published resampler.py)",
}


_HEAD_NAMES = ("lm_head", "output", "output_layer")
"""The output layer's name: transformers, InternLM2 (`output`), ChatGLM (`transformer.output_layer`)."""


def is_output_layer(path: str) -> bool:
    """The model's output layer (what LoRA's "all-linear" and bitsandbytes leave alone)."""
    return "{i}" not in path and path.endswith(_HEAD_NAMES)


def _summarise(
    mods: Sequence[ModuleShape], shape: _Shape, layer_sizes: tuple[int, int] | None = None
) -> ParamCounts:
    """Fold module shapes into ParamCounts (the invariant total == sum of parts is tested).

    `layer_sizes` = (dense, MoE) parameters per layer, measured by the caller (the meta-device build, whose
    layers need not follow the builders' naming); then text parameters outside the layers that are neither
    embeddings nor the head count with the final norm, and so do the few left over when layers of one kind
    differ in size (the per-layer figures are then the floor of the mean)."""
    total = sum(m.total for m in mods)
    text_mods = [m for m in mods if m.component == TEXT]
    outside = [m for m in text_mods if "{i}" not in m.path]
    embedding = sum(m.total for m in outside if m.kind == EMBEDDING)  # token (and learned position) tables
    lm_head = sum(m.total for m in outside if m.kind == LINEAR and m.path.endswith(_HEAD_NAMES))
    final_norm = sum(m.total for m in outside if m.kind == NORM)
    layer_total = sum(m.total for m in text_mods if "{i}" in m.path)
    vision = sum(m.total for m in mods if m.component == VISION)
    projector = sum(m.total for m in mods if m.component == PROJECTOR)
    if layer_sizes is not None:
        dense_layer, moe_layer = layer_sizes
        final_norm = total - embedding - lm_head - vision - projector
        final_norm -= dense_layer * shape.num_dense_layers + moe_layer * shape.num_moe_layers
        return _counts(
            mods, shape, total, embedding, lm_head, final_norm, vision, projector, dense_layer, moe_layer
        )

    def is_moe_mlp(path: str) -> bool:
        return (
            path.endswith((".mlp.gate", ".mlp.experts", ".mlp.shared_expert_gate"))
            or ".mlp.shared_experts." in path
            or ".mlp.shared_expert." in path
        )

    def is_dense_mlp(path: str) -> bool:
        return path.endswith((".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj")) and not is_moe_mlp(path)

    if shape.num_moe_layers and shape.num_dense_layers:
        # Attention and norms are in every layer; dense MLPs only in the dense ones.
        per_layer = [m for m in text_mods if "{i}" in m.path]
        common = sum(m.numel for m in per_layer if not is_moe_mlp(m.path) and not is_dense_mlp(m.path))
        dense_mlp = sum(m.numel for m in per_layer if is_dense_mlp(m.path))
        moe_mlp = sum(m.numel for m in per_layer if is_moe_mlp(m.path))
        dense_layer, moe_layer = common + dense_mlp, common + moe_mlp
    elif shape.num_moe_layers:
        dense_layer, moe_layer = 0, layer_total // shape.num_moe_layers
    else:
        dense_layer, moe_layer = layer_total // shape.num_dense_layers, 0
    if dense_layer * shape.num_dense_layers + moe_layer * shape.num_moe_layers != layer_total:
        raise AssertionError("per-layer counts do not add up")  # a bug in a builder, not user input
    return _counts(
        mods, shape, total, embedding, lm_head, final_norm, vision, projector, dense_layer, moe_layer
    )


def _counts(
    mods: Sequence[ModuleShape],
    shape: _Shape,
    total: int,
    embedding: int,
    lm_head: int,
    final_norm: int,
    vision: int,
    projector: int,
    dense_layer: int,
    moe_layer: int,
) -> ParamCounts:
    biggest = max(mods, key=lambda m: m.numel)
    linears = [m for m in mods if m.kind == LINEAR]
    biggest_linear = max(linears, key=lambda m: m.in_features * m.out_features)
    unused_experts = (
        shape.num_moe_layers * max(shape.num_experts - shape.experts_per_token, 0) * shape.per_expert
    )
    return ParamCounts(
        total=total,
        trainable=total,
        embedding=embedding,
        lm_head=lm_head,
        dense_layer=dense_layer,
        moe_layer=moe_layer,
        num_dense_layers=shape.num_dense_layers,
        num_moe_layers=shape.num_moe_layers,
        final_norm=final_norm,
        vision_tower=vision,
        projector=projector,
        largest_module_numel=biggest.numel,
        largest_module_name=biggest.path,
        largest_linear_in=biggest_linear.in_features,
        largest_linear_out=biggest_linear.out_features,
        largest_linear_name=biggest_linear.path,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        num_heads=shape.num_heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        tied_embeddings=shape.tied,
        is_moe=shape.num_moe_layers > 0,
        num_experts=shape.num_experts,
        experts_per_token=shape.experts_per_token,
        moe_intermediate_size=shape.moe_intermediate_size,
        active_per_token=total - unused_experts,
        is_multimodal=vision > 0,
        vision_num_layers=shape.vision_num_layers,
        vision_hidden_size=shape.vision_hidden_size,
    )
