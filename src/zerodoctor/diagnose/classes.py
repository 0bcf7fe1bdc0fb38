"""Failure classes: what happened, named from the log alone, when no knowledge-base entry explains it.

The knowledge base knows specific failures (a DeepSpeed release's bug, a config trap). Below it, this layer
always names the class of the run's first failure, with the log's own values:

  gpu-oom             CUDA out of memory: the numbers, the phase, the arithmetic of what was asked
  host-oom-kill       a rank killed by SIGKILL (exit -9 / 137) or the kernel/cgroup OOM killer
  collective-timeout  an NCCL watchdog timeout or a hang: which collective, which ranks, how long
  op-build-failure    a DeepSpeed/torch C++/CUDA extension that did not build or load
  import-error        a module or name that cannot be imported, a version requirement not met
  config-rejected     DeepSpeed, HF or accelerate refused a setting: which key
  library-assertion   an assertion inside DeepSpeed/transformers/accelerate/PEFT/TRL: file:line and versions
  crash               any other exception: its type, its last frame

Each message says what the log proves and what it does not. Nothing here invents a number: every value
shown is read from the log (or derived from values read from it, and then the arithmetic is shown).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from zerodoctor.diagnose import native_messages
from zerodoctor.diagnose.extract import (
    ARGPARSE_TYPE,
    CUT_TRACEBACK,
    FAILED_IMPORT,
    HANG_DUMP,
    NOT_FOUND_TYPE,
    PACKAGE_BUILD_TYPE,
    TOOLCHAIN_SAID,
    WAIT_FILES,
    WATCHDOG_WORK,
    Event,
    Facts,
    OomNumbers,
    Traceback,
    installing,
    same_exception,
)
from zerodoctor.diagnose.reader import LogLine, log_int
from zerodoctor.textutil import clip

PREFIX = "class:"

_KILLED = re.compile(
    r"Killed process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)(?:.*?anon-rss:(?P<rss>\d{1,15})kB)?"
)
_EXT = re.compile(
    r"Error building extension '(?P<op>[\w.-]{1,64})'|(?P<op2>\w{1,64})_op\b"
    # (op_builder/builder.py and all_ops.py hold the checks every op shares: their name is no op's)
    r"|op_builder/(?!(?:builder|all_ops|__init__)\.py)(?P<op3>\w{1,64})\.py"
)
_MODULE = re.compile(r"No module named '(?P<mod>[\w.]{1,128})'|cannot import name '(?P<name>\w{1,128})'")
# a shared library the dynamic loader could not open or resolve (dlopen's `libcudart.so.11.0: cannot open shared object
# file: No such file or directory`, `X.so: undefined symbol: _ZN...`), raised as OSError (ctypes) or ImportError
_SHARED_OBJECT = re.compile(
    r"(?P<lib>[\w.+-]{1,200}\.so(?:\.[\w.]{1,20})?): (?:cannot open shared object file|undefined symbol)"
)
# a version requirement refused, in the words of each checker: transformers' require_version
# (utils/versions.py _compare_versions: `accelerate>=0.26.0 is required for a normal functioning of this module, but
# found accelerate==0.21.0.`), importlib.metadata (`No package metadata was found for bitsandbytes`), setuptools'
# pkg_resources (`VersionConflict: (tokenizers 0.14.1 (/x), Requirement.parse('tokenizers<0.14,>=0.11.1'))`)
_REQUIRED_VERSION = re.compile(
    r"(?P<want>[A-Za-z0-9][\w.-]{0,80}(?:[<>=!~]=?[\w.*+-]{1,40},?){1,4}) is required for a normal functioning of"
    r" this module, but found (?P<found>[\w.-]{1,80}==[\w.+-]{1,40})"
    r"|No package metadata was found for (?P<pkg>[A-Za-z0-9][\w.-]{0,80})"
    r"|Requirement\.parse\('(?P<dist>[^']{1,120})'\)"
)
_QUOTED_KEY = re.compile(r"[`'\"](?P<key>[A-Za-z_][\w.]{1,80})[`'\"]")
_DS_VALIDATION = re.compile(r"validation errors? for deepspeed\w*config")
_CONFIG_CLASS = re.compile(r"validation errors? for (?P<cls>[A-Za-z_]\w{0,80})")
_LIBS = (
    "deepspeed",
    "transformers",
    "accelerate",
    "peft",
    "trl",
    "torch",
    "bitsandbytes",
    "xtuner",
    "llamafactory",
    # Megatron-LM / Megatron-DeepSpeed (megatron/data/gpt_dataset.py _build_index_mappings: `assert
    # last_epoch_num_samples < (num_samples_per_epoch + 1), 'last epoch number of samples exceeded max value.'`,
    # `<=` since; Megatron-LM#176) and vLLM (vllm/worker, vllm/executor asserts) raise their own assertions too
    "megatron",
    "vllm",
)
# what follows an environment's own directory (conda env, venv), never a package's
_ENV_DIRS = ("lib/python", "lib64/python", "bin/", "Lib/", "include/")
# a library's source file named in a message: `megatron/data/gpt_dataset.py:242`, `vllm/worker/worker.py`
_LIB_FILE = re.compile(rf"\b(?P<path>(?:{'|'.join(_LIBS)})/[\w/]{{1,200}}\.py)\b(?::(?P<line>\d{{1,7}}))?")
_BUILD_HINTS = (
    "error building extension",
    # torch/utils/cpp_extension.py: _write_ninja_file_and_compile_objects' error prefix (setup.py builds through
    # BuildExtension), and CUDA_MISMATCH_MESSAGE (_check_cuda_version)
    "error compiling objects for extension",
    "mismatches the version that was used to compile",
    # (its kernels' CUDA_CHECK_RETURN: `Error named symbol not found at line 74 in file .../csrc/ops.cu`, the binary
    # built for another CUDA than the one it runs on)
    "named symbol not found at line",
    # DeepSpeed's op builder refusing the toolchain before it compiles any op (op_builder/builder.py, the checks every
    # JIT-built op shares): `Installed CUDA version X does not match the version torch was compiled with Y, unable to
    # compile cuda/cpp extensions without a matching cuda version.` (a plain Exception in 0.3-0.5, CUDAMismatchException
    # with the `>- DeepSpeed Op Builder: ` prefix from 0.6 on), `CUDA_HOME does not exist, unable to compile CUDA op(s)`
    # (an assert in early releases, MissingCUDAException later)
    "unable to compile cuda/cpp extensions",
    "unable to compile cuda op(s)",
    "ninja",
    "nvcc",
    "cuda_home",
    "op_builder",
    "jit_load",
    "cpu_adam",
    "fused_adam",
)


def _build_var(op: str | None) -> str:
    """The install-time switch that pre-builds one op (op_builder: BUILD_VAR = "DS_BUILD_" + NAME.upper())."""
    return "DS_BUILD_" + re.sub(r"\W", "_", op).upper() if op else "DS_BUILD_OPS"


# pip's build directory of a package it installs from an sdist (pip/_internal/req/req_install.py ensure_build_location:
# TempDirectory(kind="install") -> `pip-install-XXXX`, then `{canonical name}_{uuid4 hex}`)
_PIP_BUILD_DIR = re.compile(r"pip-install-[^/\\]{1,40}[/\\]([A-Za-z0-9][\w.-]{0,80}?)_[0-9a-f]{32}[/\\]")
# DeepSpeed's launcher killing the other ranks after one failed (the failed rank's code may be cut from a paste)
_LAUNCHER_TEARDOWN = "sigkill_handler] Killing subprocess"
# Wording only DeepSpeed's assertions use (a pasted assertion line without its frames).
# (`'ds_numel': ` is a key of ZeRO-3's param.ds_summary(), the message of its parameter-status assertions)
_ASSERT_OWNER = re.compile(
    r"\bZeRO(?:-?\d| stage \d|-Offload)?\b|ZeroParamStatus|ds_status|DeepSpeed|'ds_numel': "
)
_CONFIG_FILES = (
    "deepspeed/runtime/config",
    "deepspeed/runtime/zero/config",
    "transformers/training_args.py",
    "transformers/integrations/deepspeed.py",
    "accelerate/utils/dataclasses.py",
    "accelerate/state.py",
    "accelerate/accelerator.py",
)
_CONFIG_HINTS = (
    "validation error for deepspeed",
    "extra inputs are not permitted",
    "extra fields not permitted",
    "deepspeedconfigerror",
    "please set",
    "is not supported",
    "must be",
    "mismatch",
)


# A negative exit code is the signal that ended the process (Python's subprocess and torchrun report -N).
_SIGNAL_NAMES = {
    4: "SIGILL: an instruction this CPU does not have",
    6: "SIGABRT: the process aborted itself, e.g. a C++ exception or a failed check in native code",
    7: "SIGBUS: a memory-mapped page could not be backed, often a full /dev/shm",
    8: "SIGFPE: an arithmetic fault in native code",
    11: "SIGSEGV: a segmentation fault in native code",
}
_SIGKILL_SENDERS = "sent by the kernel's OOM killer, a scheduler or a user"
_VERSION_WORD = re.compile(r"\bversions?\b")
_SETTING_WORDS = ("config", "argument", "option", "setting", "parameter", "flag", "plugin")

# Where the libraries users run judge a configuration: a ValueError / assertion raised in one of these places is a
# setting refused, and the frame that raised it is what judged it. Enumerated from the sources (the test
# tests/diagnose/test_config_sites.py walks every raise and assert of these files and functions at the installed
# versions - DeepSpeed 0.19.8, transformers 5.23.0, accelerate 1.15.0, PEFT 0.21.2 - and checks each is named so):
#  - whole files whose code is configuration checking: DeepSpeed's config parsing and its pydantic models
#    (deepspeed/runtime/config.py _batch_assertion / _set_batch_related_parameters / _do_error_check / get_*,
#    runtime/zero/config.py and zero/offload_config.py validators, runtime/config_utils.py), accelerate's plugins
#    (accelerate/utils/dataclasses.py: DeepSpeedPlugin, FSDP, TP, bnb __post_init__ / deepspeed_config_process),
#    TrainingArguments (transformers/training_args.py __post_init__ / _validate_args), PEFT's configs
#    (peft/config.py, peft/tuners/*/config.py, LoraConfig.__post_init__), TRL's (trl/trainer/*_config.py),
#    LLaMA-Factory's argument parsing (llamafactory/hparams/parser.py get_train_args and its _verify_model_args /
#    _check_extra_dependencies; hparams/*_args.py __post_init__; src/llmtuner/hparams before the rename)
_CONFIG_JUDGE_FILES = (
    "deepspeed/runtime/config.py",
    "deepspeed/runtime/zero/config.py",
    "deepspeed/runtime/zero/offload_config.py",
    "deepspeed/runtime/config_utils.py",
    "deepspeed/inference/config.py",
    "transformers/training_args.py",
    "accelerate/utils/dataclasses.py",
    "/hparams/",
    # HfArgumentParser (parse_args_into_dataclasses: `Some specified arguments are not used by the HfArgumentParser:
    # [...]`, parse_json_file / parse_yaml_file's unused keys)
    "transformers/hf_argparser.py",
)
#  - the functions of other files that check the configuration: DeepSpeedEngine's sanity checks and optimizer set-up
#    (deepspeed/runtime/engine.py _do_sanity_check, _do_args_sanity_check, _configure_with_arguments,
#    _configure_optimizer / _configure_basic_optimizer / _configure_zero_optimizer), transformers' DeepSpeed
#    integration (integrations/deepspeed.py HfTrainerDeepSpeedConfig.fill_match, trainer_config_process,
#    trainer_config_finalize - the "mismatch TrainingArguments values" list -, deepspeed_optim_sched - the
#    "optimizer but no scheduler" refusal of transformers 4.30 -, deepspeed_init), accelerate's
#    Accelerator._prepare_deepspeed, and any dataclass config's __post_init__ inside these libraries
_CONFIG_JUDGE_FUNCS = frozenset(
    {
        "_do_sanity_check",
        "_do_args_sanity_check",
        "_configure_with_arguments",
        "_configure_optimizer",
        "_configure_basic_optimizer",
        "_configure_zero_optimizer",
        "_batch_assertion",
        "_set_batch_related_parameters",
        "_do_error_check",
        "fill_match",
        "trainer_config_process",
        "trainer_config_finalize",
        "deepspeed_optim_sched",
        "deepspeed_init",
        "_prepare_deepspeed",
        "deepspeed_config_process",
        "_validate_args",
        "__post_init__",
        "get_train_args",
        "get_infer_args",
        "get_eval_args",
        "_verify_model_args",
        "_check_extra_dependencies",
    }
)
# (file, function) pairs: Accelerator.__init__ checks its own arguments (mixed_precision, kwargs_handlers, devices);
# PEFT checks a tuner config against the model while it injects the adapters (peft/tuners/tuners_utils.py at 0.21.2:
# BaseTuner.inject_adapter's NoMatchingPeftModuleError "Target modules X not found in the base model. Please check
# the target modules and try again." and its exclude_modules / target_parameters refusals, _prepare_adapter_config's
# "Please specify `target_modules` in `peft_config`", _inject_parameters, _check_lora_target_modules_mamba,
# _check_target_module_compatiblity); before BaseTuner (PEFT <= 0.4) each tuner's _find_and_replace raised the same
# ValueError (peft/tuners/lora.py, adalora.py, ia3.py at v0.4.0)
_CONFIG_JUDGE_SITES = frozenset(
    {
        ("accelerate/accelerator.py", "__init__"),
        ("peft/tuners/tuners_utils.py", "inject_adapter"),
        ("peft/tuners/tuners_utils.py", "_prepare_adapter_config"),
        ("peft/tuners/tuners_utils.py", "_inject_parameters"),
        ("peft/tuners/tuners_utils.py", "_check_lora_target_modules_mamba"),
        ("peft/tuners/tuners_utils.py", "_check_target_module_compatiblity"),
        # LoraModel's own checks (peft/tuners/lora/model.py at 0.21.2): `Target module X is not supported.
        # Currently, only the following modules are supported: torch.nn.Linear, ...` (a target of a type LoRA cannot
        # wrap, _create_new_module since PEFT 0.5), `Please specify target_modules or target_parameters`, adapters
        # whose configs cannot be combined
        ("peft/tuners/lora/model.py", "_create_new_module"),
        ("peft/tuners/lora/model.py", "_prepare_adapter_config"),
        ("peft/tuners/lora/model.py", "_check_new_adapter_config"),
        # transformers' Trainer checks the model and the arguments it is given before it builds anything (trainer.py
        # Trainer.__init__, ValueErrors: `Trainer requires either a model or model_init argument, but not both.`,
        # `Using --fsdp xxx together with --deepspeed is not possible`, a headless model that takes no labels - given
        # neither it raises a RuntimeError, not one of _CONFIG_EXC, so that one is not read as a refusal; 4.26-4.35:
        # `The model you want to train is loaded in 8-bit precision.  if you want to fine-tune an 8-bit model, please
        # make sure that you have installed bitsandbytes>=0.37.0`, `You cannot perform fine-tuning on purely quantized
        # models`)
        ("transformers/trainer.py", "__init__"),
        ("peft/tuners/lora.py", "_find_and_replace"),
        ("peft/tuners/adalora.py", "_find_and_replace"),
        ("peft/tuners/ia3.py", "_find_and_replace"),
    }
)
_CONFIG_JUDGE_LIBS = (
    "deepspeed/",
    "transformers/",
    "accelerate/",
    "peft/",
    "trl/",
    "llamafactory/",
    "llmtuner/",
)
# (what a configuration check raises; an AttributeError or RuntimeError there is a bug or a runtime failure)
# (PEFT's NoMatchingPeftModuleError is a ValueError: peft/tuners/tuners_utils.py)
_CONFIG_EXC = (
    "ValueError",
    "AssertionError",
    "TypeError",
    "NotImplementedError",
    "ConfigError",
    "Exception",
    "NoMatchingPeftModuleError",
)
# CPython's TypeError for a keyword the callee does not take (`Accelerator.__init__() got an unexpected keyword argument
# 'project_dir'`; Python/ceval.c, the qualified name from 3.10 on)
_UNEXPECTED_KWARG = re.compile(
    r"((?:[A-Za-z_][\w.]{0,120}\.)?[A-Za-z_]\w{0,80})\(\) got an unexpected keyword argument '(\w{1,80})'"
)
_BNB_SETUP = re.compile(r"CUDA Setup failed despite GPU being available")
# the libraries whose own ValueErrors refuse a user's settings (their raise statements read by library_messages)
_SETTINGS_JUDGES = frozenset({"transformers", "deepspeed", "accelerate", "peft", "trl"})
_FILE_RESOLVERS = (
    "from_pretrained",
    "from_config",
    "convert_to_tensors",
    "forward",
    "__call__",
    "pad",
    "encode",
    "decode",
    "tokenize",
)
# A message with no frames that names the configuration it refuses: the DeepSpeed config, TrainingArguments, a
# config class or file, a command-line flag
_NAMES_CONFIG = re.compile(
    r"(?i:\b(?:deepspeed|ds)[ _]config(?:uration)?\b|\bzero_optimization\b|\bconfig(?:uration)? file\b"
    r"|\baccelerate config\b|\bin (?:the|your) config\b|\btarget[_ ]modules?\b)|TrainingArguments|\b[A-Z]\w{1,40}(?:Config|Arguments)\b"
    r"|(?<![\w-])--[a-z][a-z0-9_]{2,60}\b"
    # TRL's GRPO/RLOO batch check names its settings in words (grpo_trainer.py __init__ at v0.15-v0.17, grpo_config.py
    # __post_init__ later: "The global|effective train batch size (...) must be evenly divisible by the number of
    # generations per prompt (G)"), often pasted as that one line
    r"|\bnumber of generations per prompt\b"
    # (and its config's other checks on the generations: `GRPO requires at least 2 generations per prompt`, `The
    # global eval batch size (A * B) must be divisible by the number of generations used for evaluation (G)`)
    r"|\bgenerations per prompt\b|\bnumber of generations used for evaluation\b"
)
# A refusal of a setting in a configuration check's own words (the raise sites above share them): with a setting's
# name beside it (snake_case, `quoted`, key=value, a ZeRO stage), a frameless exception line is a config refusal
_REFUSAL = re.compile(
    r"(?i:\bmust be\b|\bis not supported\b|\bnot supported (?:with|for|on|by|yet)\b|\bonly supported\b|\bsupported only\b|\brequires\b"
    r"|\bhas to be\b|\bcannot be (?:used|set|both|combined|enabled)\b|\bcan't be both\b|\bshould be\b"
    r"|\bneeds? to be (?:provided|set|specified)\b|\binvalid\b|\bplease (?:set|use|adjust|configure|switch|pass"
    r"|disable|enable|specify|provide|correct)\b|\bis only available\b|\bnot (?:yet )?implemented\b"
    r"|\bare not compatible\b|\bis not compatible\b|\bis incompatible\b|\bmismatch"
    # (TrainingArguments.__post_init__: `Your setup doesn't support bf16/gpu.`; Trainer.__init__: `Either set
    # `args.eval_strategy` to `no` or pass an `eval_dataset`.`)
    r"|\b(?:doesn't|does not|don't|do not) support\b|\beither set\b"
    # (TRL's trainers' constructors and configs, trl/trainer/*_trainer.py __init__ and *_config.py __post_init__ at
    # v1.9.0, swept whole: `` `train_dataset` is required``, `` `model` and `ref_model` cannot be the same object``,
    # `` `loss_weights` must have the same length as `loss_type` ``, `Number of reward weights (N) must match number of
    # reward functions (M)`, `'generation_batch_size' and 'steps_per_generation' can not be both configured`, `You
    # passed `sync_ref_model=True` while using a PEFT model, which is currently not supported`, `You cannot use
    # `sync_ref_model=True` together with ...`, `log_completions_hub_repo is set, but log_completions is False`,
    # `Unknown importance sampling level: X. Possible values are 'token' and 'sequence'.`)
    r"|\bis required\b|\bcannot be the same\b|\bcan ?not be both\b|\bmust (?:have|match|define)\b"
    r"|\bnot (?:currently |yet )?supported\b|\b(?:doesn't|does not|don't|do not) (?:currently |yet )support\b"
    r"|\byou (?:cannot|can't|can not) (?:use|set|pass|train)\b|\byou passed\b.{0,120}\b(?:together with|while|but)\b"
    r"|\bis set, but\b|\bpossible values are\b"
    # (and the same sweep over TrainingArguments, accelerate's dataclasses and Accelerator, PEFT's tuners at the installed
    # versions: `At most one of fp16 and bf16 can be True, but not both`, `Can only use `downcast_bf16` when using
    # `mixed_precision='bf16'` ...`, `You can only pass one of `gradient_accumulation_steps` and ...`, `When
    # `layers_pattern` is specified, `layers_to_transform` must also be specified.`, `Supported values are ...`)
    r"|\bbut not both\b|\bcan only (?:use|pass|specify|be used)\b|\bmust also be\b|\bsupported values are\b)"
)
_SETTING_NAME = re.compile(
    r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b|`[^`\s]{2,60}`|\b[A-Za-z_]\w*=\S|(?i:\bZeRO(?:[- ]?stage)?[- ]?\d\b)"
    r"|\b(?:fp16|bf16|fp32|fp8)\b"
)
_KEY_VALUE = re.compile(
    r"[`'\"](?P<key>[A-Za-z_][\w.]{1,80})(?:=[^`'\"\s]{0,40})?[`'\"]|(?<![\w-])--(?P<flag>[a-z][a-z0-9_]{2,60})\b"
    r"|\b(?P<kv>[a-z][a-z0-9_]*_[a-z0-9_.]{1,60})=\S"
)


def _config_judge(tb: Traceback | None) -> str | None:
    """The frame that judged a configuration, as `lib/path.py:line in func`, when the innermost frame is one of
    the libraries' configuration checks (a file that only checks settings, or a checking function in one)."""
    if tb is None or not tb.frames:
        return None
    fr = tb.frames[-1]
    path = fr.file.replace("\\", "/")
    lib = next((m for m in _CONFIG_JUDGE_LIBS if f"/{m}" in path or path.startswith(m)), None)
    if lib is None:
        return None
    judged = (
        any(f in path for f in _CONFIG_JUDGE_FILES)
        or fr.func in _CONFIG_JUDGE_FUNCS
        or any(path.endswith(f) and fr.func == fn for f, fn in _CONFIG_JUDGE_SITES)
        # PEFT's and TRL's config modules (peft/tuners/lora/config.py, trl/trainer/sft_config.py)
        or (lib in ("peft/", "trl/") and path.endswith("config.py"))
        # a TRL trainer's constructor checks its arguments against the config and the world size before it builds
        # anything (trl/trainer/grpo_trainer.py GRPOTrainer.__init__ at v0.15.0-v0.17.0: "The global train batch size
        # (P x B) must be evenly divisible by the number of generations per prompt (G)", the eval twin, reward
        # weights / processing classes that must match the reward functions, `model_init_kwargs` with a built model;
        # rloo_trainer.py "`policy` and `ref_policy` cannot be the same object"); later versions moved the batch
        # check into grpo_config.py __post_init__, a config module above
        or (lib == "trl/" and path.endswith("_trainer.py") and fr.func == "__init__")
    )
    if not judged:
        return None
    return f"{lib}{path.split('/' + lib, 1)[-1]}:{fr.lineno} in {fr.func}"


@dataclass(frozen=True)
class FailureClass:
    """The class of a failure, its title and message built from the log's values, and the values."""

    name: str
    title: str
    proves: str
    does_not_prove: str
    next_step: str
    data: Mapping[str, Any]
    severity: str = "error"  # "warning" for a run stopped from outside (a signal, a time limit)

    @property
    def id(self) -> str:
        return PREFIX + self.name

    def message(self) -> str:
        return (
            f"The log proves: {self.proves} It does not prove: {self.does_not_prove} Next: {self.next_step}"
        )


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f} GiB"


def _where(ev: Event) -> str:
    return f"{ev.who()} ({ev.line.location()})"


def _phase(ev: Event) -> str:
    return ev.phase.replace("_", " ") if ev.phase != "unknown" else "an unknown phase"


# The accelerator a device OOM names in its own words (extract.DEVICE_OOM): Ascend's torch_npu allocator and CANN's
# error codes / driver reason, Intel's XPU allocator, Apple's MPS backend; every other form is a GPU's (CUDA, ROCm)
_NPU_OOM = re.compile(
    r"NPU out of memory|\bE(?:L0004|L0019|I0011|N0012)\b|driver error:out of memory|\d{3}\.\d{3} Failed to allocate"
)


def _device(ev: Event) -> str:
    if _NPU_OOM.search(ev.detail):
        return "NPU"
    if "XPU out of memory" in ev.detail:
        return "XPU"
    return "MPS" if "MPS backend out of memory" in ev.detail else "GPU"


def _lib_frame(tb: Traceback | None) -> tuple[str, int, str] | None:
    """The innermost frame inside a known library: (path from the library's package dir, line, function)."""
    if tb is None:
        return None
    for fr in reversed(tb.frames):
        path = fr.file.replace("\\", "/")
        for lib in _LIBS:
            marker = f"/{lib}/"
            if marker in path:
                # (a conda env or venv named after the library - `/envs/vllm/lib/python3.11/contextlib.py`,
                # `/envs/deepspeed/lib/python3.9/site-packages/deepspeed/x.py` - is no package dir of it)
                parts = path.split(marker)
                for i in range(1, len(parts)):
                    rest = marker.join(parts[i:])
                    if not rest.startswith(_ENV_DIRS):
                        # (a source checkout holds the package one level down: `/x/trl/trl/trainer/grpo_trainer.py`)
                        rest = rest[len(lib) + 1 :] if rest.startswith(f"{lib}/") else rest
                        return lib + "/" + rest, fr.lineno, fr.func
    return None


_INSTALLED = re.compile(r"/(?:site|dist)-packages/(?P<rest>(?P<pkg>[A-Za-z_][\w.-]*?)(?:\.py\b|/).*)")


def _installed_frame(tb: Traceback) -> tuple[str, int, str] | None:
    """The innermost frame, when it is inside an installed package: (path from site-packages, line, function)."""
    fr = tb.frames[-1]
    m = _INSTALLED.search(fr.file.replace("\\", "/"))
    return (m.group("rest"), fr.lineno, fr.func) if m else None


# The Python standard library as a frame's path shows it: `/usr/lib/python3.10/x.py`, a venv or conda env's
# `lib/python3.11/`, Windows' `\Lib\`, a frozen module (`<frozen runpy>`), `<string>`; an installed package is under
# site-packages / dist-packages inside it
_STDLIB = re.compile(r"/lib(?:64)?/python\d[\d.]*/|/Lib/|^<[^>]*>$")
_PACKAGES = ("/site-packages/", "/dist-packages/")


def _user_frame(tb: Traceback | None) -> tuple[str, int, str] | None:
    """The innermost frame, when it is the user's own code: a file outside site-packages / dist-packages, outside the
    Python standard library and outside a known library's checkout - (path as printed, line, function)."""
    if tb is None or not tb.frames:
        return None
    fr = tb.frames[-1]
    if any((f.file, f.lineno, f.func) == (fr.file, fr.lineno, fr.func) for f in tb.frames[:-1]):
        return None  # (the same frame again: ranks' tracebacks interleaved, the last row another rank's outer frame)
    path = fr.file.replace("\\", "/")
    if any(p in path for p in _PACKAGES) or _STDLIB.search(path) or not path.endswith(".py"):
        return None
    if _lib_frame(Traceback(tb.source, tb.rank, tb.start, [fr])) is not None:
        return None  # (a library's source checkout: `/x/transformers/src/transformers/trainer.py`)
    return fr.file, fr.lineno, fr.func


def _last_frame(tb: Traceback | None) -> str | None:
    if tb is None or not tb.frames:
        return None
    fr = tb.frames[-1]
    return f"{fr.file}:{fr.lineno} in {fr.func}"


_PHASE_OOM_HINT = {
    "tokenization": "the dataset was being tokenized/mapped (worker processes each hold a copy of their shard)",
    "resume": "a checkpoint was being read back (optimizer and ZeRO states are loaded on top of the model)",
    "load": "the model was being loaded: each rank materialised weights on its GPU (no ZeRO-3 partitioning at "
    "load, a device_map, or inference/predict without ZeRO-3 loads the whole model on every GPU)",
    "zero_init": "parameters were being created inside zero.Init",
    "engine_init": "deepspeed.initialize was building the engine and its optimizer buffers",
    "first_optimizer_step": "the first optimizer step creates the optimizer states (Adam: 8 bytes per "
    "trainable parameter in fp32) on top of what training already held",
    "training_step": "a training step (forward/backward activations, gradients, gathered ZeRO-3 parameters)",
    "evaluation": "evaluation (eval batch size, generation, or gathered parameters outside the training loop)",
    "checkpoint_save": "a checkpoint save (16-bit weight consolidation gathers full tensors)",
    "epoch_end": "the end of an epoch (often evaluation or a save)",
}


def _gpu_oom(ev: Event, oom: OomNumbers | None) -> FailureClass:
    data: dict[str, Any] = {"rank": ev.rank, "phase": ev.phase, "line": ev.line.location()}
    if oom is not None:
        data.update(oom.to_dict())
        gpu = f"GPU {oom.gpu}" if oom.gpu is not None else "a GPU"
        parts = [f"{_where(ev)} ran out of memory on {gpu} during {_phase(ev)}."]
        if oom.tried is not None:
            ask = f"It asked for {_g(oom.tried)}"
            if oom.free is not None:
                short = oom.tried - oom.free
                ask += f" with {_g(oom.free)} free ({_g(oom.tried)} - {_g(oom.free)} = {_g(short)} short)"
            if oom.total is not None:
                ask += f" on a {_g(oom.total)} device"
            parts.append(ask + ".")
        if oom.allocated is not None:
            held = f"PyTorch had {_g(oom.allocated)} allocated"
            if oom.reserved_unallocated is not None:
                held += f" and {_g(oom.reserved_unallocated)} reserved but unallocated"
            parts.append(held + ".")
            if oom.in_use is not None:
                other = oom.in_use - oom.allocated - (oom.reserved_unallocated or 0.0)
                if other > 0.05:
                    parts.append(
                        f"The process used {_g(oom.in_use)} in all: {_g(other)} outside PyTorch's allocator "
                        f"({_g(oom.in_use)} - {_g(oom.allocated)} - {_g(oom.reserved_unallocated)}; CUDA "
                        "context, NCCL buffers, other libraries)."
                    )
        if oom.verdict == "fragmentation":
            parts.append("Reserved-but-unallocated memory exceeds the request: the allocator is fragmented.")
        elif oom.verdict == "lack":
            parts.append(
                "Reserved-but-unallocated memory is smaller than the request: the memory was really used."
            )
        proves = " ".join(parts)
    else:
        proves = (
            f"{_where(ev)} ran out of {_device(ev)} memory during {_phase(ev)} (the message gives no sizes)."
        )
    hint = _PHASE_OOM_HINT.get(ev.phase)
    if hint:
        proves += f" At that point {hint}."
    return FailureClass(
        "gpu-oom",
        f"{_device(ev)} out of memory" + (f" during {_phase(ev)}" if ev.phase != "unknown" else ""),
        proves,
        "which tensors filled the GPU, nor the peak of the rest of the step (this one allocation failing is a "
        "lower bound of what was missing); other ranks may have been close too.",
        "compare the per-GPU plan for this phase (`zerodoctor plan`) with the device size; reduce what lives on "
        "the GPU (micro-batch, sequence length, ZeRO stage/offload, gradient checkpointing) or add GPUs; with "
        "fragmentation set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        data,
    )


def _host_oom(ev: Event, facts: Facts) -> FailureClass:
    data: dict[str, Any] = {
        "rank": ev.rank,
        "phase": ev.phase,
        "line": ev.line.location(),
        "exit_code": ev.exit_code,
    }
    kernel = [e for e in facts.events if e.kind == "host-oom"]
    parts: list[str] = []
    if ev.kind == "host-oom":
        parts.append(
            f"The kernel (or the cgroup/scheduler) OOM killer killed a process at {ev.line.location()}"
        )
    else:
        sig = "SIGKILL" if ev.exit_code in (-9, 9, 137) else f"exit code {ev.exit_code}"
        parts.append(f"{_where(ev)} was killed ({sig}) during {_phase(ev)}")
    m = next((_KILLED.search(e.line.text) for e in kernel if _KILLED.search(e.line.text)), None)
    if m is not None:
        data["killed_pid"] = int(m.group("pid"))
        rss = m.group("rss")
        if rss:
            gib = int(rss) / 1024**2
            data["anon_rss_gib"] = round(gib, 2)
            parts.append(
                f"; the OOM killer's line names pid {m.group('pid')} ({m.group('name')}) with "
                f"anon-rss {rss} kB = {gib:.1f} GiB of host RAM"
            )
    proves = "".join(parts) + "."
    if ev.kind != "host-oom":
        proves += f" Phase: {_phase(ev)}; there is no Python traceback for that rank, as with any SIGKILL."
    if kernel:
        not_proved = (
            "which allocation pushed the host over (model copies per rank, offloaded optimizer state, "
            "pinned buffers, dataloader workers), nor how much RAM the node has."
        )
    else:
        not_proved = (
            "that memory was the reason: no kernel or scheduler OOM line is in these logs; the OOM killer "
            "is the usual sender of SIGKILL, but a scheduler limit, a preemption or a user can send it too."
        )
    return FailureClass(
        "host-oom-kill",
        "A rank was killed by SIGKILL (host out of memory)"
        if not kernel
        else "Host out of memory: OOM killer",
        proves,
        not_proved,
        "check `dmesg -T | grep -i -E 'out of memory|oom'` on the node at that time, and compare host RAM per node "
        "with `zerodoctor plan` for this phase (offload, ranks per node, pinned memory).",
        data,
    )


# Host RAM refused an allocation inside the process (no kill): torch's CPU allocator (c10/core/impl/alloc_cpu.cpp
# alloc_cpu, torch 1.x-2.x: on Linux's posix_memalign path `[enforce fail at alloc_cpu.cpp:117] err == 0.
# DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)`,
# on the other paths - Windows, Android, mimalloc - `DefaultCPUAllocator: not enough memory: you tried to allocate N
# bytes.`), Python's MemoryError and numpy's _ArrayMemoryError (`Unable to allocate 3.20 GiB for an array with shape`)
_HOST_ALLOC = re.compile(
    r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory): you tried to allocate (?P<bytes>\d{1,20}) bytes"
    # (ENOMEM as the OS reports it: `OSError: [Errno 12] Cannot allocate memory` - fork of a DataLoader worker,
    # mmap -, torch's shared-memory files, aten/src/ATen/MapAllocator.cpp: `unable to mmap N bytes from file
    # </torch_...>: Cannot allocate memory (12)`)
    r"|unable to mmap (?P<mmap>\d{1,20}) bytes from file <[^>]{0,200}>: Cannot allocate memory \(12\)"
    r"|\[Errno 12\] Cannot allocate memory"
    r"|Unable to allocate (?P<size>[\d.]{1,12}) (?P<unit>[KMGT]iB) for an array"
)
_UNIT_GIB = {"KiB": 1 / 1024**2, "MiB": 1 / 1024, "GiB": 1.0, "TiB": 1024.0}


def _host_alloc_failed(ev: Event) -> FailureClass | None:
    """A host allocation that failed inside the process (ENOMEM), not a kill: the same shortage of host RAM."""
    m = _HOST_ALLOC.search(ev.detail)
    exc = ev.detail.split(":", 1)[0].rsplit(".", 1)[-1].strip()
    if m is None and exc not in ("MemoryError", "_ArrayMemoryError"):
        return None
    data: dict[str, Any] = {"rank": ev.rank, "phase": ev.phase, "line": ev.line.location(), "exit_code": None}
    ask = ""
    if m is not None:
        size = m.group("bytes") or m.group("mmap")
        gib = (
            int(size) / 1024**3
            if size
            else float(m.group("size")) * _UNIT_GIB[m.group("unit")]
            if m.group("size")
            else None
        )
        if gib is not None:
            data["tried_gib"] = round(gib, 2)
            ask = f" It asked for {f'{gib:.2f} GiB' if gib >= 0.1 else f'{gib * 1024:.1f} MiB'} of host RAM."
    return FailureClass(
        "host-oom-kill",
        "Host out of memory: an allocation in host RAM failed"
        + (f" during {_phase(ev)}" if ev.phase != "unknown" else ""),
        f"{_where(ev)} could not allocate host memory during {_phase(ev)}: {clip(ev.detail, 200).rstrip('. ')}.{ask} "
        "The process was refused memory (ENOMEM) rather than killed, so it printed its own error.",
        "what else held the host's RAM (other ranks' copies of the model, offloaded optimizer state, pinned buffers, "
        "dataloader workers), nor how much RAM the node or container has.",
        "compare host RAM per node with `zerodoctor plan` for this phase (offload, ranks per node); check the "
        "container's memory limit and `ulimit -v`.",
        data,
    )


# Phases in which every rank reads a model or a checkpoint's states into host RAM at once: HF from_pretrained
# materialises each shard on the CPU per process (modeling_utils.py load_state_dict), DeepSpeed's load_checkpoint
# torch.loads the ZeRO optimizer partitions on the CPU (runtime/engine.py _get_all_zero_checkpoint_state_dicts).
_HOST_LOAD_PHASES = frozenset({"load", "resume"})


def _silent_death_while_loading(ev: Event) -> FailureClass:
    """DeepSpeed's launcher tore the job down (a rank exited non-zero: launcher/launch.py sigkill_handler) while
    the ranks were loading, and no rank printed a Python error: a process that Python could not let print is
    one killed by a signal, and the signal the kernel sends when host RAM runs out at a load peak is SIGKILL."""
    return FailureClass(
        "host-oom-kill",
        f"A rank died without a trace during {_phase(ev)} (most likely killed for host memory)",
        f"DeepSpeed's launcher killed the other ranks at {ev.line.location()} because a rank exited during "
        f"{_phase(ev)}, and no rank printed a Python traceback or error: the rank was ended by a signal, not by an "
        "exception. While every rank reads model shards or ZeRO states into host RAM, that signal is most often "
        "the kernel OOM killer's SIGKILL.",
        "the signal or the exit code (the launcher's `exits with return code = N` line is not in these logs), nor "
        "that memory was the reason: a scheduler limit or a segfault in a C extension also ends a process "
        "without a traceback.",
        "check `dmesg -T | grep -i -E 'out of memory|oom'` on the node and the launcher's `exits with return code` "
        "line (-9 is SIGKILL); load with fewer ranks per node at once, or compare host RAM with `zerodoctor plan` "
        "for this phase.",
        {"rank": ev.rank, "phase": ev.phase, "line": ev.line.location(), "exit_code": None},
    )


_TIMEOUT = re.compile(r"(?i)timed? ?out|watchdog")
# NCCL's wrappers of the verbs and mlx5/ionic direct-verbs calls (src/misc/ibvwrap.cc IBV_PTR_CHECK_ERRNO /
# IBV_INT_CHECK_RET_ERRNO, mlx5dvwrap.cc: `WARN("Call to " name " failed with error %s", strerror(errno))`, returning
# ncclSystemError): the words after it are the call's errno - `Connection timed out` (ETIMEDOUT) from ibv_modify_qp is
# an InfiniBand/RoCE link that did not connect, a system error, not a collective that ran past NCCL's timeout
_NCCL_CALL_ERRNO = re.compile(r"Call to \w{1,60} failed with error [^\n]{0,80}")
_CHILD_KILLED = re.compile(r"TerminatedWorkerError|process \d{1,6} terminated with signal SIGKILL")
# (torch prints NCCL's result name on the line below its DistBackendError, `ncclUnhandledCudaError: Call to CUDA
# function failed.`; pastes cut at the line's start keep `UnhandledCudaError: ...`, a name no other library raises)
_NCCL_OWN = re.compile(
    r"(?i)ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclInvalidUsage|NCCL error"
    r"|^(?-i:UnhandledCudaError): "
)
# gloo's TCP transport losing its peer mid-collective (third_party/gloo/gloo/transport/tcp/pair.cc: `Connection closed
# by peer [ADDR]:PORT`, `Connection reset by peer`): the other process ended first
_GLOO_PEER = re.compile(r"gloo/transport/\S*\] (?:Connection (?:closed|reset) by peer|Read error)")
# ProcessGroupNCCL aborting the communicator after its watchdog's timeout, raised on the next collective (torch 1.x-2.x
# ProcessGroupNCCL.cpp: `NCCL communicator was aborted on rank R. Original reason for failure was: [Rank R] Watchdog
# caught collective operation timeout: WorkNCCL(...) ran for N milliseconds before timing out.`)
_ABORTED_TIMEOUT = "Watchdog caught collective operation timeout"


def _nccl_error(ev: Event, facts: Facts) -> FailureClass:
    """An NCCL error on a rank (not a timeout): a system call, the network (IB/RoCE, sockets), shared memory; or
    gloo's transport losing its peer."""
    nccl = [e for e in facts.events if e.kind in ("nccl", "exception") and _NCCL_OWN.search(e.detail)] or [ev]
    ranks = sorted({e.rank for e in nccl if e.rank is not None})
    data: dict[str, Any] = {"ranks": ranks, "phase": ev.phase, "line": ev.line.location()}
    gloo = _GLOO_PEER.search(ev.detail) is not None
    if gloo:
        data["backend"] = "gloo"
    warn = next((e.line.text.strip() for e in facts.events if "NCCL WARN" in e.line.text), None)
    proves = f"{_where(ev)} failed in {'gloo' if gloo else 'NCCL'} during {_phase(ev)}: {clip(ev.detail, 200).rstrip('. ')}."
    if gloo:
        proves += " The peer process closed its connection in the middle of a collective: it had ended (or was killed) first."
    if warn:
        data["nccl_warn"] = clip(warn, 300)
        proves += f" NCCL's own warning: {clip(warn, 200).rstrip('. ')}."
    return FailureClass(
        "nccl-error",
        ("Communication error (gloo): a peer closed the connection" if gloo else "NCCL communication error")
        + (f" during {_phase(ev)}" if ev.phase != "unknown" else ""),
        proves,
        "which resource failed unless NCCL's warning says it (a socket or InfiniBand/RoCE link, /dev/shm, a "
        "peer that died first): NCCL_DEBUG=INFO shows the failing call.",
        "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET); check that every node reaches the others on "
        "the interface NCCL picked (NCCL_SOCKET_IFNAME), /dev/shm size in containers, and that no rank died before.",
        data,
    )


# torch.distributed timing out outside a NCCL collective: gloo's transport (third_party/gloo/gloo/transport/tcp/
# unbound_buffer.cc: `Timed out waiting Nms for recv operation to complete`), the TCPStore and its clients
# (torch/csrc/distributed/c10d/TCPStore.cpp: `The client socket has timed out after Ns while trying to connect to`,
# `Timed out after N seconds waiting for clients. K/M clients joined.`, raised as DistNetworkError / DistStoreError),
# the store-based barrier (distributed_c10d.py _store_based_barrier: `Timed out initializing process group in store
# based barrier on rank: R, for key: ... (world_size=W, worker_count=C, timeout=...)`), torchrun's rendezvous
# (elastic/rendezvous/api.py RendezvousTimeoutError), NCCL's unique-id exchange through the store (ProcessGroupNCCL.cpp
# `... via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout`; the message pasted ending at
# `got error`, the store's own reason cut, is the same wait - a reason that is no timeout, e.g. `Connection reset by
# peer` from a rank 0 that died, is not)
# (torch 1.x's c10d socket helpers, torch/lib/c10d/Utils.cpp / Utils.hpp: `connect() timed out. Original timeout was N
# ms.` connecting to the store, and recvBytes' bare `Socket Timeout` reading from it)
_DIST_TIMEOUT = re.compile(
    r"Timed out waiting \d+ ?ms for (?:recv|send) operation|client socket has timed out|Timed out after \d+ seconds"
    r" waiting for clients|Timed out initializing process group|RendezvousTimeoutError|store->get\('\w+'\) got error"
    r"(?:: Socket Timeout|: [Ww]ait timeout after \d|\s*$)|(?:DistStoreError|DistNetworkError)\b.*(?i:timed? ?out)"
    r"|connect\(\) timed out\.|(?:Error|Exception): Socket Timeout\s*$"
)
_SETUP_WORDS = re.compile(r"(?i)socket|clients|initializing process group|rendezvous|store|connect\(\)")
_JOINED = re.compile(
    r"world_size=(?P<w>\d{1,7}), worker_count=(?P<c>\d{1,7})|(?P<c2>\d{1,7})/(?P<w2>\d{1,7}) clients joined"
)


def _dist_timeout(ev: Event) -> FailureClass:
    """A rendezvous, store or gloo operation that timed out: ranks that never met (set-up) or a peer that stopped."""
    text = ev.detail
    setup = _SETUP_WORDS.search(text) is not None
    data: dict[str, Any] = {"rank": ev.rank, "phase": ev.phase, "line": ev.line.location(), "setup": setup}
    m = _JOINED.search(text)
    joined = ""
    if m is not None:
        world, came = (m.group("w") or m.group("w2")), (m.group("c") or m.group("c2"))
        data["world_size"], data["joined"] = int(world), int(came)
        joined = f" Only {came} of {world} processes had joined."
    what = clip(text, 220).rstrip(". ")
    if setup:
        return FailureClass(
            "collective-timeout",
            "Process group set-up timed out (ranks did not all join)",
            f"{_where(ev)} timed out while the processes were meeting to form the process group: {what}.{joined}",
            "why the others did not arrive: a rank that failed or is still loading, a wrong MASTER_ADDR/MASTER_PORT or "
            "--rdzv-endpoint, a firewall between nodes, or nodes started at different times.",
            "check that every node starts the same command with the same rendezvous endpoint and world size, that the "
            "master port is reachable from each node, and that no rank died before the barrier (its own log).",
            data,
        )
    return FailureClass(
        "collective-timeout",
        "Collective timeout (gloo)",
        f"{_where(ev)} waited for a peer's data until the timeout during {_phase(ev)}: {what}.",
        "which peer stopped or why: a rank that died, hung, or runs a different code path.",
        "look for the first rank that stopped printing; run with TORCH_DISTRIBUTED_DEBUG=DETAIL to see the mismatching "
        "collective, and raise the timeout only if one rank does long work while the others wait.",
        data,
    )


# torch.distributed's debug checks name the ranks that diverged before the watchdog would: monitored_barrier
# (ProcessGroupGloo.cpp monitoredBarrier: `[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms`, with
# wait_all_ranks `Ranks 1, 2 failed to ...`) and TORCH_DISTRIBUTED_DEBUG=DETAIL's ProcessGroupWrapper
# (ProcessGroupWrapper.cpp: `Detected mismatch between collectives on ranks. Rank 0 is running collective:
# CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE, ...), but Rank 1 is running collective: ...`)
_MONITORED = re.compile(
    r"Ranks? (?P<ranks>\d{1,7}(?:, \d{1,7}){0,512}) failed to pass monitoredBarrier in (?P<ms>\d{1,12}) ms"
)
_MISMATCH_HEAD = "Detected mismatch between collectives on ranks"
_MISMATCH = re.compile(
    r"Detected mismatch between collectives on ranks\. Rank (?P<r1>\d{1,7}) is running collective: .{0,400}?"
    r"OpType=(?P<op1>\w{1,40}).{0,2000}?but Rank (?P<r2>\d{1,7}) is running collective: .{0,400}?"
    r"OpType=(?P<op2>\w{1,40})"
)


def _diverged(ev: Event) -> FailureClass | None:
    """A debug check naming the ranks that did not reach a barrier, or that ran different collectives."""
    data: dict[str, Any] = {"rank": ev.rank, "phase": ev.phase, "line": ev.line.location()}
    m = _MONITORED.search(ev.detail)
    if m is not None:
        late = [int(r) for r in m.group("ranks").split(", ")]
        data.update({"silent_ranks": late[:64], "timeout_ms": int(m.group("ms"))})
        who = ", ".join(str(r) for r in late[:16])
        return FailureClass(
            "collective-timeout",
            f"Rank(s) {who} did not reach the barrier (monitored_barrier)",
            f"{_where(ev)} waited {int(m.group('ms'))} ms in monitored_barrier during {_phase(ev)} and rank(s) {who} "
            "never arrived: they are the stragglers (dead, hung, or in other code).",
            "what the late ranks were doing: their own logs or a stack dump of them say it.",
            "read the late ranks' logs first (an earlier error, a kill), or dump their stacks (py-spy dump --pid) "
            "while the others wait.",
            data,
        )
    # (the fingerprints make the message longer than an event's detail: read the exception's whole message)
    whole = ev.traceback.exc_message if ev.traceback is not None and ev.traceback.exc_message else ev.detail
    m2 = _MISMATCH.search(whole)
    if m2 is not None or _MISMATCH_HEAD in whole:
        if m2 is not None:
            data.update(
                {
                    "ranks": [int(m2.group("r1")), int(m2.group("r2"))],
                    "collective": m2.group("op1"),
                    "other_collective": m2.group("op2"),
                }
            )
            what = (
                f"rank {m2.group('r1')} ran {m2.group('op1')} while rank {m2.group('r2')} ran {m2.group('op2')} at "
                "the same point"
            )
        else:  # (the fingerprints cut from the paste)
            what = (
                "two ranks ran different collectives at the same point (the fingerprints are not in the log)"
            )
        return FailureClass(
            "collective-timeout",
            "Ranks ran different collectives" + (f" ({m2.group('op1')} vs {m2.group('op2')})" if m2 else ""),
            f"{_where(ev)}: {what}, during {_phase(ev)} (TORCH_DISTRIBUTED_DEBUG=DETAIL's check): without the "
            "check, the ranks would hang until the watchdog's timeout.",
            "which code path sent each rank there: a branch on the rank (saving or logging on rank 0 only), modules "
            "skipped on some ranks (ZeRO-3 gathers), or uneven data.",
            "find the rank-dependent branch before this point; collectives must run in the same order on every rank.",
            data,
        )
    return None


def _hang_dump(ev: Event) -> FailureClass:
    """A stack dump (faulthandler, py-spy) of a run that printed no failure: it hung where the stack waits."""
    frames = ev.traceback.frames if ev.traceback is not None else []
    inner = frames[-1] if frames else None
    # the innermost frame in torch.distributed / deepspeed.comm names the collective; the frame outside those
    # files that called it, the caller
    waiting = [i for i, f in enumerate(frames) if any(w in f.file.replace("\\", "/") for w in WAIT_FILES)]
    wait = frames[waiting[-1]] if waiting else None
    caller = (
        next((frames[i] for i in range(waiting[-1] - 1, -1, -1) if i not in waiting), None)
        if waiting
        else None
    )
    data: dict[str, Any] = {
        "rank": ev.rank,
        "phase": ev.phase,
        "line": ev.line.location(),
        "frames": len(frames),
    }
    if inner is not None:
        data["innermost_frame"] = f"{inner.file}:{inner.lineno} in {inner.func}"
    if wait is not None:
        data["collective"] = wait.func
    what = (
        f"waiting in {wait.func} ({wait.file.rsplit('/', 1)[-1]}:{wait.lineno})"
        + (
            f", called from {caller.func} ({caller.file.rsplit('/', 1)[-1]}:{caller.lineno})"
            if caller
            else ""
        )
        if wait is not None
        else f"in {inner.func} ({inner.file.rsplit('/', 1)[-1]}:{inner.lineno})"
        if inner is not None
        else "at an unknown frame"
    )
    return FailureClass(
        "collective-timeout",
        "Hang: a stack dump shows the run " + (f"waiting in {wait.func}" if wait is not None else "stuck"),
        f"{_where(ev)} was dumped ({len(frames)} frame(s), most recent call first) with no error printed: it was "
        f"{what} during {_phase(ev)}; a run dumped while it prints no failure is one that stopped progressing.",
        "which rank did not arrive: the dump is of one process; ranks wait in a collective for a peer that is "
        "elsewhere (another collective, a save or evaluation on one rank, a dataloader) or dead.",
        "dump every rank (py-spy dump --pid, or faulthandler.dump_traceback_later on each) and compare where they "
        "are: the rank in a different function is the straggler; TORCH_DISTRIBUTED_DEBUG=DETAIL names a mismatching "
        "collective.",
        data,
    )


def _collective(ev: Event, facts: Facts) -> FailureClass:
    watch = [e for e in facts.events if e.kind == "watchdog"] or [ev]
    ranks = sorted({e.rank for e in watch if e.rank is not None})
    m = next((WATCHDOG_WORK.search(e.line.text) for e in watch if WATCHDOG_WORK.search(e.line.text)), None)
    data: dict[str, Any] = {"ranks": ranks, "phase": ev.phase, "line": ev.line.location()}
    parts = [f"A collective did not complete: {len(watch)} watchdog/NCCL line(s)"]
    if ranks:
        parts.append(
            f" on rank(s) {', '.join(str(r) for r in ranks[:16])}{' ...' if len(ranks) > 16 else ''}"
        )
    if m is not None:
        data["collective"] = m.group("op")
        parts.append(f"; the collective was {m.group('op')}")
        if m.group("nin"):
            data["numel_in"] = int(m.group("nin"))
            parts.append(f" of {int(m.group('nin')):,} elements")
        if m.group("timeout"):
            t = int(m.group("timeout"))
            data["timeout_ms"] = t
            parts.append(f", timeout {t} ms ({t / 60000:.0f} min)")
        if m.group("ran"):
            data["ran_ms"] = int(m.group("ran"))
            parts.append(f", it ran {int(m.group('ran'))} ms")
    parts.append(f"; during {_phase(ev)}.")
    missing = ""
    if ranks:
        seen = set(ranks)
        top = max(seen)
        absent = [r for r in range(top + 1) if r not in seen]
        # (a rank that printed no timeout is a likely straggler only when the log holds its other output - several
        # ranks' prefixes, a file per rank; a paste of one rank's lines says nothing of the others)
        silent = [r for r in absent if r in facts.ranks_in_log]
        elsewhere = [r for r in absent if r not in facts.ranks_in_log]
        if absent:  # (the ranks below the highest that printed no timeout in the log)
            data["silent_ranks"] = absent[:64]
        if silent:
            missing = (
                f" Ranks {', '.join(str(r) for r in silent[:16])} printed other lines here but no timeout: they are "
                "the likely stragglers (still in another collective, in a dataloader, or dead)."
            )
        if elsewhere or not silent:
            held = sorted(facts.ranks_in_log | seen)
            data["ranks_in_log"] = held[:64]
            missing += (
                f" The log holds the output of rank(s) {', '.join(str(r) for r in held[:16])} only"
                + (f"; rank(s) {', '.join(str(r) for r in elsewhere[:16])}" if elsewhere else "; other ranks")
                + " are not in it, so it cannot say which rank was late: read their own logs."
            )
    return FailureClass(
        "collective-timeout",
        "Collective timeout / hang" + (f" in {m.group('op')}" if m is not None else ""),
        "".join(parts) + missing,
        "why the ranks diverged: a rank that died without a trace, ranks running different code paths (ZeRO-3 "
        "with modules skipped on some ranks), a slow save/eval on rank 0, or the network.",
        "look for the first rank that stopped printing; run with TORCH_DISTRIBUTED_DEBUG=DETAIL and "
        "NCCL_DEBUG=INFO to see the mismatching collective; raise the timeout only if rank 0 does long work "
        "(saving, evaluation) while the others wait.",
        data,
    )


# Programs a JIT op build runs (torch/utils/cpp_extension.py: ninja, the host compiler, nvcc/hipcc): one missing is
# an op build failure, not a missing training package
_BUILD_TOOLS = frozenset(
    {"ninja", "nvcc", "hipcc", "gcc", "g++", "c++", "cc", "clang", "clang++", "cmake", "make"}
)


def _argparse_class(ev: Event, message: str, where: str, data: dict[str, Any]) -> FailureClass:
    """A script's argparse refused its command line (extract.ARGPARSE: `PROG: error: unrecognized arguments: ...`)."""
    prog, _, said = message.partition(": ")
    flags = list(dict.fromkeys(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]{0,60})", said)))[:5]
    data["keys"] = flags
    data["program"] = prog
    fix = "run the script with `--help` and pass only the options it defines (or add the missing ones)"
    if any(f in ("--local-rank", "--local_rank") for f in flags):
        # torch >= 2.0's launchers (torch.distributed.launch, deepspeed's launcher with torch 2) pass `--local-rank=N`;
        # scripts written for `--local_rank` (and the reverse) refuse it
        fix = (
            "accept both spellings of the launcher's rank flag (`parser.add_argument('--local-rank', '--local_rank', "
            "type=int, default=-1)`) or read LOCAL_RANK from the environment; torchrun passes no flag at all"
        )
    return FailureClass(
        "config-rejected",
        f"{prog}'s argument parser rejected the command line" + (f" ({flags[0]})" if flags else ""),
        f"{where}: {prog} stopped before doing anything: {clip(said, 240)} (argparse prints the usage and exits with "
        "code 2).",
        "who passed the options: the user's command, a launcher adding its own (torch.distributed.launch / deepspeed "
        "add --local-rank), or a wrapper script.",
        fix + ".",
        data,
    )


def _not_found_class(ev: Event, message: str, where: str, data: dict[str, Any]) -> FailureClass:
    """A shell could not run a command (extract.NOT_FOUND): the program is not installed, not on PATH, or a script's
    #! interpreter is gone."""
    cmd, _, line = message.partition(" ")
    name = cmd.rsplit("/", 1)[-1]
    said = clip(line.strip().removeprefix("(").removesuffix(")"), 200)
    data["missing"] = cmd
    if "bad interpreter" in line:
        gone = f"the interpreter {cmd} named on a script's #! line does not exist"
    else:
        gone = f"the shell found no program {cmd!r}"
    if name in _BUILD_TOOLS:
        data["op"] = None
        return FailureClass(
            "op-build-failure",
            f"A C++/CUDA op build cannot run {name}: it is not installed or not on PATH",
            f"{where}: {gone} ({said}).",
            "which op was being built, if the log does not name it.",
            f"install {name} (ninja: pip install ninja; nvcc: the CUDA toolkit matching torch.version.cuda) or put it "
            "on PATH of every rank, or pre-build DeepSpeed's ops (DS_BUILD_OPS=1 pip install deepspeed).",
            data,
        )
    return FailureClass(
        "import-error",
        f"Program not found: {name}",
        f"{where}: {gone} ({said}): the package that provides it is not installed in the environment the script "
        "runs in, or that environment is not active.",
        "whether the package is installed elsewhere (another conda env / venv, a removed one) or only missing "
        "from PATH.",
        f"activate the environment the run needs, or install the package that provides {name} there "
        f"(`which {name}`; for deepspeed/torchrun/accelerate: pip install it in that environment), or call it "
        f"as `python -m` of its module.",
        data,
    )


_EXC_HEAD = re.compile(r"([A-Za-z_][\w.]{0,200}(?:::[A-Za-z_]\w{0,80}){0,6})(?::\s?(.*))?$", re.S)


def _exception_class(ev: Event, versions: Mapping[str, str], beside: Traceback | None = None) -> FailureClass:
    """`beside`: another rank's traceback printed next to a frameless exception and cut before its own exception
    line (ranks fail together and each prints part: extract.phase_of reads its phase the same way)."""
    tb = ev.traceback
    # (a C++ exception's type keeps its namespace: `c10::Error: CUDA error: ...`)
    head = _EXC_HEAD.match(ev.detail)
    exc_type = (tb.exc_type if tb else None) or (head.group(1) if head else ev.detail.split(":", 1)[0])
    message = (tb.exc_message if tb else None) or (
        (head.group(2) or "").strip()
        if head
        else ev.detail.split(":", 1)[1].strip()
        if ":" in ev.detail
        else ""
    )
    if ev.detail.startswith(CUT_TRACEBACK):  # a paste that ends inside the traceback
        exc_type, message = "an exception (its type and message are cut from the log)", ev.detail
    low = f"{exc_type} {message} {' '.join(f.file for f in tb.frames) if tb else ''}".lower()
    lib = _lib_frame(tb)
    # (raised in the user's own file - the innermost frame outside installed packages and the standard library:
    # the user's code is where to read first, the library frame that called it is context)
    user = _user_frame(tb)
    data: dict[str, Any] = {
        "rank": ev.rank,
        "phase": ev.phase,
        "line": ev.line.location(),
        "exception": exc_type,
        "message": clip(message, 300),
    }
    if lib is not None:
        data["library_frame"] = f"{lib[0]}:{lib[1]} in {lib[2]}"
    where = f"{_where(ev)} during {_phase(ev)}"
    known = {k: v for k, v in sorted(versions.items()) if k in _LIBS}
    vers = ", ".join(f"{k} {v}" for k, v in known.items()) or "no versions printed in the log"
    if exc_type == NOT_FOUND_TYPE and tb is None:
        return _not_found_class(ev, message, where, data)
    if exc_type == ARGPARSE_TYPE and tb is None:
        return _argparse_class(ev, message, where, data)
    if exc_type == PACKAGE_BUILD_TYPE and tb is None:
        pkg, _, said = message.partition(" (")
        pkg = "" if pkg == "a package" else pkg
        data["package"] = pkg or None
        data["op"] = None
        return FailureClass(
            "op-build-failure",
            f"pip could not build {pkg or 'a package'} from source (a C++/CUDA build)",
            f"{where}: pip failed building {pkg or 'a package'}"
            + (f"; the build's compiler step: {said.rstrip(')')}" if said else "")
            + f" ({clip(ev.line.text.strip(), 200)}).",
            "which compiler error caused it: the first `error:` line of the build output above it has it (a missing "
            "header, nvcc's CUDA not matching torch's, an unsupported GPU architecture or host compiler).",
            f"install a prebuilt wheel of {pkg or 'the package'} matching your torch and CUDA versions if one exists "
            "(pip install --no-build-isolation picks up the torch already installed); otherwise make nvcc's CUDA "
            "match torch.version.cuda and install ninja.",
            data,
        )
    said = (
        f"{exc_type} {message}".lower()
    )  # the exception itself, not the frame paths (cpu_adam.py in a step)
    built = any(h in said for h in _BUILD_HINTS) or (
        tb is not None
        and any(
            f.func in ("_run_ninja_build", "jit_load", "_write_ninja_file_and_build_library")
            for f in tb.frames
        )
    )
    if built and ("error" in said or "exception" in said):
        m = _EXT.search(f"{message} {' '.join(f.file for f in tb.frames) if tb else ''}")
        op = next((g for g in (m.group("op"), m.group("op2"), m.group("op3")) if g), None) if m else None
        data["op"] = op
        if tb is not None and installing(tb):
            # `pip install deepspeed` from its sdist: setup.py runs op_builder/builder.py's CUDA checks at import
            # (installed_cuda_version() for the cupy extra), before any op is built or named
            pkg = next((p.group(1) for f in tb.frames if (p := _PIP_BUILD_DIR.search(f.file))), None)
            data["install"] = pkg or True
            what = f"{pkg}'s" if pkg else "the package's"
            return FailureClass(
                "op-build-failure",
                f"Installing {pkg or 'the package'} stopped in its setup.py (a C++/CUDA build check)",
                f"{_where(ev)} while pip ran {what} setup.py: {exc_type}: {clip(message, 200)}.",
                "which op would have been built: the check runs for the whole package before any op is compiled.",
                "point CUDA_HOME at the CUDA toolkit whose version matches torch.version.cuda (install the toolkit if "
                "it is missing, `nvcc --version`), or install a prebuilt wheel of the package instead of its sdist.",
                data,
            )
        return FailureClass(
            "op-build-failure",
            f"DeepSpeed op {op!r} failed to build or load"
            if op
            else "A C++/CUDA extension failed to build or load",
            f"{where}: {exc_type}: {clip(message, 200)}" + (f" (op {op})." if op else "."),
            "why the toolchain refused: a package missing from the environment (headers, a CUDA library) or a "
            "compiler / CUDA version the build does not support."
            if TOOLCHAIN_SAID in message
            else "which compiler error caused it: the build output above the traceback has it (the first `error:` "
            "line).",
            "run `ds_report` for the op's status and the CUDA/torch versions it compiles against; pre-build with "
            f"{_build_var(op)}=1 pip install deepspeed, or make nvcc's CUDA match torch's.",
            data,
        )
    kwarg = _UNEXPECTED_KWARG.match(message) if exc_type.endswith("TypeError") else None
    if kwarg is not None and not (tb and tb.frames):
        # CPython refusing a keyword the callee does not take, with no frame to say whose code called it (a UI or a
        # launcher that logs the exception's text alone, a script's last line): an argument the callee refuses - a
        # library's class or function called with a keyword it takes in other releases (TRL's SFTTrainer dropped
        # `tokenizer=` for `processing_class=`; an older accelerate's Accelerator has no `project_dir=`), so the
        # caller and the installed library are at versions that do not agree. Named as the argument refused (the
        # config-rejected class) with the version question as what the log does not prove
        callee, key = kwarg.group(1), kwarg.group(2)
        data["callee"], data["keyword"], data["keys"] = callee, key, [key]
        return FailureClass(
            "config-rejected",
            f"{callee}() refused the argument {key!r}: an API / version mismatch",
            f"{where}: {exc_type}: {clip(message, 200)}.",
            f"which package defines {callee} and at which version it takes {key!r}: no frame was printed "
            f"({vers}).",
            f"install the version of the package defining {callee} that the calling code was written for (its "
            "requirements file), or update the calling code; `zerodoctor env` lists the stack.",
            data,
        )
    # ("version" as a word: `requires fsdp_version=2` is a setting, not a package version)
    lazy = FAILED_IMPORT.match(message)
    shared = _SHARED_OBJECT.search(message)
    # bitsandbytes' native library that would not load at import (bitsandbytes/cextension.py 0.37-0.41: `if lib is None
    # and torch.cuda.is_available(): raise RuntimeError("CUDA Setup failed despite GPU being available. Inspect the
    # CUDA SETUP outputs above ...")`, 0.39-0.41 `... Please run the following command to get more information: python
    # -m bitsandbytes`): no compiler ran - the wheel's libbitsandbytes_cudaXXX.so does not match the CUDA runtime found
    bnb = _BNB_SETUP.search(message)
    if (
        exc_type.endswith(("ImportError", "ModuleNotFoundError", "PackageNotFoundError", "VersionConflict"))
        or bnb is not None
        or lazy is not None
        or (exc_type.endswith("OSError") and shared is not None)
        or "requires" in low
        and _VERSION_WORD.search(low)
    ):
        m = _MODULE.search(message)
        req = _REQUIRED_VERSION.search(message)
        name = (
            "bitsandbytes (its CUDA library)"
            if bnb is not None
            else (m.group("mod") or m.group("name"))
            if m
            else lazy.group(1)
            if lazy
            else shared.group("lib")
            if shared
            else (req.group("want") or req.group("pkg") or req.group("dist"))
            if req
            else None
        )
        data["missing"] = name
        if req is not None and req.group("found"):
            data["found"] = req.group("found").rstrip(".")
        return FailureClass(
            "import-error",
            f"Version requirement not met: {name}"
            if req is not None and name
            else f"Import failed: {name}"
            if name
            else "Import or version requirement failed",
            f"{where}: {exc_type}: {clip(message, 200)}.",
            "whether the package is missing or installed at an incompatible version (" + vers + ").",
            "compare `pip show` of the package with what the importing library requires at its installed version; "
            "`zerodoctor env` lists the stack.",
            data,
        )
    # (reading a checkpoint back is no configuration refused, even inside the integration's files)
    config_frame = (
        tb is not None
        and ev.phase != "resume"
        and any(any(c in f.file for c in _CONFIG_FILES) for f in tb.frames)
    )
    judge = _config_judge(tb) if ev.phase != "resume" and exc_type.endswith(_CONFIG_EXC) else None
    # (no frame, or only the script's own frames: a paste cut before the library frames that raised, or a script
    # that checks the config itself)
    frameless = not (tb and tb.frames) or (lib is None and _installed_frame(tb) is None)
    # where a library raises this message itself, read from its source (library_messages: the libraries' assert and
    # raise statements at the versions its index was built from; its data is loaded here, on the first lookup only)
    raised = None
    if frameless and user is None and message and exc_type.endswith("Error"):
        from zerodoctor.diagnose.library_messages import owner_of

        raised = owner_of(exc_type, message)
        if raised is not None:
            data["raised_at"] = {
                "package": raised.package,
                "file": raised.file,
                "line": raised.line,
                "function": raised.function,
                "version": raised.version,
                "other_sites": raised.other_sites,
                "versions": raised.versions,
            }
    if (
        judge is not None
        or (
            frameless
            and exc_type.endswith(
                (
                    "ValueError",
                    "AssertionError",
                    "TypeError",
                    "ConfigError",
                    "NotImplementedError",
                    "NoMatchingPeftModuleError",
                )
            )
            and (
                _NAMES_CONFIG.search(message) is not None
                # (a bare assertion needs its config named: DeepSpeed's runtime invariants share the refusal words)
                or (
                    exc_type.endswith(("ValueError", "NotImplementedError", "ConfigError"))
                    and _REFUSAL.search(message) is not None
                    and _SETTING_NAME.search(message) is not None
                )
            )
        )
        or (
            config_frame
            and exc_type.endswith(("ValueError", "AssertionError", "Error", "Exception"))
            # (a ValueError in those files that names no setting - accelerate's "Please make sure to properly
            # initialize your accelerator" - is a usage or library error, not a configuration refused)
            and any(h in message.lower() for h in (*_CONFIG_HINTS, *_SETTING_WORDS))
        )
        or (_DS_VALIDATION.search(low) is not None or "deepspeedconfigerror" in low)
        or (exc_type.endswith("ValueError") and any(h in low for h in _CONFIG_HINTS) and lib is not None)
        # a ValueError one of the training libraries raises itself (library_messages read the raise in its source):
        # Python's own meaning of ValueError is an argument of the right type but a value the callee refuses, and
        # these libraries raise it on the values the user's arguments, configs or model set (transformers' Trainer
        # "You cannot perform fine-tuning on purely quantized models", "Can't find a valid checkpoint at X") - except
        # where they resolve a model's or tokenizer's files and classes (`from_pretrained`, `from_config`: "Tokenizer
        # class X does not exist or is not currently imported" is the installed version, not a setting) or run on the
        # data (a forward, a tokenizer call, BatchEncoding.convert_to_tensors' "Unable to create tensor ...": the
        # batch's values, not the run's settings)
        or (
            raised is not None
            and exc_type.endswith("ValueError")
            and raised.package in _SETTINGS_JUDGES
            and not raised.function.endswith(_FILE_RESOLVERS)
        )
    ):
        found = list(_KEY_VALUE.finditer(message))
        if "'--" in message:
            # an argv list quoted in the message (HfArgumentParser's unused `['--task', 'DPO', ...]`): the flags are
            # the keys, the quoted items between them their values
            found = [k for k in found if k.group("flag")]
        keys = list(dict.fromkeys(k.group("key") or k.group("flag") or k.group("kv") for k in found))[:5]
        data["keys"] = keys
        cm = _CONFIG_CLASS.search(message)
        if cm:
            data["config_class"] = cm.group("cls")
        if judge is not None:
            data["judged_by"] = judge
            judge_lib = judge.split("/", 1)[0]
        else:
            judge_lib = (
                "deepspeed" if "deepspeed" in low else "accelerate" if "accelerate" in low else "transformers"
            )
        who = {
            "deepspeed": "DeepSpeed",
            "llamafactory": "LLaMA-Factory",
            "llmtuner": "LLaMA-Factory",
            "peft": "PEFT",
            "trl": "TRL",
        }.get(judge_lib, judge_lib)
        return FailureClass(
            "config-rejected",
            f"{who} rejected the configuration" + (f" ({keys[0]})" if keys else ""),
            f"{where}: {exc_type}: {clip(message, 240)}"
            + (f" (key: {', '.join(keys)})" if keys else "")
            + (f"; judged at {judge}." if judge else "."),
            "which file set the value (DeepSpeed JSON, TrainingArguments, accelerate YAML, or an `auto` resolved "
            "from another argument).",
            "run `zerodoctor lint` on the run's configs; it names the file, line and key.",
            data,
        )
    if user is not None:
        data["user_frame"] = f"{user[0]}:{user[1]} in {user[2]}"
        if lib is not None:
            data["library_frame"] = f"{lib[0]}:{lib[1]} in {lib[2]}"
    if lib is None and exc_type.endswith("AssertionError") and tb is not None and tb.frames:
        # an assertion raised inside any installed package (the innermost frame under site-packages/dist-packages:
        # flash_attn, apex, openrlhf, swift, ...) is a library's invariant too, named by its package directory
        lib = _installed_frame(tb)
        if lib is not None:
            data["library_frame"] = f"{lib[0]}:{lib[1]} in {lib[2]}"
    if lib is None and raised is not None and exc_type.endswith("AssertionError"):
        # a pasted assertion whose frames were cut: its message is raised by one library statement
        pkg, ver = raised.package, known.get(raised.package)
        at = f"{raised.file}:{raised.line} (in {raised.function}) in {raised.versions} (read at {raised.version})"
        return FailureClass(
            "library-assertion",
            f"Assertion failed inside {pkg}",
            f"{where}: an assertion failed: {clip(message, 200)}; the message is raised at {at}"
            + (f" and {raised.other_sites} other place(s) in {pkg}" if raised.other_sites else "")
            + " (no frame of it was printed)"
            + (
                f"; the log's {pkg} is {ver}, so the line may have moved."
                if ver and ver != raised.version
                else f"; {pkg} {ver or 'version not printed in the log'}."
            ),
            "what state led to it: an assertion names a broken invariant, not its cause; which caller reached it "
            "(the frames were cut from the log).",
            f"read {raised.file}:{raised.line} (in {raised.function}) and search the {pkg} tracker for "
            f"`{raised.function}` with the message at version {ver or raised.version}; check the release notes "
            "of the versions after it.",
            {**data, "library": pkg},
        )
    seen_beside = ""
    if lib is None and exc_type.endswith("AssertionError") and not (tb and tb.frames) and beside is not None:
        # a bare assertion whose frames were cut from the paste, and the traceback another rank printed beside it
        # reaching into an installed package (XTuner/mmengine resume, Sa2VA#138): that package is where to search
        lib = _installed_frame(beside) or _lib_frame(beside)
        if lib is not None:
            data["library_frame"] = f"{lib[0]}:{lib[1]} in {lib[2]}"
            data["frames_from"] = beside.start.location()
            who = f"rank {beside.rank}" if beside.rank is not None else "another process"
            seen_beside = f" (the innermost frame of the traceback {who} printed beside it, cut before its exception line)"
    if lib is None and exc_type.endswith("AssertionError") and not (tb and tb.frames):
        # a pasted assertion with no frame whose message names the library file that raised it (`AssertionError:
        # megatron/data/gpt_dataset.py:242 ...`, a test harness or a logger quoting the raising line)
        named = _LIB_FILE.search(message)
        if named is not None:
            lib = (named.group("path"), log_int(named.group("line")) or 0, "")
            data["library_frame"] = named.group("path") + (
                f":{named.group('line')}" if named.group("line") else ""
            )
    if exc_type.endswith("AssertionError") and lib is None and not (tb and tb.frames):
        owner = _ASSERT_OWNER.search(message)
        if owner is not None:
            # a pasted assertion line with no frame, whose message only DeepSpeed prints (ZeRO, partitions)
            ver = known.get("deepspeed")
            return FailureClass(
                "library-assertion",
                "Assertion failed inside deepspeed",
                f"{where}: a DeepSpeed assertion failed: {clip(message, 200)}"
                + f" ('{owner.group(0)}' is DeepSpeed's wording; no frame was printed); deepspeed {ver or 'version not printed'}.",
                "which line raised it (no frame in the log) and what state led to it.",
                "search the deepspeed tracker for the message at version "
                f"{ver or '(run `zerodoctor env`)'}; check the release notes of the versions after it.",
                {**data, "library": "deepspeed"},
            )
    if exc_type.endswith("AssertionError") and lib is not None and user is None:
        lib_name = lib[0].split("/", 1)[0]
        ver = known.get(lib_name)
        # (a file named only in the message has no function, and maybe no line)
        at = lib[0] + (f":{lib[1]}" if lib[1] else "")
        short = lib[0].rsplit("/", 1)[-1] + (f":{lib[1]}" if lib[1] else "")
        return FailureClass(
            "library-assertion",
            f"Assertion failed inside {lib_name}",
            f"{where}: an assertion at {at}"
            + (f" (in {lib[2]})" if lib[2] else "")
            + seen_beside
            + (f" failed: {clip(message, 200)}" if message else " failed with no message")
            + f"; {lib_name} {ver or 'version not printed'}.",
            "what state led to it: an assertion names a broken invariant, not its cause.",
            f"search the {lib_name} tracker for `{short}`"
            + (f" and `{lib[2]}`" if lib[2] else "")
            + f" at version {ver or '(run `zerodoctor env`)'}; check the release notes of the versions after it.",
            data,
        )
    last = _last_frame(tb)
    if user is not None:
        name = user[0].replace("\\", "/").rsplit("/", 1)[-1]
        return FailureClass(
            "crash",
            f"{exc_type.rsplit('.', 1)[-1]} in the training script ({name}:{user[1]})",
            f"{where}: {exc_type}: {clip(message, 240)} (last frame {user[0]}:{user[1]} in {user[2]}, the run's "
            "own code"
            + (f", called from {lib[0]}:{lib[1]} in {lib[2]})." if lib else ").")
            + (f" Versions: {vers}." if known else ""),
            "the cause: the exception surfaced in this code; the values it got (a batch, a config field, a "
            "tokenizer output) may come from elsewhere.",
            f"read your code at {user[0]}:{user[1]} (in {user[2]}) with the message in hand"
            + (f"; {lib[0]}:{lib[1]} is the library code that called it" if lib else "")
            + ".",
            data,
        )
    # (no frame printed, but the message is one a library raises: where, from its source)
    src_at = (
        f"{raised.file}:{raised.line} (in {raised.function}) in {raised.versions} (read at {raised.version})"
        if raised is not None and lib is None
        else ""
    )
    return FailureClass(
        "crash",
        f"{exc_type.rsplit('.', 1)[-1]} "
        + (
            f"in {lib[0].split('/', 1)[0]}"
            if lib
            else f"in {raised.package}"
            if src_at and raised is not None
            else "in the training script"
        ),
        f"{where}: {exc_type}: {clip(message, 240)}"
        + (f" (last frame {last})" if last else "")
        + (f"; the message is raised at {src_at} (no frame of it was printed)." if src_at else "."),
        "the cause: this exception is where it surfaced" + (f"; versions: {vers}." if known else "."),
        (
            f"read {raised.file}:{raised.line} (in {raised.function})"
            if src_at and raised is not None
            else "read the traceback from its innermost library frame"
            + (f" ({lib[0]}:{lib[1]} in {lib[2]})" if lib else "")
        )
        + "; search the library's tracker for the message at the installed version.",
        data,
    )


# A run that printed nothing for this long before a user's Ctrl-C had hung (the step time of fine-tuning is
# seconds to a minute; NCCL's watchdog would only fire after its 10-30 min timeout, so users stop it first).
HANG_SILENCE_S = 300
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")


def _stamp(text: str) -> datetime | None:
    m = _STAMP.search(text)
    if m is None:
        return None
    try:
        return datetime.fromisoformat(f"{m.group(1)} {m.group(2)}")
    except ValueError:
        return None


def _silence_before_interrupt(facts: Facts) -> tuple[int, LogLine, LogLine] | None:
    """(seconds, the last line with a time before the stop, the stop line) when a user stopped the run with
    Ctrl-C after it had printed nothing for HANG_SILENCE_S or more; None otherwise or without times."""
    stop = next(((ln, t) for ln in facts.interrupts if (t := _stamp(ln.text)) is not None), None)
    if stop is None:
        return None
    stop_line, stop_t = stop
    before = [
        (ln, t)
        for ln in [m[1] for m in facts.markers] + [e.line for e in facts.events]
        if ln.source == stop_line.source
        and ln.lineno < stop_line.lineno
        and (t := _stamp(ln.text)) is not None
    ]
    if not before:
        return None
    last_line, last_t = max(before, key=lambda x: x[0].lineno)
    gap = int((stop_t - last_t).total_seconds())
    return (gap, last_line, stop_line) if gap >= HANG_SILENCE_S else None


def _silent_hang(first: Event, gap: int, last: LogLine, stop: LogLine) -> FailureClass:
    minutes, seconds = divmod(gap, 60)
    return FailureClass(
        "collective-timeout",
        f"Hang: no output for {minutes} min {seconds} s, then stopped with Ctrl-C",
        f"the run printed nothing between {last.location()} ({_stamp(last.text)}) and the user's Ctrl-C at "
        f"{stop.location()} ({_stamp(stop.text)}): {minutes} min {seconds} s, during {_phase(first)}; ranks that "
        "stop progressing together without an error are waiting for each other in a collective.",
        "which collective or which rank: no NCCL watchdog fired before the stop (its timeout is longer), and no "
        "stack was dumped.",
        "run again with TORCH_NCCL_TRACE_BUFFER_SIZE set and a shorter timeout (or the zerodoctor guard, which "
        "dumps every rank's stack when a step takes far longer than the ones before), then read the dumps with "
        "`zerodoctor diagnose RUN_DIR`; TORCH_DISTRIBUTED_DEBUG=DETAIL names a mismatching collective.",
        {"phase": first.phase, "line": stop.location(), "silence_s": gap, "last_output": last.location()},
    )


# Ray re-raises a task's exception on the caller as a class named after it (python/ray/exceptions.py
# RayTaskError.as_instanceof_cause / make_dual_exception_type: `name = f"RayTaskError({cause_cls.__name__})"`), whose
# str() is the task's own traceback - `ray::Actor.method() (pid=..., ip=...)`, its frames, then the cause's own
# exception line. The wrapper's line names only the cause's type; that line says what failed.
_RAY_WRAPPED = re.compile(r"RayTaskError\((?P<cause>[A-Za-z_]\w{0,120})\)")
_RAY_CAUSE_LINES = 400  # (the task's traceback printed below the wrapper's line)


def _ray_cause(facts: Facts, first: Event) -> Event | None:
    """The exception a `RayTaskError(X)` first failure wraps: the first later `X:` line of the same log within the
    task's traceback (None when the log does not hold it): a line past a later progress update or phase marker is
    another failure, not the one the wrapper printed."""
    m = _RAY_WRAPPED.search(first.detail.split(":", 1)[0])
    if m is None:
        return None
    cause = m.group("cause")
    for ev in facts.events:
        if (
            ev.kind in ("exception", "cuda-oom", "host-oom")
            and ev.line.source == first.line.source
            and 0 < ev.line.lineno - first.line.lineno <= _RAY_CAUSE_LINES
            and ev.detail.split(":", 1)[0].rsplit(".", 1)[-1] == cause
        ):
            moved = ev.progress is not None and (first.progress is None or ev.progress.lineno > first.progress.lineno)
            marked = any(
                m_line.source == ev.line.source and first.seq < m_seq < ev.seq for _k, m_line, m_seq in facts.markers
            )
            return None if moved or marked else ev
    return None


# the phase markers that start a run (patterns.py phase-*), which a run's end does not precede in the same process
_RUN_START_KINDS = frozenset({"finished", "train", "load", "data", "zero-init", "engine", "resume"})


def _run_end_before(facts: Facts, ev: Event) -> LogLine | None:
    """The last line before a failure that says its run reached its end (the trainer's `train_runtime` summary,
    `Training completed`, `Training finished`: patterns.py `phase-finished`), in the same log; None if there is none,
    or if another run started after it (a second run: its loading, tokenizing, engine build or loop start, a bar of
    its own short of its total)."""
    found: LogLine | None = None
    for kind, m_line, m_seq in facts.markers:
        if m_line.source == ev.line.source and m_seq < ev.seq and kind in _RUN_START_KINDS:
            found = m_line if kind == "finished" else None
    p = ev.progress
    if found is not None and p is not None and p.lineno > found.lineno and (p.step or 0) < (p.total or 0):
        return None
    return found


# libstdc++'s verbose terminate handler's second line (vterminate.cc: `  what():  %s` under `terminate called after
# throwing an instance of '%s'`), the line extract makes a C++ exception's event of
_CPP_WHAT = re.compile(r"what\(\):\s")


def _exit_after_end(
    first: Event, code: str, end: LogLine, facts: Facts, said: str | None = None, *, killed: bool = False
) -> FailureClass:
    """A process that a signal ended after its run had printed its end: the exit status is a failure (a scheduler, a
    CI job, torchrun see it), but the training itself had finished. What it was doing then - a save after the end
    that had not said it was done, or the teardown at exit - is what the lines after the end show."""
    # libstdc++'s `terminate called without an active exception` right before the abort (a std::thread still joinable
    # when the process exits: native_messages.NO_EXCEPTION_DETAIL; extract drops it as a failure of its own)
    said = said or next(
        (
            ln.text.strip()
            for ln in facts.late_terminates
            if ln.source == first.line.source and 0 <= first.line.lineno - ln.lineno <= 3
        ),
        None,
    )
    why = f" on `{clip(said, 160)}`" if said else ""
    during = f" during {_phase(first)}" if first.phase != "unknown" else ""
    return FailureClass(
        "crash",
        f"The process exited with {code} after the run had finished",
        f"{_where(first)} exited with {code}{why}{during}, after the run had printed its end "
        f"({end.location()}: {clip(end.text.strip(), 120)}): training was over; the exit status still reports the job "
        "as failed.",
        (
            "whether everything after that end was written (a final save printed after it and not reported done was "
            "cut), nor who sent the SIGKILL: no kernel or scheduler OOM line is in these logs."
            if killed
            else "whether everything after that end was written (a final save printed after it and not reported done "
            "was cut), nor why the process aborted at exit (a native thread or library torn down with the process)."
        ),
        (
            "check that the output folder holds every file the final save writes; check `dmesg -T | grep -i -E 'out of "
            "memory|oom'` on the node (or `kubectl describe pod` for `Reason: OOMKilled`) at that time, and compare "
            "host RAM with `zerodoctor plan` for the final save (which may gather the whole model on one rank)."
            if killed
            else "check that the output folder holds every file the final save writes; if a job step depends on the "
            "exit status, run the script's teardown in isolation (destroy the process group, join threads) to find "
            "the abort."
        ),
        {
            "rank": first.rank,
            "exit_code": first.exit_code,
            "phase": first.phase,
            "line": first.line.location(),
            "run_end": end.location(),
        },
    )


_HANGUP = re.compile(r"got signal: (?:1|Signals\.SIGHUP)\s*$|Received (?:1|Signals\.SIGHUP) death signal|closing signal SIGHUP")


def _hangup(first: Event) -> bool:
    """The stop was a SIGHUP: exit code -1 / 129, or torch elastic's own words for it."""
    return first.exit_code in (-1, 129) or _HANGUP.search(first.detail) is not None


def classify(
    facts: Facts, first: Event | None, oom: OomNumbers | None, versions: Mapping[str, str]
) -> FailureClass | None:
    """The class of the run's first failure (None when the log shows no failure)."""
    if first is None:
        return None
    if first.kind in ("exception", "cuda-oom", "host-oom") and (cause := _ray_cause(facts, first)) is not None:
        # the wrapper and its cause are one failure: classify the cause's own line (its type and message), in the
        # wrapper's rank and phase where its own are not known
        first = replace(
            cause,
            rank=cause.rank if cause.rank is not None else first.rank,
            phase=cause.phase if cause.phase != "unknown" else first.phase,
        )
    # the user's Ctrl-C: the KeyboardInterrupt itself, or the launcher's teardown right after a `^C`
    user_stop = "KeyboardInterrupt" in first.detail or any(
        ln.source == first.line.source and 0 <= first.line.lineno - ln.lineno <= 2 for ln in facts.interrupts
    )
    if first.severity_class > 0 or user_stop:
        # a stop from outside (the launcher's teardown, a Ctrl-C): after a long silence it was a hang
        silence = _silence_before_interrupt(facts)
        if silence is not None:
            return _silent_hang(first, *silence)
    # a launcher's teardown or a stop from outside; exit code 1 is a rank's own error whose output is elsewhere
    if user_stop or (
        first.severity_class == 2
        and first.exit_code not in (-9, 9, 137, 1)
        and _LAUNCHER_TEARDOWN not in first.detail
    ):
        return FailureClass(
            "terminated",
            "The run was stopped from outside",
            f"{_where(first)} was stopped during {_phase(first)}: {clip(first.detail, 200)}; no rank failed on its own "
            "before it in these logs.",
            (
                # SIGHUP (1): the terminal or ssh session that started the job closed (torch elastic hands the signal
                # on to every worker: elastic/multiprocessing/api.py _terminate_process_handler)
                "why: SIGHUP (signal 1): the terminal or ssh session that started the run was closed or dropped."
                if _hangup(first)
                else "why: a scheduler time limit, a user's Ctrl-C or kill, or a hang that someone ended (if progress "
                "had stopped long before, it was a hang)."
            ),
            (
                "start the run so that it outlives the session: under the scheduler (sbatch), tmux/screen, or "
                "`nohup ... &` with `disown`; then resume from the last checkpoint."
                if _hangup(first)
                else "compare the time of the last progress line with the stop; for a hang, run with "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL and NCCL_DEBUG=INFO and a shorter NCCL timeout to get the stuck collective."
            ),
            {
                "rank": first.rank,
                "phase": first.phase,
                "line": first.line.location(),
                "exit_code": first.exit_code,
            },
            severity="warning",
        )
    if first.kind == "cuda-oom" or (
        oom is not None and first.kind == "exception" and oom.line.rank == first.rank
    ):
        return _gpu_oom(first, oom)
    if (
        first.kind == "exit"
        and first.exit_code in (-9, 9, 137)
        and not any(e.kind == "host-oom" for e in facts.events)
        and (end := _run_end_before(facts, first)) is not None
    ):
        # a SIGKILL after the run printed its end (review R1): named as the other exits after the end are, with the
        # senders a SIGKILL has (the OOM killer during a final save or teardown, a scheduler, a user); one the
        # kernel's or the cluster's OOM line proves (dmesg, kubectl's `Reason: OOMKilled`) stays a host OOM (R6)
        return _exit_after_end(
            first, f"code {first.exit_code} (SIGKILL: {_SIGKILL_SENDERS})", end, facts, killed=True
        )
    if first.kind == "host-oom" or (first.kind == "exit" and first.exit_code in (-9, 9, 137)):
        return _host_oom(first, facts)
    # a message printed below Python (a CUDA/HIP runtime error, a driver Xid, ROCr, InfiniBand, gloo, glibc's malloc):
    # the class its source names (native_messages.py holds the table and builds the message from the log's values)
    if first.kind in ("exception", "nccl") and (native := native_messages.classify(first, facts)) is not None:
        return FailureClass(
            native.name, native.title, native.proves, native.does_not_prove, native.next_step, native.data
        )
    if first.kind == "exception" and (host_alloc := _host_alloc_failed(first)) is not None:
        return host_alloc
    if first.kind == "exception" and (diverged := _diverged(first)) is not None:
        return diverged
    if first.kind == "exception" and _DIST_TIMEOUT.search(first.detail):
        return _dist_timeout(first)
    if first.kind == "exception" and _CHILD_KILLED.search(first.detail):
        # the parent's exception for a child a signal ended: joblib's loky executor (process_executor.py
        # TerminatedWorkerError, whose message goes on lines below with the workers' exit codes) or
        # torch.multiprocessing.spawn (`process N terminated with signal SIGKILL`); a SIGKILL among them is the OOM
        # killer's signal, and the child is the failure, not the parent's traceback
        killed = next(
            (
                e
                for e in facts.events
                if e.kind == "exit"
                and e.exit_code == -9
                and e.line.source == first.line.source
                and 0 <= e.line.lineno - first.line.lineno <= 4
            ),
            None,
        )
        if killed is not None:
            return _host_oom(replace(killed, phase=first.phase), facts)
    if first.kind == "watchdog" and first.detail.startswith(HANG_DUMP):
        return _hang_dump(first)
    if (
        first.kind == "watchdog"
        or (first.kind == "nccl" and _TIMEOUT.search(_NCCL_CALL_ERRNO.sub("", first.detail)))
        or (first.kind == "exception" and _ABORTED_TIMEOUT in first.detail)
    ):
        return _collective(first, facts)
    if first.kind == "nccl" or (
        first.kind == "exception" and (_NCCL_OWN.search(first.detail) or _GLOO_PEER.search(first.detail))
    ):
        return _nccl_error(first, facts)
    if (
        first.kind == "exception"
        and first.traceback is None
        and _CPP_WHAT.search(first.line.text)
        and (end := _run_end_before(facts, first)) is not None
    ):
        # a C++ exception that ended the process (std::terminate, then abort) after the run had printed its end
        return _exit_after_end(first, "SIGABRT (a C++ exception reached std::terminate)", end, facts, first.detail)
    if first.kind == "exception":
        tb = first.traceback
        peers = same_exception(facts.tracebacks, tb) if tb is not None else []
        if tb is not None and peers:
            # one exception printed by several ranks, interleaved: read it with all the frames its copies hold
            frames = list(tb.frames)
            seen = {(f.file, f.lineno, f.func) for f in frames}
            for t in peers:
                for f in t.frames:
                    if (f.file, f.lineno, f.func) not in seen:
                        seen.add((f.file, f.lineno, f.func))
                        frames.append(f)
            first = replace(first, traceback=replace(tb, frames=frames))
        beside = None
        if tb is None:
            beside = next(
                (
                    t
                    for t in facts.tracebacks
                    if t.source == first.line.source
                    and t.exc_type is None
                    and t.frames
                    and t.rank != first.rank
                    and abs(t.start.lineno - first.line.lineno) <= 3
                ),
                None,
            )
        return _exception_class(first, versions, beside)
    if (
        first.kind == "exit"
        and first.exit_code is None
        and _LAUNCHER_TEARDOWN in first.detail
        and first.phase in _HOST_LOAD_PHASES
        and not facts.tracebacks
        and all(e.kind == "exit" for e in facts.events)
    ):
        return _silent_death_while_loading(first)
    if first.kind == "exit":
        code = "an exit code not in these logs" if first.exit_code is None else f"code {first.exit_code}"
        if first.exit_code is not None and abs(first.exit_code) in _SIGNAL_NAMES:
            code += f" ({_SIGNAL_NAMES[abs(first.exit_code)]})"
        end = _run_end_before(facts, first)
        if end is not None:
            return _exit_after_end(first, code, end, facts)
        return FailureClass(
            "crash",
            f"A rank exited with {code}",
            f"{_where(first)} exited with {code} during {_phase(first)}; no traceback of its own "
            "was found in these logs.",
            "why it exited: its own output (stderr of that rank) is not in these logs or printed nothing.",
            "give diagnose every rank's log (a run directory, or torchrun's --log-dir / error files).",
            {
                "rank": first.rank,
                "exit_code": first.exit_code,
                "phase": first.phase,
                "line": first.line.location(),
            },
        )
    return None
