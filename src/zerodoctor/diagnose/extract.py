"""Turn the scanner's hit lines into facts: tracebacks per rank, OOM numbers, launcher exits, NCCL errors,
printed versions, phase markers, and the failure events in log order with the phase each happened in.

State is bounded: at most MAX_EVENTS failure events, MAX_TRACEBACKS tracebacks (frames capped), and the first
MAX_EVIDENCE lines of each signature are kept, whatever the log size.
"""

from __future__ import annotations

import functools
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from zerodoctor.diagnose import native_messages
from zerodoctor.diagnose.patterns import ACCUM, DS_INIT_ASSERT, EXTRACTOR_PATTERNS, INTERVAL, parse_progress
from zerodoctor.diagnose.reader import LogLine, log_float, log_int
from zerodoctor.diagnose.scan import Hit, Progress
from zerodoctor.kb.loader import load_entries
from zerodoctor.kb.matcher import FRAGMENTED_SHARE
from zerodoctor.textutil import clip

MAX_EVENTS = 2000
MAX_TRACEBACKS = 200
MAX_FRAMES = 200
MAX_EVIDENCE = 8


@functools.cache
def _warning_signatures() -> frozenset[tuple[str, str]]:
    """DeepSpeed / transformers warnings that matter: the KB's signatures of kind "warning" (each names the
    failure it announces), reported even when the run did not die of it."""
    return frozenset(
        (e.id, sig.id) for e in load_entries() for sig in e.symptoms.signatures if sig.kind == "warning"
    )


MAX_WARNINGS = 20

PHASES = (
    "tokenization",
    "load",
    "resume",
    "zero_init",
    "engine_init",
    "first_optimizer_step",
    "training_step",
    "epoch_end",
    "evaluation",
    "checkpoint_save",
    "unknown",
)

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_CUT_FRAME = re.compile(r'(\S+\.py)", line (\d+), in (\S+)')  # a frame line cut before `File "`
_ASSERT = re.compile(r"^\s*assert (.{1,300})$")
_RAISE = re.compile(r"^\s*raise ([A-Za-z_][\w.]*(?:Error|Exception))\((.{0,300})$")
_BARE_OSERROR = re.compile(r"^\s*\[Errno \d+\] [A-Z][A-Za-z ,'-]{2,80}: .{1,300}$")
_KERNEL_ASSERT = re.compile(
    r"\.cuh?:\d+: ?([^:\s][^\n]{0,100}?): ?block: \[[\d,]+\], thread: \[ ?[\d,]+\] ?(Assertion `.{1,160}` failed|\S.{0,160})"
)
_C10D_SOCKET = re.compile(r"\[c10d\] (The client socket has timed out after .{1,250})")
# transformers' lazy import (utils/import_utils.py _LazyModule._get_module): RuntimeError("Failed to import {module}
# because of the following error (look up to see its traceback):\n{the ImportError}")
FAILED_IMPORT = re.compile(r"^Failed to import ([\w.]{1,128}) because of the following error")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']{1,120})'")
_WHAT = re.compile(r"what\(\):\s+(.{1,300})$")
_RICH_FRAME = re.compile(r"(\S{0,300}\.py):(\d{1,7}) in ([A-Za-z_<][\w.<>]{0,120}) *(?:│ *)?$")
_IPY_FRAME = re.compile(r"(?:File )?(\S+\.py)(?::(\d+))?,? in ([A-Za-z_][\w.]*)\(")
# IPython's traceback header names the exception first: `CalledProcessError      Traceback (most recent call last)`
_IPY_HEAD = re.compile(
    r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))\s{2,}Traceback \(most recent call last\)"
)
# `ray.exceptions.RayTaskError(ActorDiedError): ...`: Ray wraps the actor's exception type in parentheses
# (a bare `Exception: ...` too: DeepSpeed and accelerate raise plain Exception in places, e.g. engine.py
# _configure_zero_optimizer's "The deprecated version of ZeRO Stage 1 is not supported")
_EXC = re.compile(
    r"^\s*((?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Failure|Exit)|Exception"
    # (setuptools' pkg_resources raises VersionConflict / ContextualVersionConflict, a ResolutionError not named so)
    r"|(?:pkg_resources\.)?(?:Contextual)?VersionConflict)(?:\([A-Za-z_][\w.]*\))?)"
    r"(?::\s?(.*))?\s*$"
)
# `python -m pkg.mod` whose module cannot be found prints no traceback, only runpy's one line:
# `/usr/bin/python: Error while finding module specification for 'axolotl.cli.train' (ModuleNotFoundError: No module
# named 'axolotl')` (CPython Lib/runpy.py _get_module_details)
# VS Code's exception widget, which its Python debugger fills (src/vs/workbench/contrib/debug/browser/exceptionWidget.ts:
# `Exception has occurred: {0}` with the exception's type as its id, the exception's str() on the line below it, then
# its stack): copied from the editor, the type and its message are on two lines. debugpy adds `       (note: full
# exception trace is shown but execution is paused at: <module>)` to the type when it stops in another frame than the
# one that raised, and a localized editor translates the header (zh-cn `发生异常: X`, ja `例外が発生しました: X`)
_VSCODE_EXC = re.compile(
    r"^\s*(?:Exception has occurred|发生异常|例外が発生しました): ([A-Za-z_][\w.]{0,120}(?:Error|Exception|Interrupt|Exit))"
    r"(?:\s+\(note: [^)]{0,200}\))?\s*$"
)
_RUNPY = re.compile(
    r"Error while finding module specification for '[^']{1,200}' \(([A-Za-z_][\w.]*Error): (.{1,300})\)\s*$"
)
# Python's own import failures quoted inside a sentence (`error info: ModuleNotFoundError: No module named 'x.y'`,
# "The `ImportError: cannot import name 'log'` error originates from ..."): the two messages CPython builds itself
# (Lib/importlib/_bootstrap.py _ERR_MSG_PREFIX `No module named `; Python/ceval.c import_from `cannot import name
# %R from %R (%S)`) are certain wherever they stand on the line; the message ends with the name(s) it quotes
_QUOTED_IMPORT = re.compile(
    r"(?<![A-Za-z0-9_.])((?:ModuleNotFound|Import)Error): ((?:No module named|cannot import name) '[\w.]{1,200}'"
    r"(?: from '[^'\s]{1,200}'(?: \([^()]{1,300}\))?)?)"
)
# torch's dtype-mismatch refusals quoted inside a sentence ("grpo-qlora训练时报错RuntimeError: expected scalar type Float
# but found BFloat16"): texts ATen builds itself, certain wherever they stand, across the versions users run -
# `expected scalar type X but found Y` (TensorBase data_ptr / checkScalarType, torch 1.x-2.x), `Expected object of scalar
# type X but got scalar type Y` (torch <= 1.5 TH checks), `expected mat1 and mat2 to have the same dtype` / `expected m1
# and m2 ...` (aten/src/ATen/native/cuda/Blas.cpp, torch 1.x-2.0), `mat1 and mat2 must have the same dtype` / `self and
# mat2 ...` / `addmv input tensors ...` (native/LinearAlgebra.cpp, torch 2.1+; all read in libtorch_cpu.so 2.13),
# `Input type (X) and weight type (Y) should be the same` (native/Convolution.cpp check_input_same_type_as_parameters),
# `Found dtype X but expected Y` (torch/csrc/autograd/engine.cpp validate_outputs), `Expected query, key, and value to
# have the same dtype` (native/transformers/sdp_utils_cpp.h)
_QUOTED_DTYPE = re.compile(
    r"(?<![A-Za-z0-9_.])((?:Runtime|Type|Value)Error): ((?:expected scalar type \w{1,20} but found \w{1,20}"
    r"|Expected object of scalar type \w{1,20} but got scalar type \w{1,20}"
    r"|expected (?:mat1 and mat2|m1 and m2) to have the same dtype"
    r"|(?:mat1 and mat2|self and mat2|addmv input tensors) must have the same dtype"
    r"|Input type \([\w.]{1,40}\) and weight type \([\w.]{1,40}\) should be the same"
    r"|Found dtype \w{1,20} but expected \w{1,20}"
    r"|Expected query, key,? and value to have the same dtype)[^\n]{0,200})"
)
# transformers' HfArgumentParser refusing a script's flags, quoted inside a sentence ("an error occures: ValueError: Some
# specified arguments are not used by the HfArgumentParser: ['--task', 'DPO']"): hf_argparser.py
# parse_args_into_dataclasses builds it (`raise ValueError(f"Some specified arguments are not used by the
# HfArgumentParser: {remaining_args}")`, transformers 4.x-5.x), certain wherever it stands; the list ends the message
_QUOTED_HF_ARGS = re.compile(
    r"(?<![A-Za-z0-9_.])(ValueError): (Some specified arguments are not used by the HfArgumentParser: \[[^\]\n]{0,400}\])"
)
# CPython's own refusal of a keyword the callee does not take, quoted inside a sentence (a UI's `Exception initializing
# accelerator: Accelerator.__init__() got an unexpected keyword argument 'project_dir'`): the text the interpreter
# builds for the call (Python/ceval.c / getargs.c, `%U() got an unexpected keyword argument '%S'`; the callee's
# qualified name from 3.10 on, its bare name before), certain wherever it stands
_QUOTED_KWARG = re.compile(
    r"(?<![\w.])((?:[A-Za-z_][\w.]{0,120}\.)?[A-Za-z_]\w{0,80}\(\) got an unexpected keyword argument '\w{1,80}')"
)
# An exception a user quotes inside prose, in the three forms a paste holds one (the line does not start with it):
#  - a Markdown code span (`` `ValueError: Can't find a valid checkpoint at X` ``, or a flattened traceback in one:
#    `` `raise RuntimeError('...'.format( RuntimeError: Error(s) in loading state_dict for Sequential:` ``): the last
#    `Type: message` inside the span, the message ending where the span does (CommonMark's code span)
#  - a double-quoted span (`this error appears: "[rank0]: AssertionError: Attempted to load weight ..."`, a whole line
#    `"ValueError: No valid checkpoint found in output directory"`): the same act as a code span in prose that is not
#    Markdown, but quotes also hold a program's own text (a model's completion, a JSON sample), so the quotes must
#    open on the exception (after a `[rankN]: ` prefix at most), the message ending where they close
#  - right after CJK text with no space (`报错如下FileNotFoundError: [Errno 2] ...`): CJK prose puts no space before a
#    Latin word, so the exception's name starts there
#  - OSError's own str() (CPython Objects/exceptions.c OSError_str: `[Errno N] strerror`, `: 'filename'`, ` -> 'filename2'`
#    for os.rename/os.replace), which is certain wherever it stands
_EXC_NAME = r"[A-Za-z_][\w.]{0,120}(?:Error|Exception)"
_CODE_SPAN = re.compile(r"`([^`\n]{4,600})`")
_QUOTE_SPAN = re.compile(r'["\u201c]([^"\u201c\u201d\n]{4,600})["\u201d]')
_LAST_EXC_IN_SPAN = re.compile(rf".*(?<![\w.])({_EXC_NAME}): (\S.{{0,300}})$")
_EXC_OPENS_SPAN = re.compile(rf"\s*(?:\[rank\d+\]:\s*)?({_EXC_NAME}): (\S.{{0,300}})$")
_EXC_AFTER_CJK = re.compile(
    rf"(?<=[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f])({_EXC_NAME}): (\S.{{0,300}})"
)
_ERRNO_EXC = re.compile(
    r"(?<![\w.])((?:[A-Za-z]\w{0,40})?(?:OS|IO)?Error): (\[Errno \d{1,4}\] [A-Z][^\n]{2,300})"
)


def quoted_exception(text: str, raw: str = "") -> tuple[str, str] | None:
    """The `(type, message)` of an exception quoted inside a line of prose (see above), or None; `raw` is the line
    as the log holds it (the reader takes a whole line's inline-code backticks off its text)."""
    for span in _CODE_SPAN.finditer(raw or text):
        m = _LAST_EXC_IN_SPAN.match(span.group(1))
        if m is not None:
            return m.group(1), m.group(2).strip()
    if '"' in text or "\u201c" in text:
        for span in _QUOTE_SPAN.finditer(text):
            m = _EXC_OPENS_SPAN.match(span.group(1))
            if m is not None:
                return m.group(1), m.group(2).strip()
    m = _EXC_AFTER_CJK.search(text) or _ERRNO_EXC.search(text)
    if m is not None:
        return m.group(1), m.group(2).strip()
    k = _QUOTED_KWARG.search(text)
    return ("TypeError", k.group(1)) if k is not None else None


# subprocess.CalledProcessError's text for a child a signal ended (CPython Lib/subprocess.py __str__: `died with
# <Signals.SIGKILL: 9>.`, or `returned non-zero exit status -9.` where signal names are unknown); accelerate launch
# (commands/launch.py simple_launcher) and wrapper scripts raise it for the training process
_CHILD_FAILED = re.compile(r"returned non-zero exit status -?\d+|died with <Signals\.")
_CALLED_PROCESS_SIGNAL = re.compile(
    r"died with <Signals\.SIG[A-Z]+: (\d{1,3})>|non-zero exit status -(\d{1,3})\b"
)
# CUDA's own allocation failure outside the caching allocator (cudaErrorMemoryAllocation, which c10's
# C10_CUDA_CHECK raises as `CUDA error: out of memory`, c10/cuda/CUDAException.cpp): a GPU out of memory, with no
# numbers
# A device's memory ran out, on every accelerator and framework users run, in each one's own words (patterns.py
# "oom-cuda" scans for the same forms; tests/diagnose/test_device_oom.py holds one line of each):
#  - torch's caching allocators raise torch.OutOfMemoryError with `<DEV> out of memory. Tried to allocate ...`:
#    CUDA and ROCm's hipified copy (c10/cuda/CUDACachingAllocator.cpp, `HIP out of memory` under ROCm), XPU
#    (c10/xpu/XPUCachingAllocator.cpp), Ascend (torch_npu/csrc/core/npu/NPUCachingAllocator.cpp, `NPU out of
#    memory`); MPS prints `MPS backend out of memory (MPS allocated: ...)` (aten/src/ATen/mps/MPSAllocator.mm)
#  - CUDA's own error string for cudaErrorMemoryAllocation / hipErrorOutOfMemory / CUDA_ERROR_OUT_OF_MEMORY, as
#    C10_CUDA_CHECK (`CUDA error: out of memory`, c10/cuda/CUDAException.cpp), the driver-API check
#    (`CUDA driver error: out of memory`), NCCL's CUDACHECK (`Cuda failure 'out of memory'`, src/include/checks.h)
#    , vLLM's cumem allocator (`CUDA Error: out of memory at csrc/cumem_allocator.cpp:62`) and PaddlePaddle's
#    legacy glog check (`Check failed: cudaSuccess == cudaStat (0 vs. 2) Cuda Error: out of
#    memory`, paddle/cuda/src/hl_cuda_device.cc) print it
#  - cuBLAS/cuDNN handles that could not allocate their workspace (`CUBLAS_STATUS_ALLOC_FAILED when calling
#    cublasCreate(handle)`, aten/src/ATen/cuda/CublasHandlePool.cpp; CUDNN_STATUS_ALLOC_FAILED)
#  - PaddlePaddle 2.x's allocator (`ResourceExhaustedError: Out of memory error on GPU 0. Cannot allocate
#    27.000000MB memory on GPU 0, 10.906372GB memory has been allocated and available memory is only 4.062500MB`,
#    paddle/fluid/memory/allocation/cuda_allocator.cc)
#  - JAX/XLA (`RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes`, xla/tsl BFC allocator;
#    `RESOURCE_EXHAUSTED: Failed to allocate request for 1.00GiB`), TensorFlow (`OOM when allocating tensor`)
#  - DeepSpeed's inference kernels' workspace (`Workspace can't be allocated, no enough memory.`,
#    deepspeed/ops/csrc/transformer/inference/includes/inference_context.h:139 and :156 at 0.19.8)
#  - the CUDA_CHECK_RETURN macro of NVIDIA's samples that bitsandbytes' kernels use (csrc/ops.cuh: fprintf(stderr,
#    "Error %s at line %d in file %s\n", cudaGetErrorString(...)) then exit(1)): `Error out of memory at line 74 in
#    file /src/csrc/ops.cu` (the same macro prints bitsandbytes' well-known `Error named symbol not found at line ...`)
#  - Ascend CANN's device-memory error codes (hiascend.com CANN 9.0.0 maintenref/troubleshooting, "Error Codes"):
#    EL0004 Memory_Allocation_Failure (driver: `EL0004: <time> Failed to allocate memory.`), EL0019
#    Resource_Error_Insufficient_Device_Memory (driver, DRV module), EI0011 (HCCL: `Failed to allocate [N] bytes of
#    NPU memory`), EN0012 (DVPP device memory); and the runtime's reason string for a driver allocation
#    (`rtMalloc execute failed, reason=[driver error:out of memory]`). EN0010 / EN0011 are host memory: not here.
# Not one: Triton's `OutOfResources: out of resource: shared memory` (a kernel's block size exceeds the SM's
# shared memory, triton/runtime/errors.py): no allocation failed, the kernel's configuration does not fit.
DEVICE_OOM = re.compile(
    r"(?:CUDA|HIP|NPU|XPU) out of memory|MPS backend out of memory|(?:CUDA|HIP|CUDA driver) error: out of memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|Cuda failure (?:\d{1,3} )?'out of memory'"
    r"|(?:CUDA|[Cc]uda) [Ee]rror: out of memory|cudaErrorMemoryAllocation|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY"
    r"|Out of memory error on GPU \d|RESOURCE_EXHAUSTED: (?:Out of memory|Failed to allocate)"
    r"|OOM when allocating tensor|Workspace can't be allocated, no?t? enough memory"
    r"|Error out of memory at line \d{1,7} in file "
    r"|\bE(?:L0004|L0019|I0011|N0012): |reason=\[driver error:out of memory\]"
    # (the message behind CANN's `<code>: <YYYY-MM-DD-hh:mm:ss.mmm.uuu> ` - the line reader takes a code at the line's
    # start for a host prefix, so the message after CANN's own timestamp is what is left of it)
    r"|\d\d:\d\d\.\d{3}\.\d{3} Failed to allocate (?:memory\.|\S{1,40} device memory|\[\d{1,20}\] bytes of NPU memory)"
    # vLLM refusing to start its engine for lack of GPU memory for the KV cache (a ValueError, no allocator ran out):
    # `No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ...` (worker.py
    # raise_if_cache_size_invalid 0.2-0.6, v1/core/kv_cache_utils.py _check_enough_kv_cache_memory), `The model's max
    # seq len (X) is larger than the maximum number of tokens that can be stored in KV cache (Y)` (the same function,
    # 0.x), `... Y GiB KV cache is needed, which is larger than the available KV cache memory (Z GiB)` (v1), and v1's
    # gpu_worker.py init_device `Free memory on device (X/Y GiB) on startup is less than desired GPU memory
    # utilization (U, Z GiB)` (another process - the trainer beside it - holds the memory)
    r"|No available memory for the cache blocks|KV cache is needed, which is larger than the available KV cache memory"
    r"|larger than the maximum number of tokens that can be stored in KV cache"
    r"|Free memory on device \([\d.]{1,12}/[\d.]{1,12} GiB\) on startup is less than desired GPU memory utilization"
)


def _ray_own(exc_type: str) -> bool:
    """Whether the type is one of Ray's own errors, not a task's exception that Ray re-raised on the caller: Ray
    names that one `RayTaskError(<the cause's class>)` and never wraps its own errors so (python/ray/exceptions.py
    RayTaskError.as_instanceof_cause: `if issubclass(cause_cls, RayError): return self  # don't try to wrap ray
    internal errors`), so `RayTaskError(OutOfMemoryError)` is the task's torch OOM, not Ray's memory monitor."""
    return exc_type.startswith("ray.") and "RayTaskError(" not in exc_type


def device_oom(exc_type: str, message: str) -> bool:
    """Whether an exception (type and message) is a device running out of memory (not Ray's host-memory kill)."""
    if _ray_own(exc_type) or "running low on memory" in message:
        return False
    return "OutOfMemoryError" in exc_type or DEVICE_OOM.search(message) is not None


# bounded, and not starting inside a longer number: a 5,000-digit size is no size (and `[\d.]+` on it is
# quadratic in re.search). PaddlePaddle (string::HumanReadableSize: `27.000000MB`, `39.250000kB`) and XLA
# (`1.00GiB`) print no space before the unit; their units are binary too.
_SIZE = r"(?<![\d.])([\d.]{1,24}) ?(GiB|MiB|KiB|GB|MB|kB|TB|bytes|B)\b"
_UNITS = {
    "GiB": 1.0,
    "MiB": 1 / 1024,
    "KiB": 1 / 1024**2,
    "GB": 1.0,
    "MB": 1 / 1024,
    "kB": 1 / 1024**2,
    "TB": 1024.0,
    "bytes": 1 / 1024**3,
    "B": 1 / 1024**3,
}
_OOM_FIELDS = {
    # torch's allocators; PaddlePaddle's `Cannot allocate X memory on GPU N`; XLA's BFC allocator
    "tried": re.compile(
        r"Tried to allocate " + _SIZE + r"|Cannot allocate " + _SIZE + r" memory on"
        r"|Out of memory while trying to allocate " + _SIZE + r"|Failed to allocate request for " + _SIZE
    ),
    # (torch 2.1's allocator misspelt it: `GPU 0 has a total capacty of 14.75 GiB of which 11.06 MiB is free`,
    # c10/cuda/CUDACachingAllocator.cpp at v2.1.0-v2.1.2)
    "total": re.compile(r"total capac(?:i)?ty of " + _SIZE + r"|" + _SIZE + r" total capacity"),
    "free": re.compile(
        r"of which " + _SIZE + r" is free|; " + _SIZE + r" free|available memory is only " + _SIZE
    ),
    "in_use": re.compile(r"this process has " + _SIZE + r" memory in use"),
    "allocated": re.compile(
        r"memory "
        + _SIZE
        + r" is allocated by PyTorch|"
        + _SIZE
        + r" already allocated|, "
        + _SIZE
        + r" memory has been allocated"
    ),
    "reserved_unallocated": re.compile(_SIZE + r" is reserved by PyTorch but unallocated"),
    "reserved_total": re.compile(_SIZE + r" reserved in total by PyTorch"),
}
_GPU = re.compile(r"(?:GPU|NPU|XPU) (\d+)")
_VALIDATION = re.compile(r"\d{1,6} validation errors? for [A-Za-z_]\w{0,80}")
_DS_RC = re.compile(r"exits with return code = (-?\d+)")
_LOCAL_RANK_ARG = re.compile(r"--local_rank=(\d+)")
_ELASTIC_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_ELASTIC_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)(?: \(pid: (\d+)\))?")
_ELASTIC_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: (\d+)\)")
_SIGNAL = re.compile(r"Signal (\d+) \((SIG[A-Z]+)\) received by PID (\d+)")
_DEATH_SIGNAL = re.compile(
    r"(?:Received |SignalException: Process \d{1,10} got signal: )(?:(\d{1,3})|Signals\.(SIG[A-Z]{2,8}))(?: death signal|\s*$)"
)


def _signal_number(name: str) -> int | None:
    """A signal's number from its name (`SIGTERM`), or None for a name this platform does not know."""
    number = getattr(signal.Signals, name, None)
    return int(number) if number is not None else None


_MPIRUN = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
_VERSION_LINES = (
    (re.compile(r"DeepSpeed info: version=([0-9][\w.+-]*)"), "deepspeed"),
    (re.compile(r"^\s*deepspeed info \.{3,}\s*([0-9][\w.+-]*)"), "deepspeed"),
    (re.compile(r"^\s*torch version \.{3,}\s*([0-9][\w.+-]*)"), "torch"),
    (re.compile(r"^\s*transformers version \.{3,}\s*([0-9][\w.+-]*)"), "transformers"),
    (re.compile(r"^\s*accelerate version \.{3,}\s*([0-9][\w.+-]*)"), "accelerate"),
    (re.compile(r"^\s*- `transformers` version: ([0-9][\w.+-]*)"), "transformers"),
    (re.compile(r"^\s*- PyTorch version[^:]*: ([0-9][\w.+-]*)"), "torch"),
    (re.compile(r"^\s*- Accelerate version: ([0-9][\w.+-]*)"), "accelerate"),
    (re.compile(r"^\s*- DeepSpeed version: ([0-9][\w.+-]*)"), "deepspeed"),
    (re.compile(r"^\s*- PEFT version: ([0-9][\w.+-]*)"), "peft"),
    (re.compile(r"^\s*- bitsandbytes version: ([0-9][\w.+-]*)"), "bitsandbytes"),
    (re.compile(r"^\s*([A-Za-z][\w.-]*)==([0-9][\w.+!-]*)\s*$"), ""),
)
# A traceback frame's source line -> the phase it names (patterns.py "code-*").
_CODE_PHASE = {
    "engine": "engine_init",
    "step": "optimizer",  # first or later optimizer step: decided from the progress (see phase_of)
    "train": "training_step",
    "eval": "evaluation",
    "save": "checkpoint_save",
    "forward": "forward",  # a forward pass: evaluation's or training's, decided from the markers (see phase_of)
    "load": "load",
    "resume": "resume",
    "tokenize": "tokenization",
}
# Failure messages raised in one phase only (patterns.py "msg-*"), read like a frame's source line when neither
# the frames nor the markers place the failure. Why each names its phase:
_MESSAGE_PHASE = {
    # ZeRO-3's forward hooks assert that a submodule's parameters were gathered (partitioned_param_coordinator.py
    # fetch_sub_module); CUDA's index kernel asserts on a token id past the embedding (Embedding.forward): both
    # are raised inside a model's forward
    "forward": "forward",
    # DeepSpeedEngine.no_sync() (runtime/engine.py, DeepSpeed >= 0.16.0) refuses ZeRO-2/3, and older engines have no
    # no_sync at all: the training loop enters it for gradient accumulation (accelerate's accumulate, HF Trainer)
    "train": "training_step",
    # `Cannot copy out of meta tensor`: Module.to()/_apply on parameters a low-memory load left on the meta device;
    # transformers' from_pretrained refusing a device_map under ZeRO-3
    "load": "load",
    # HF datasets' map losing a worker process: Dataset.map(num_proc=N) is the dataset's tokenization/preprocessing
    "tokenize": "tokenization",
    # deepspeed.initialize's checks of where its config came from (patterns.DS_INIT_ASSERT): building the engine
    "engine": "engine_init",
    # the Trainer's refusal to resume with no checkpoint folder: raised only on the resume path of Trainer.train
    "resume": "resume",
    # FSDP's full state dict failing to copy a gathered parameter (patterns.py msg-save): the gather a save does
    "save": "checkpoint_save",
}
# The detail of a failure read from a traceback whose exception line was cut from the paste.
CUT_TRACEBACK = "last frame (the exception line is not in the log): "
# The runtime guard's phases (zerodoctor.guard.monitor) -> diagnose's.
_GUARD = re.compile(r"zerodoctor guard \[rank (\d+), step (\S+), (\w+)\]")
_GUARD_PHASE = {
    "init": "engine_init",
    "first_optimizer_step": "first_optimizer_step",
    "train": "training_step",
    "evaluation": "evaluation",
    "save": "checkpoint_save",
}
# A NCCL watchdog line's collective: `WorkNCCL(SeqNum=357826, OpType=_ALLGATHER_BASE, NumelIn=50823168, ...,
# Timeout(ms)=5400000) ran for 5400036 milliseconds` (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL's
# logPrefix/checkTimeout; NumelIn is printed since torch 2.0)
WATCHDOG_WORK = re.compile(
    r"OpType=(?P<op>\w+)(?:.*?NumelIn=(?P<nin>\d{1,15}))?(?:.*?Timeout\(ms\)=(?P<timeout>\d{1,15}))?"
    r"(?:.*?ran for (?P<ran>\d{1,15}) milliseconds)?"
)
_NINJA_EXT = re.compile(r"-DTORCH_EXTENSION_NAME=(\w{1,64})")
# A shell that could not run a command, in each shell's words (the command is group `cmd`):
#  - bash (execute_cmd.c execute_disk_command: `%s: command not found`, prefixed `bash: ` or `SCRIPT: line N: `;
#    shell_execve: `%s: %s: bad interpreter` with strerror for a script whose #! interpreter is gone, e.g. a
#    `deepspeed`/`torchrun` entry point left behind by a removed environment; `%s: No such file or directory`)
#  - zsh (Src/exec.c: `zsh: command not found: %s`), dash (src/exec.c: `sh: 1: %s: not found`, `SCRIPT: N: %s: not
#    found`), fish (`fish: Unknown command: %s`)
#  - coreutils env (`/usr/bin/env: 'python': No such file or directory`, quotes per locale) and BSD env
NOT_FOUND = re.compile(
    r"command not found: (?P<cmd2>[\w./+-]{1,200})"
    r"|(?:^|[\s:])(?P<cmd>[\w./+-]{1,200}): command not found(?!:)"
    r"|: \d{1,7}: (?P<cmd3>[\w./+-]{1,200}): not found\s*$"
    r"|Unknown command:? '?(?P<cmd4>[\w./+-]{1,200})"
    r"|: (?P<cmd5>/[\w./+-]{1,200}): bad interpreter: "
    r"|\benv: [\'\"\u2018`]?(?P<cmd6>[\w./+-]{1,200})[\'\"\u2019`]?: No such file or directory"
)
NOT_FOUND_TYPE = "command not found"
# a script's argparse refusing its command line (CPython Lib/argparse.py ArgumentParser.error: the usage, then
# `%(prog)s: error: %(message)s` and exit 2; the messages of parse_known_args / _get_values: `unrecognized arguments:
# %s`, `the following arguments are required: %s`, `argument %s: invalid %s value: %r`, `argument %s: invalid choice:
# %r (choose from ...)`, `argument %s: expected one argument`)
ARGPARSE = re.compile(
    r"^\s*([\w.<>/ \[\]-]{1,120}?): error: ((?:unrecognized arguments|the following arguments are required): .{1,240}"
    r"|argument -{1,2}[\w-]{1,60}(?:/-{1,2}[\w-]{1,60})?: (?:invalid|expected|not allowed|ignored).{0,240})$"
)
ARGPARSE_TYPE = "argparse error"
# an error line of torch's C++ logging (patterns.py `glog-error`): its message
_GLOG_ERROR = re.compile(r"^\s*\[E(?:\d{3,4} \d\d:\d\d:\d\d\.\d{3,9})? [^\]\n]{1,120}:\d{1,6}\] (.{1,300})$")
# xtuner's command line reporting the exception its mode raised (patterns.py `xtuner-cmd-error`)
_XTUNER_CMD_ERROR = re.compile(r"WARNING: command error: '(.{1,400})'!\s*$")
_CUDA_CHECK_RETURN = re.compile(
    r"Error ([a-z][a-z ]{2,60}) at line \d{1,7} in file (\S{1,300}\.(?:cu|cuh|cpp|c))\b"
)
_SRUN_TASK = re.compile(r": task (\d{1,7}): Out Of Memory")
# a package pip could not build from source (patterns.py "pip-build" names the forms and their sources)
PACKAGE_BUILD_TYPE = "package build failed"
_PIP_WHEEL = re.compile(
    r"(?:Failed building wheel for|Could not build wheels for) ([A-Za-z0-9][\w.-]{0,100})"
    r"|Failed to build installable wheels for some pyproject\.toml based projects \(([^)\n]{1,200})\)"
)
_SETUPTOOLS_CMD = re.compile(r"error: command '([^'\n]{1,300})' failed with exit (?:status|code) (-?\d{1,5})")
_CUDA_MISMATCH = re.compile(
    r"The detected CUDA version \(([0-9.]{1,12})\) mismatches the version that was used to compile"
    r"|CUDA Setup failed despite GPU being available"
)
_BUILDING_EXT = re.compile(r"Building extension module (\w{1,64})")
TOOLCHAIN_SAID = "the compiler/linker said: "
# the toolchain failing a JIT op build (patterns.py "toolchain-failed" names the forms and their sources)
_TOOLCHAIN_FAILED = re.compile(
    r"\S*ld(?:\.[a-z]+)?: (?:error: unable to find library|cannot find) -l[\w+.-]{1,64}"
    r"|(?:collect2: )?error: ld returned \d{1,3} exit status|fatal error: [^ :]{1,200}: No such file or directory"
    r"|nvcc fatal +: .{1,200}|#error -- unsupported [A-Za-z ]{1,40} version!.{0,120}"
)
# gcc's notice after a fatal diagnostic (gcc/diagnostic.cc diagnostic_action_after_output, DK_FATAL: fnotice
# "compilation terminated.\n"; clang prints none, its fatal error line alone stays the build's only word); and nvcc's
# own fatal error (`nvcc fatal   : Unsupported gpu architecture 'compute_86'`, `nvcc fatal   : Value 'sm_90' is not
# defined for option 'gpu-architecture'`): the CUDA compiler driver stops on it, so a compile was running and failed
_CC_STOPPED = re.compile(r"(?<![\w-])compilation terminated\.|^\s*nvcc fatal +: ")
_DS_INIT = re.compile(rf"(?:{DS_INIT_ASSERT})(?: file|\s+and deepspeed\.?(?:initialize\(\) function call)?)?")
_TB_KEYS = frozenset({"x:tb-head", "x:tb-frame"})
# docker compose's report of a container's exit (`train-1 exited with code 137`: compose's log printer)
_COMPOSE_EXIT = re.compile(r"[\w.-] exited with code 137\b")
_DS_BACKEND = re.compile(r"DeepSpeed backend not set, please initialize it using init_process_group\(?\)?")
# a stack dump of a live process (patterns.py "fh-head"/"fh-frame"): faulthandler's and py-spy's frame lines, most
# recent call first; a stack dump under `Fatal Python error: ` is a crash (the signal is read elsewhere), not a hang
_FH_FRAME = re.compile(r'File "([^"]+)", line (\d{1,7}) in ([A-Za-z_<][\w<>.]{0,120})')
_PYSPY_MAIN = re.compile(r'^\s*Thread (?:0x)?[0-9A-Fa-f]{1,16} \([a-z-]{1,20}\): "MainThread"')
_PYSPY_FRAME = re.compile(r"^\s*([A-Za-z_<][\w<>.]{0,120}) \((\S{1,300}\.py):(\d{1,7})\)\s*$")
HANG_DUMP = "a stack dump of a process that had not failed: "
# where a dumped stack waits on its peers: torch.distributed's collectives and DeepSpeed's comm wrappers
WAIT_FILES = ("torch/distributed/", "deepspeed/comm/")
_NINJA_FAILED = re.compile(r"FAILED: (?:\[code=-?\d{1,5}\] )?(\S{1,200}\.(?:o|so|obj|pyd))\b")
_WATCHDOG_EXC = re.compile(r"[Ww]atchdog thread terminated with exception: (.{1,300})")
# how far after a failure's last line a bar tqdm redrew on closing is read (the message's own trailing lines: CUDA's
# `CUDA kernel errors might be asynchronously reported ...` and its two hints)
_BAR_AFTER_LINES = 4
_BAR_EVENTS = 8  # the failures before a bar that it can follow (one incident's events: exception, launcher, exit)
_TIMEOUT_WORDS = re.compile(r"(?i)timed? ?out|timeout")
# the HF Trainer's staging folder of a checkpoint being saved (trainer.py _save_checkpoint, 4.36-4.37: the model and
# states are written to `tmp-checkpoint-N`, then os.rename'd to `checkpoint-N`): an error naming it is in the save
_STAGING_CHECKPOINT = re.compile(r"(?<![\w-])tmp-checkpoint-\d{1,9}\b")
_EPOCH_SAVE = re.compile(r"Saving checkpoint at \d+ epochs")
# torch.utils.data's DataLoader machinery: a worker process, the pin-memory thread, the iterator's next batch
_DATA_FUNCS = frozenset({"_pin_memory_loop", "_worker_loop", "_next_data", "_get_data", "_try_get_data"})


def _fetching_data(tb: Traceback) -> bool:
    return any(f.func in _DATA_FUNCS and "torch/utils/data/" in f.file.replace("\\", "/") for f in tb.frames)


# a DataLoader worker's death as torch reports it: the main process's `DataLoader worker (pid N) is killed by signal:
# Killed.` / `... exited unexpectedly with exit code 1.` (torch/csrc/DataLoader.cpp THPModule_errorIfAnyWorkerFails),
# `DataLoader worker (pid(s) 12, 13) exited unexpectedly` (torch/utils/data/dataloader.py _try_get_data), and the
# worker's own signal handler lines (DataLoader.cpp SIGNAL_HANDLER: `ERROR: Unexpected bus error encountered in worker.`,
# `... segmentation fault ...`, `... floating-point exception ...`)
_WORKER_DIED = re.compile(
    r"DataLoader worker \(pids?(?:\(s\))? [\d, ]{1,200}\) (?:is killed by signal|exited unexpectedly)"
    r"|Unexpected (?:bus error|segmentation fault|floating-point exception) encountered in worker"
)


def _fetching_batch(ev: Event, tb: Traceback | None) -> bool:
    """Whether a failure happened fetching a batch: its frames are the DataLoader's, or its line is a DataLoader
    worker's death."""
    return (tb is not None and _fetching_data(tb)) or _WORKER_DIED.search(ev.detail) is not None


# The shell's report of a foreground job a signal ended (bash prints strsignal(3) of it, zsh its own word):
# the exit code a launcher would have printed for it
_SHELL_SIGNALS = (
    ("segmentation fault", -11),
    ("abort", -6),
    ("floating point exception", -8),
    ("floating-point exception", -8),  # a DataLoader worker's own report (torch/csrc/DataLoader.cpp)
    ("unexpected bus error", -7),  # (the worker's SIGBUS handler, DataLoader.cpp handler_SIGBUS)
    ("illegal", -4),
    ("terminated", -15),
)
# UCX's fatal-signal report (patterns.py `launch-shell-signal`): the signal's number is printed
_UCX_SIGNAL = re.compile(r"Caught signal (\d{1,2}) \(")
# bash's job report of a non-interactive shell (jobs.c): `SCRIPT: line N: PID <strsignal> [(core dumped)] COMMAND`
_SHELL_JOB = re.compile(r": line \d{1,7}: +\d{1,10} [A-Z]")
# a child ended by a signal, as its parent reports it (patterns.py `launch-child-signal`): torch.multiprocessing.spawn
# names the process index (the rank it was spawned as), joblib's loky executor the set of its workers' exit codes
_CHILD_SIGNAL = re.compile(r"process (?P<index>\d{1,6}) terminated with signal (?P<name>SIG[A-Z]{2,8})")
_LOKY_EXIT_CODES = re.compile(r"(?P<name>SIG[A-Z]{2,8})\((?P<code>-\d{1,2})\)")
_RESUME_FOLDER = re.compile(r"Loading model from \S*checkpoint-\d+")
# Collectives that only a backward pass issues at gradient-bucket sizes: DDP's gradient all-reduce (buckets of
# bucket_cap_mb=25 MiB, torch/nn/parallel/distributed.py), ZeRO-1/2's reduction of reduce_bucket_size elements
# (deepspeed/runtime/zero/stage_1_and_2.py average_tensor / allreduce_bucket), ZeRO-3's and FSDP's gradient
# reduce-scatter (stage3.py __avg_scatter_grads, torch FSDP _reduce_grad). Evaluation, saving and the loss-scale /
# grad-norm checks reduce a handful of elements (NumelIn=1 in every save and eval timeout of the corpus), and
# parameter gathers are ALLGATHERs, which training, evaluation and 16-bit saves all issue: they say nothing.
_GRADIENT_OPS = frozenset({"ALLREDUCE", "ALLREDUCE_COALESCED", "REDUCE_SCATTER", "_REDUCE_SCATTER_BASE"})
GRADIENT_NUMEL = 1_000_000
# Frames that only say "inside the training loop" (they enclose engine start, evaluation and saving too).
_LOOP_FUNCS = frozenset({"train", "_inner_training_loop", "inner_training_loop", "run", "run_epoch"})
_RANK_IN_NAME = re.compile(r"(?:rank|worker|proc)[_-]?(\d+)", re.IGNORECASE)

# Frame function names that say what the run was doing, most specific phase first.
_SAVE_FUNCS = frozenset(
    {
        "save_checkpoint",
        "_save_checkpoint",
        "save_model",
        "_save",
        "save_16bit_model",
        "_zero3_consolidated_16bit_state_dict",
        "_save_zero_checkpoint",
        "_save_optimizer_and_scheduler",
        "save_pretrained",
        "get_state_dict",
        "_save_checkpoint_files",
        "save_state",
        # torch.nn.Module.state_dict's per-module hook: building a state dict to write (bitsandbytes' 8-bit layers
        # convert their weights back here, peft/accelerate gather through it)
        "_save_to_state_dict",
        # Functions that run only while a checkpoint is written (issue 10; each name checked against its callers):
        # DeepSpeed deepspeed/runtime/engine.py (save_checkpoint -> _checkpoint_tag_validation, _create_checkpoint_file,
        # _create_zero_checkpoint_files, _common_checkpoint_state, _copy_recovery_script; _save_moe_checkpoint;
        # save_fp16_model -> save_16bit_model)
        "_checkpoint_tag_validation",
        "_create_checkpoint_file",
        "_create_zero_checkpoint_files",
        "_common_checkpoint_state",
        "_copy_recovery_script",
        "_save_moe_checkpoint",
        "save_fp16_model",
        # transformers trainer.py (_save_checkpoint -> _save_rng_state, _save_scaler, _rotate_checkpoints; _save_tpu),
        # trainer_callback.py CallbackHandler.on_save (after _save_checkpoint: LLaMA-Factory's SaveProcessorCallback /
        # FixValueHeadModelCallback in llamafactory/train/callbacks.py, fix_valuehead_checkpoint), core_model_loading.py
        # revert_weight_conversion (only save_pretrained calls it, 5.x)
        "_save_rng_state",
        "_save_scaler",
        "_rotate_checkpoints",
        "_save_tpu",
        "on_save",
        "fix_valuehead_checkpoint",
        "revert_weight_conversion",
        # accelerate checkpointing.py (Accelerator.save_state -> save_accelerator_state, save_custom_state) and
        # utils/fsdp_utils.py (save_fsdp_model, save_fsdp_optimizer); peft utils/save_and_load.py
        # get_peft_model_state_dict (PeftModel.save_pretrained's state dict)
        "save_accelerator_state",
        "save_custom_state",
        "save_fsdp_model",
        "save_fsdp_optimizer",
        "get_peft_model_state_dict",
        # ColossalAI colossalai/booster/booster.py (Booster.save_optimizer, save_lr_scheduler, save_lora_as_pretrained)
        # and colossalai/checkpoint_io/ (CheckpointIO.save_model -> save_sharded_model / save_unsharded_model, the
        # optimizer's save_sharded_optimizer / save_unsharded_optimizer in every plugin's checkpoint IO)
        "save_optimizer",
        "save_lr_scheduler",
        "save_lora_as_pretrained",
        "save_sharded_model",
        "save_unsharded_model",
        "save_sharded_optimizer",
        "save_unsharded_optimizer",
        # Lightning src/lightning/pytorch/trainer/connectors/checkpoint_connector.py dump_checkpoint (calls the
        # on_save_checkpoint hooks), callbacks/model_checkpoint.py ModelCheckpoint._save_topk_checkpoint /
        # _save_last_checkpoint / _save_monitor_checkpoint / _save_none_monitor_checkpoint, fabric/utilities/cloud_io.py
        # _atomic_save; lit-llama lit_llama/utils.py save_model_checkpoint
        "dump_checkpoint",
        "on_save_checkpoint",
        "_save_topk_checkpoint",
        "_save_last_checkpoint",
        "_save_monitor_checkpoint",
        "_save_none_monitor_checkpoint",
        "_atomic_save",
        "save_model_checkpoint",
        # mmengine mmengine/hooks/checkpoint_hook.py CheckpointHook._save_checkpoint_with_step / _save_best_checkpoint;
        # OpenRLHF openrlhf/trainer/ppo_trainer.py save_best_checkpoint; ms-swift swift/trainers/mixin.py
        # _save_converted_model / _save_flash_checkpoint; axolotl src/axolotl/train.py save_trained_model
        "_save_checkpoint_with_step",
        "_save_best_checkpoint",
        "save_best_checkpoint",
        "_save_converted_model",
        "_save_flash_checkpoint",
        "save_trained_model",
        # LLaVA llava/train/train.py and FastChat fastchat/train/train*.py: gathering ZeRO-3 / LoRA weights to save
        # (safe_save_model_for_hf_trainer, trainer_save_model_safe, get_*_state_maybe_zero_3; LLaVA's
        # llava_trainer.py _save_checkpoint calls get_mm_adapter_state_maybe_zero_3)
        "safe_save_model_for_hf_trainer",
        "trainer_save_model_safe",
        "get_peft_state_maybe_zero_3",
        "get_peft_state_non_lora_maybe_zero_3",
        "get_mm_adapter_state_maybe_zero_3",
    }
)
_EVAL_FUNCS = frozenset(
    {"evaluate", "evaluation_loop", "prediction_step", "predict", "_evaluate", "val_step"}
)
# A script's or a framework's own evaluation function, by its name: `test(epoch, ...)`, `evaluate_predictions`,
# `validation_step` (Lightning's LightningModule hook), `eval_epoch`, `_run_validation`, `run_evaluation`. Not a
# bare `eval`: torch.nn.Module.eval() only switches a module's mode, and training loops call it (an RL rollout); and
# not any `test_*`: pytest's test functions are named so.
# A class's private method (`self.__val()`) prints its name as written, with both underscores; and `val` is the
# validation of mmcv's EpochBasedRunner (mmcv/runner/epoch_based_runner.py `def val(self, data_loader, **kwargs)`,
# run by workflow [('train', 1), ('val', 1)]) and of the training scripts built like it (`self.__val()`), not a
# `val_dataloader` (Lightning's hook building the loader) nor any `val_*` helper.
_EVAL_NAME = re.compile(
    r"^_{0,2}(?:validate|validation|evaluate|evaluation)(?:_\w+)?$|^_{0,2}eval_\w+$|^_{0,2}val(?:_epoch)?$"
    r"|^_?run_(?:eval|evaluation|validation)\w*$|^_?(?:test|test_step|test_epoch|test_loop)$"
)
# A script's own save function by its name (`save`, `save_model`, `savemodel`, `save_checkpoint`, `save_ckpt`,
# `save_weights`, `save_state`): what it does is in its name, as for evaluation above
_SAVE_NAME = re.compile(r"^_?save_?(?:model|checkpoint|ckpt|weights|state|pretrained|adapter|lora)?s?$")
# safetensors writing a file (safetensors/torch.py save_file / save; save_model -> save_file, matched by _SAVE_NAME):
# older releases `serialize_file(_flatten(tensors), ...)`, `_flatten` raising `Some tensors share memory, this will lead
# to duplicate memory on disk`; 0.8.0 `serialize_file(_flatten_as_ptr(tensors, ...), ...)`, which calls
# `_evaluate_tensors_for_save` (that raise moved there); serialize_file raises `SafetensorError: Error while
# serializing: IoError(...)`: a checkpoint being saved
_SAFETENSORS_SAVE_FUNCS = frozenset(
    {"save_file", "_flatten", "_flatten_as_ptr", "_evaluate_tensors_for_save"}
)
_SAFETENSORS_TORCH = "safetensors/torch.py"
# loguru's default format (loguru/_defaults.py LOGURU_FORMAT): `... | LEVEL | module:function:line - message`
_LOGURU_WHERE = re.compile(r"\| ([\w.<>]{1,120}):([A-Za-z_<][\w<>]{0,120}):(\d{1,7}) - ")
_OPT_FUNCS = frozenset({"_optimizer_step", "_init_group", "unscale_and_clip_grads", "_take_model_step"})
_LOAD_FUNCS = frozenset(
    {
        "from_pretrained",
        "_load_pretrained_model",
        "get_peft_model",
        "prepare_model_for_kbit_training",
        "from_config",
        "load_model",
        "load_state_dict",
        "load_module_state_dict",  # DeepSpeedEngine's (a resume's load_checkpoint frames are read before it)
        # A model's weights read into a fresh model (issue 10): transformers modeling_utils.py 4.x load_shard_file /
        # _load_state_dict_into_meta_model / _load_state_dict_into_model, 5.x core_model_loading.py
        # convert_and_load_state_dict_in_model, modeling_utils.py _finalize_model_loading /
        # _move_missing_keys_from_meta_to_device (all under _load_pretrained_model)
        "load_shard_file",
        "_load_state_dict_into_meta_model",
        "_load_state_dict_into_model",
        "convert_and_load_state_dict_in_model",
        "_finalize_model_loading",
        "_move_missing_keys_from_meta_to_device",
        # accelerate big_modeling.py load_checkpoint_and_dispatch / dispatch_model, utils/modeling.py
        # load_checkpoint_in_model; peft peft_model.py PeftModel.load_adapter, tuners/tuners_utils.py
        # BaseTuner.inject_adapter, mapping.py inject_adapter_in_model, utils/save_and_load.py set_peft_model_state_dict
        "load_checkpoint_and_dispatch",
        "dispatch_model",
        "load_checkpoint_in_model",
        "load_adapter",
        "inject_adapter",
        "inject_adapter_in_model",
        "set_peft_model_state_dict",
        # ColossalAI colossalai/checkpoint_io/ load_sharded_model / load_unsharded_model (weights into a model: a
        # pretrained load, or the model half of a resume whose optimizer frames are read first)
        "load_sharded_model",
        "load_unsharded_model",
        # Lightning src/lightning/pytorch/core/module.py LightningModule.load_from_checkpoint, fabric/fabric.py
        # Fabric.load_raw (litgpt's load of pretrained weights); litgpt/utils.py load_from_full_model_state_dict;
        # LLaMA-Factory src/llamafactory/model/loader.py load_tokenizer, adapter.py init_adapter; LLaVA
        # llava/model/builder.py load_pretrained_model
        "load_from_checkpoint",
        "load_raw",
        "load_from_full_model_state_dict",
        "load_tokenizer",
        "init_adapter",
        "load_pretrained_model",
        # ms-swift swift/pipelines/train/sft.py and rlhf.py (3.x swift/llm/train/), sampling/base.py:
        # _prepare_model_tokenizer, rlhf.py _prepare_single_model (the reference / reward models)
        "_prepare_model_tokenizer",
        "_prepare_single_model",
    }
)
# Files whose every function loads or builds the model (issue 10): LLaMA-Factory's model loader and adapter set-up,
# ms-swift's model registry (swift/model/register.py get_model_processor in 4.x, swift/llm/model/register.py
# get_model_tokenizer* in 3.x, swift/llm/utils/model.py in 2.x), axolotl's ModelLoader (src/axolotl/loaders/model.py),
# the HF -> lit checkpoint conversion that lit-llama and litgpt run before fine-tuning (scripts/convert_hf_checkpoint.py
# convert_hf_checkpoint / copy_weights_*), and ColossalAI's LazyInitContext materialising a lazily built model
# (colossalai/lazy/lazy_init.py LazyTensor.materialize / _materialize_data, run inside Booster.boost)
_LOAD_FILES = (
    "llamafactory/model/loader.py",
    "llamafactory/model/adapter.py",
    "llmtuner/model/loader.py",
    "llmtuner/model/adapter.py",
    "swift/model/register.py",
    "swift/llm/model/register.py",
    "swift/llm/utils/model.py",
    "axolotl/loaders/model.py",
    "convert_hf_checkpoint.py",
    "colossalai/lazy/lazy_init.py",
)
# Frames that load a model, in the files where they do (issue 10): XTuner's SupervisedFinetune built by mmengine's
# runner (xtuner/model/sft.py __init__ -> _build_from_cfg_or_module / build_llm_from_cfg / _dispatch_lm_model_cfg,
# _prepare_for_lora; its forward and compute_loss in the same file are training frames, read first), and frames whose
# names read as a resume but that load a model's weights: mmengine's Runner.load_checkpoint
# (mmengine/runner/runner.py) for `load_from` - a resume goes through Runner.resume, read as a resume - and the
# module-level loaders under it (mmengine/runner/checkpoint.py load_checkpoint / _load_checkpoint), the strategies'
# (mmengine/_strategy/, xtuner/engine/_strategy/deepspeed.py); litgpt/utils.py load_checkpoint (pretrained weights,
# via Fabric.load_raw; a litgpt resume is fabric.load); Lightning core/saving.py _load_from_checkpoint (under
# LightningModule.load_from_checkpoint). Under Fabric.load_raw (lightning/fabric/fabric.py, lightning_fabric/fabric.py)
# the strategy's load_checkpoint is that load too.
_MODEL_LOAD_FRAMES = (
    ("fabric.py", frozenset({"load_raw"})),
    (
        "xtuner/model/sft.py",
        frozenset(
            {"__init__", "_build_from_cfg_or_module", "build_llm_from_cfg", "_dispatch_lm_model_cfg", "_prepare_for_lora"}
        ),
    ),
    ("mmengine/runner/", frozenset({"load_checkpoint", "_load_checkpoint"})),
    ("mmengine/_strategy/", frozenset({"load_checkpoint"})),
    ("xtuner/engine/_strategy/", frozenset({"load_checkpoint"})),
    ("litgpt/utils.py", frozenset({"load_checkpoint"})),
    ("core/saving.py", frozenset({"_load_from_checkpoint"})),
)
# torch.nn.Module's device placement (torch/nn/modules/module.py: cuda() and to() call _apply on every tensor)
_PLACE_FUNCS = frozenset({"cuda", "to", "_apply"})

_TORCH_MODULE = "torch/nn/modules/module.py"
# Resuming a run: the Trainer and DeepSpeed reading a checkpoint's optimizer/ZeRO states back.
_RESUME_FUNCS = frozenset(
    {
        "_load_from_checkpoint",
        "deepspeed_load_checkpoint",
        "_load_zero_checkpoint",
        "_load_optimizer_and_scheduler",
        "_load_rng_state",
        "load_checkpoint",
        "_load_checkpoint",
        "resume",
        # Functions that run only while training state is read back (issue 10; callers checked): DeepSpeed
        # deepspeed/runtime/engine.py (_load_checkpoint -> load_moe_state_dict; _load_zero_checkpoint ->
        # _get_all_zero_checkpoints -> _get_all_zero_checkpoint_names / _get_mp_rank_zero_checkpoint_names /
        # _get_all_zero_checkpoint_state_dicts), the ZeRO optimizers' load_state_dict path (zero/stage_1_and_2.py,
        # zero/stage3.py, bf16_optimizer.py: _load_legacy_checkpoint, _load_universal_checkpoint, _rigid_load_state_dict,
        # _restore_from_elastic_fp32_weights, _restore_elastic_base_optimizer_state, _restore_base_optimizer_state,
        # _restore_step_from_elastic_checkpoint, _load_global_state[_stage3]), universal checkpoints
        # (runtime/base_optimizer.py load_hp_checkpoint_state_from_checkpoint_dir, checkpoint/universal_checkpoint.py
        # load_hp_checkpoint_state, stage3.py load_*_checkpoint_state_from_checkpoint_dir_stage3)
        "load_moe_state_dict",
        "_get_all_zero_checkpoints",
        "_get_all_zero_checkpoint_names",
        "_get_mp_rank_zero_checkpoint_names",
        "_get_all_zero_checkpoint_state_dicts",
        "_load_legacy_checkpoint",
        "_load_universal_checkpoint",
        "_rigid_load_state_dict",
        "_restore_from_elastic_fp32_weights",
        "_restore_elastic_base_optimizer_state",
        "_restore_base_optimizer_state",
        "_restore_step_from_elastic_checkpoint",
        "_load_global_state",
        "_load_global_state_stage3",
        "load_hp_checkpoint_state",
        "load_hp_checkpoint_state_from_checkpoint_dir",
        "load_hp_checkpoint_state_from_checkpoint_dir_stage3",
        "load_module_checkpoint_state_from_checkpoint_dir_stage3",
        # transformers trainer.py (train() with resume_from_checkpoint: _load_scaler, _load_callback_state)
        "_load_scaler",
        "_load_callback_state",
        # accelerate checkpointing.py (Accelerator.load_state -> load_accelerator_state, load_custom_state),
        # utils/fsdp_utils.py load_fsdp_optimizer
        "load_accelerator_state",
        "load_custom_state",
        "load_fsdp_optimizer",
        # ColossalAI colossalai/booster/booster.py Booster.load_optimizer / load_lr_scheduler, checkpoint_io/
        # load_sharded_optimizer / load_unsharded_optimizer, hybrid_parallel_checkpoint_io.py load_states_into_optimizer
        "load_optimizer",
        "load_lr_scheduler",
        "load_sharded_optimizer",
        "load_unsharded_optimizer",
        "load_states_into_optimizer",
        # Lightning src/lightning/pytorch/trainer/connectors/checkpoint_connector.py (fit with ckpt_path:
        # restore_training_state -> restore_loops, restore_optimizers_and_schedulers -> restore_optimizers ->
        # strategy.load_optimizer_state_dict, restore_lr_schedulers)
        "restore_training_state",
        "restore_loops",
        "restore_optimizers_and_schedulers",
        "restore_optimizers",
        "restore_lr_schedulers",
        "load_optimizer_state_dict",
        # mmengine mmengine/_strategy/ (resume -> load_optim_state_dict, load_scheduler_state_dict)
        "load_optim_state_dict",
        "load_scheduler_state_dict",
    }
)
# Resume functions whose names other code uses too, read only in their own files: accelerate's Accelerator.load_state
# (accelerate/accelerator.py), OpenRLHF's DeepspeedStrategy.load_ckpt (openrlhf/utils/deepspeed/deepspeed.py; the
# train_*.py scripts and ppo_actor / ppo_critic call it for `--load_checkpoint`)
_RESUME_FRAMES = (
    ("accelerate/accelerator.py", frozenset({"load_state"})),
    ("openrlhf/", frozenset({"load_ckpt"})),
)
# An optimizer's own load_state_dict (torch.optim's, the ZeRO / bf16 / fp16 optimizer wrappers of DeepSpeed): only a
# resume reads optimizer state back (a fresh run creates it)
_OPT_STATE_FILES = (
    "torch/optim/",
    "deepspeed/runtime/zero/",
    "deepspeed/runtime/bf16_optimizer.py",
    "deepspeed/runtime/fp16/",
)


def _in_files(f: Frame, table: tuple[tuple[str, frozenset[str]], ...]) -> bool:
    """Whether a frame is one of a table's (file fragment, function names) pairs."""
    file = f.file.replace("\\", "/")
    return any(f.func in funcs and part in file for part, funcs in table)


def _loading_model(tb: Traceback) -> bool:
    """Whether a traceback's frames load a model's weights: a file that only loads models (_LOAD_FILES), or a
    loader whose name reads as a resume (_MODEL_LOAD_FRAMES)."""
    return any(
        any(part in f.file.replace("\\", "/") for part in _LOAD_FILES) or _in_files(f, _MODEL_LOAD_FRAMES)
        for f in tb.frames
    )


def _resuming(tb: Traceback) -> bool:
    """Whether a traceback's frames read training state back: a resume function (not one of the model loaders
    named like one; under Fabric.load_raw the strategy's load_checkpoint is that load), a framework's own resume
    function in its file, or an optimizer's load_state_dict."""
    raw = any(f.func == "load_raw" for f in tb.frames)
    return any(
        (
            f.func in _RESUME_FUNCS
            and not _in_files(f, _MODEL_LOAD_FRAMES)
            and not (raw and f.func == "load_checkpoint")
        )
        or _in_files(f, _RESUME_FRAMES)
        or (f.func == "load_state_dict" and any(d in f.file.replace("\\", "/") for d in _OPT_STATE_FILES))
        for f in tb.frames
    )


# HF datasets' map (arrow_dataset.py Dataset.map, its workers): dataset preprocessing and tokenization.
_DATASET_MAP_FUNCS = frozenset({"map", "_map_single", "iflatmap_unordered"})
# The frameworks' own dataset preparation before training (their conversion and tokenization of the dataset, run
# under HF datasets' map or directly): LLaMA-Factory src/llamafactory/data/ aligner.py (convert_alpaca /
# convert_sharegpt), converter.py, loader.py (get_dataset, _get_preprocessed_dataset), processor(s)/ (the
# preprocess_*_dataset functions; not collator.py, which runs in the training loop); XTuner xtuner/dataset/
# huggingface.py (process_hf_dataset) and map_fns/; TRL's trainers' _prepare_dataset; ms-swift swift/llm/dataset/.
_DATA_PREP_FILES = (
    "llamafactory/data/aligner.py",
    "llamafactory/data/converter.py",
    "llamafactory/data/loader.py",
    "llamafactory/data/preprocess.py",
    "llamafactory/data/processors/",
    "llamafactory/data/processor/",
    "llmtuner/data/",
    "xtuner/dataset/huggingface.py",
    "xtuner/dataset/map_fns/",
    "swift/llm/dataset/",
    # axolotl src/axolotl/utils/data/sft.py (prepare_datasets, _load_tokenized_prepared_datasets) and rl.py
    # (prepare_preference_datasets): loading and tokenizing the datasets before training
    "axolotl/utils/data/sft.py",
    "axolotl/utils/data/rl.py",
)
# (ms-swift's SwiftSft._encode_dataset, swift/pipelines/train/sft.py and 3.x swift/llm/train/sft.py: the dataset
# encoded by the template before the trainer is built)
_DATA_PREP_FUNCS = frozenset({"_prepare_dataset", "process_hf_dataset", "_encode_dataset"})
# deepspeed.initialize: building the engine, its config, its optimizer (and the cpu_adam op), broadcasting.
_ENGINE_FUNCS = frozenset(
    {
        "_configure_optimizer",
        "_configure_zero_optimizer",
        "_configure_basic_optimizer",
        "_configure_distributed_model",
        "_broadcast_model",
        "_configure_with_arguments",
        "_do_args_sanity_check",
        "_configure_lr_scheduler",
        "_initialize_parameter_parallel_groups",
        "_batch_assertion",
        "_configure_train_batch_size",
        "_do_sanity_check",
        "_prepare_deepspeed",
        "deepspeed_init",  # transformers' wrapper around deepspeed.initialize
        # accelerate's prepare (accelerator.py Accelerator._prepare_one / prepare_model) and the DistributedDataParallel
        # wrapping it does without DeepSpeed (torch/nn/parallel/distributed.py DistributedDataParallel.__init__:
        # _verify_param_shape_across_processes, _sync_module_states, _ddp_init_helper building the Reducer's buckets)
        "prepare_model",
        "_prepare_one",
        "_ddp_init_helper",
        "_sync_module_states",
        "_verify_param_shape_across_processes",
    }
)
# ZeRO optimizers' constructors (inside deepspeed.initialize): they create the optimizer states by calling the
# wrapped optimizer's step() once, so they are read before the optimizer-step frames.
_ZERO_OPT_INIT_FUNCS = frozenset(
    {
        "initialize_optimizer_states",
        "_setup_for_real_optimizer",
        "defragment",
        "_create_fp16_partitions_with_defragmentation",
        "_create_fp16_partitions",
    }
)
# ZeRO-3's prefetch check (deepspeed/runtime/zero/partitioned_param_coordinator.py fetch_sub_module, 0.19.8 line
# 437: `tracing error at step {step_id}: ...`) runs only once the module trace is complete - after a whole first
# forward/backward was recorded - and inside a sub-module's forward or backward hook: a forward/backward pass, not
# the first one (training or evaluation: the markers say which, as for a forward frame)
_ZERO3_TRACE_CHECK = re.compile(r"\btracing error at step \d+:")
_ENGINE_FILES = ("deepspeed/runtime/config.py", "deepspeed/ops/op_builder", "op_builder/builder.py")
# Files whose classes deepspeed.initialize constructs (DeepSpeed 0.19.8: DeepSpeedEngine in runtime/engine.py; the
# optimizer wrappers engine._configure_*_optimizer builds - DeepSpeedZeroOptimizer in zero/stage_1_and_2.py,
# DeepSpeedZeroOptimizer_Stage3 in zero/stage3.py, BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer - and
# DeepSpeedCPUAdam): an `__init__` frame in them is the engine being set up
# torch's DistributedDataParallel.__init__ (torch/nn/parallel/distributed.py) checks the model across ranks with a
# collective before training - dist._verify_model_across_ranks (torch 1.8-1.9), _verify_params_across_processes
# (1.10-1.11), _verify_param_shape_across_processes (>= 1.12) - and broadcasts the module states: wrapping the model,
# the engine set-up of a run without DeepSpeed (as accelerate's prepare_model, _ENGINE_FUNCS)
_ENGINE_CTOR_FILES = (
    "deepspeed/runtime/engine.py",
    "torch/nn/parallel/distributed.py",
    "deepspeed/runtime/zero/stage_1_and_2.py",
    "deepspeed/runtime/zero/stage3.py",
    "deepspeed/runtime/bf16_optimizer.py",
    "deepspeed/runtime/fp16/fused_optimizer.py",
    "deepspeed/runtime/fp16/unfused_optimizer.py",
    "ops/adam/cpu_adam.py",
)
# Inside the zero.Init context (parameters created and partitioned as the model is built).
_ZERO_INIT_FUNCS = frozenset(
    {
        "_post_init_method",
        "new_tensor",
        "_convert_to_deepspeed_param",
        "__enter__",
        "wrapper",
        "_convert_to_zero_parameters",
        "partition",
    }
)
_TRAIN_FUNCS = frozenset(
    {
        "training_step",
        "compute_loss",
        "forward",
        "backward",
        "_engine_run_backward",  # torch/autograd/graph.py, under every loss.backward() (torch >= 2.3)
        "_inner_training_loop",
        "train_step",
        "run_iter",
        "no_sync",  # gradient accumulation in the training loop (accelerate's accumulate, DeepSpeed engine)
        # RLHF steps: the rollout and the update are the training step (DeepSpeed-Chat step3 ppo_trainer.py
        # generate_experience / train_rlhf; OpenRLHF trainer/ppo_utils/experience_maker.py make_experience_list and
        # ppo_actor.py ppo_train / training_step; TRL GRPOTrainer._generate_and_score_completions; verl's workers
        # fsdp_workers.py update_actor / update_critic / generate_sequences / compute_log_prob); their validation
        # (verl _validate, evaluation loops) is read as evaluation first
        "generate_experience",
        "train_rlhf",
        "make_experience",
        "make_experience_list",
        "ppo_train",
        "_generate_and_score_completions",
        "update_actor",
        "update_critic",
        "generate_sequences",
        "compute_log_prob",
        "compute_ref_log_prob",
        # ZeRO-1/2's gradient reduction (deepspeed/runtime/zero/stage_1_and_2.py, 0.3 to 0.19.8): the gradient hooks
        # reduce_ready_partitions_and_remove_grads / reduce_independent_p_g_buckets_and_remove_grads fill the IPG
        # bucket and reduce_ipg_grads reduces it (asserting `The parameter N has already been reduced`), and
        # engine.backward ends with overlapping_partition_gradients_reduce_epilogue: all inside a backward pass
        "reduce_ready_partitions_and_remove_grads",
        "reduce_independent_p_g_buckets_and_remove_grads",
        "reduce_ipg_grads",
        "overlapping_partition_gradients_reduce_epilogue",
        "independent_gradient_partition_epilogue",
        "reduce_partition_and_remove_grads",  # ZeRO-3's gradient hook (stage3.py, create_reduce_and_remove_grad_hooks)
        # ZeRO-3's module hooks and parameter gathering run inside forward/backward
        "fetch_sub_module",
        "_fetch_sub_module_impl",
        "record_parameters",
        "pre_sub_module_forward_function",
        "post_sub_module_forward_function",
        "_pre_forward_module_hook",
        "_post_forward_module_hook",
        "_end_of_forward_hook",
        "_post_backward_module_hook",
    }
)


@dataclass(frozen=True)
class Frame:
    file: str
    lineno: int
    func: str
    line: LogLine


@dataclass
class Traceback:
    source: str
    rank: int | None
    start: LogLine
    frames: list[Frame] = field(default_factory=list)
    exc_type: str | None = None
    exc_message: str | None = None
    end: LogLine | None = None

    def contains(self, line: LogLine) -> bool:
        if line.source != self.source or (line.rank != self.rank and line.rank is not None):
            return False
        last = (
            self.end.lineno
            if self.end
            else (self.frames[-1].line.lineno if self.frames else self.start.lineno)
        )
        return self.start.lineno <= line.lineno <= last


@functools.cache
def _marker_pattern(kind: str) -> re.Pattern[str]:
    return re.compile(EXTRACTOR_PATTERNS["phase-" + kind])


def _marker_after_progress(kind: str, text: str) -> bool:
    """Whether a phase marker printed on a progress bar's line comes after the bar (a script's print() while the bar
    stays on screen: `25% 1999/8000 [1:02:25<3:07:25,  1.87s/it, loss=0.296] SAVING CHECKPOINT...`): the marker is
    later than that progress. The line model splits text glued behind a bar into its own segment (reader.parse_line),
    so a marker segment of the bar's line that holds no bar itself is that text."""
    if parse_progress(text) is None and "it/s" not in text and "s/it" not in text:
        return True
    starts = [m.start() for m in _marker_pattern(kind).finditer(text)]
    bar = max(text.rfind("it/s"), text.rfind("s/it"))
    return bool(starts) and 0 <= bar < starts[-1]


def installing(tb: Traceback) -> bool:
    """Whether a traceback is a package's setup.py run by an installer: pip runs `python setup.py egg_info` /
    `bdist_wheel` through its shim (pip/_internal/utils/setuptools_build.py: `<pip-setuptools-caller>`), and the
    frames start in setup.py at module level."""
    return any(
        f.file == "<pip-setuptools-caller>"
        or f.func == "<module>"
        and f.file.replace("\\", "/").rsplit("/", 1)[-1] == "setup.py"
        for f in tb.frames
    )


@dataclass
class StackDump:
    """A stack dump of one thread (faulthandler / py-spy): its frames in the order printed, innermost first."""

    source: str
    rank: int | None
    head: LogLine | None
    fatal: bool
    frames: list[Frame] = field(default_factory=list)


def same_exception(tracebacks: list[Traceback], tb: Traceback) -> list[Traceback]:
    """Other tracebacks of the same source with the same exception and message: ranks that print one failure
    interleaved, each parsed traceback holding part of its frames."""
    if tb.exc_type is None:
        return []
    return [
        t
        for t in tracebacks
        if t is not tb
        and t.source == tb.source
        and t.exc_type == tb.exc_type
        and t.exc_message == tb.exc_message
    ][:MAX_TRACEBACKS]


@dataclass(frozen=True)
class OomNumbers:
    """A CUDA OOM message's numbers in GiB (None where the message format does not give them)."""

    tried: float | None
    total: float | None
    free: float | None
    allocated: float | None
    reserved_unallocated: float | None
    in_use: float | None
    gpu: int | None
    line: LogLine

    @property
    def verdict(self) -> str:
        """'fragmentation' when the allocator holds at least four times the request reserved but unallocated,
        'lack' when the memory is really not there, 'unknown' without the numbers.

        Four times, not once: expandable_segments turns that cache into usable memory, and the allocation that
        failed is one of many of its size in the step (a layer's activations, a gathered parameter), so a cache that
        holds only two or three more of them moves the OOM to the next ones. The threads where the cache held 1.4 to
        2.9 times the request were answered "the GPU is too small": 0.35 GiB cached for 0.25 GiB on a 14.56 GiB GPU
        (deepspeedai/DeepSpeed#3208), 0.57 GiB for 0.22 GiB on a 14.75 GiB L4 (FineTune-LLaVA-NeXT#2), 2.06 GiB for
        0.71 GiB on a 24 GiB RTX 3090 with 0 bytes free (abacaj/fine-tune-mistral#3, "needs multiple GPUs or qlora");
        the ones fixed by the allocator setting held 4.3 to 155 times the request (3.10 GiB for 20 MiB). And a cache
        that is a sliver of the device is not fragmentation either, however small the request: 0.15 GiB cached for a
        0.05 GiB request on a 79.33 GiB GPU holding 77.92 GiB (LlamaFactory#9510, the whole model loading on each
        GPU) is a full device, so the cache must also be at least 1 % of the device (0.5 GiB when the message does
        not give the device size).

        And the cache must be a real share of what the allocator holds: at least a quarter of the memory allocated to
        live tensors (PyTorch's own older hint, c10/cuda/CUDACachingAllocator.cpp: "If reserved memory is >> allocated
        memory try setting max_split_size_mb to avoid fragmentation"). A few per cent is the allocator's ordinary
        slack on a full device: threads with 2.6-12 % of it cached for a small request were answered "the GPU is too
        small" - 0.24 of 9.03 GiB for 16 MiB at a save (huggingface/peft#335), 0.92 of 22.07 GiB for 68 MiB on a
        4090 (oobabooga/textgen#1490), 2.85 of 73.95 GiB for 168 MiB (Instruction-Tuning-with-GPT-4/GPT-4-LLM#16),
        3.32 of 27.12 GiB (haotian-liu/LLaVA#1152); fragmentation that costs real memory shows reserved far above
        allocated (pytorch/pytorch#35901: about half the GPU unusable)."""
        if self.tried is None or self.reserved_unallocated is None:
            return "unknown"
        floor = 0.01 * self.total if self.total else 0.5
        cached = self.reserved_unallocated
        share = self.allocated is None or cached >= FRAGMENTED_SHARE * self.allocated
        return "fragmentation" if cached >= 4 * self.tried and cached >= floor and share else "lack"

    @property
    def missing_gib(self) -> float | None:
        """How much this one allocation lacked (tried - free); the step usually needs more after it."""
        if self.tried is None or self.free is None:
            return None
        return max(self.tried - self.free, 0.0)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            k: (round(v, 2) if isinstance(v, float) else v)
            for k, v in {
                "tried_gib": self.tried,
                "total_gib": self.total,
                "free_gib": self.free,
                "allocated_gib": self.allocated,
                "reserved_unallocated_gib": self.reserved_unallocated,
                "in_use_gib": self.in_use,
                "gpu": self.gpu,
            }.items()
            if v is not None
        }
        d["verdict"] = self.verdict
        if self.missing_gib is not None:
            d["missing_gib"] = round(self.missing_gib, 2)
        d["line"] = self.line.location()
        return d

    def explain(self) -> str:
        def g(v: float | None) -> str:
            return "?" if v is None else f"{v:.2f} GiB"

        head = (
            f"The OOM numbers (GPU {self.gpu if self.gpu is not None else '?'}): tried to allocate {g(self.tried)}, "
            f"total {g(self.total)}, free {g(self.free)}, allocated by PyTorch {g(self.allocated)}, "
            f"reserved but unallocated {g(self.reserved_unallocated)}."
        )
        if self.verdict == "fragmentation":
            return head + (
                " Reserved-but-unallocated memory is larger than the request: the allocator's cache is "
                "fragmented, the memory is there. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
            )
        if self.verdict == "lack" and self.missing_gib is not None:
            return head + (
                f" Fragmentation is not the problem (only {g(self.reserved_unallocated)} reserved but unallocated): "
                f"this allocation alone was {self.missing_gib:.2f} GiB short, and the rest of the step needs more; "
                "reduce what lives on the GPU (offload, smaller micro-batch, more GPUs)."
            )
        return head


_ECHO_MARKERS = (
    "ncclremoteerror",
    "remote process exited",
    "remote peer",
    "watchdog",
    "timed out",
    "timeout",
    "connection closed",
    "connection reset",
    "broken pipe",
    "processgroup",
)
_OWN_NCCL_MARKERS = (
    "ncclsystemerror",
    "ncclinternalerror",
    "ncclunhandledcudaerror",
    "ncclinvalidusage",
    "unhandled system error",
    "unhandled cuda error",
    "internal error",
    "invalid usage",
)


@dataclass
class Event:
    """A failure line: an exception, an OOM, a launcher exit or signal, an NCCL error."""

    kind: str  # exception | cuda-oom | host-oom | exit | nccl | watchdog
    line: LogLine
    seq: int
    rank: int | None
    detail: str
    exit_code: int | None = None
    pid: int | None = None
    progress: Progress | None = None
    traceback: Traceback | None = None
    phase: str = "unknown"

    @property
    def severity_class(self) -> int:
        """0 = a root failure (a rank died on its own), 1 = collective trouble (often the echo of a death
        or a hang), 2 = the launcher's summary or teardown of the other ranks."""
        if self.kind in ("cuda-oom", "host-oom"):
            return 0
        if self.kind == "exit":
            # (SIGINT, -2 / 130: a user's Ctrl-C, a stop from outside like SIGTERM; SIGHUP -1 / 129 and SIGQUIT -3 /
            # 131, the other death signals torch's elastic agent hands on to its workers - elastic/multiprocessing/
            # api.py installs _terminate_process_handler for SIGTERM, SIGINT, SIGHUP and SIGQUIT: a closed terminal or
            # ssh session, a Ctrl-\; a negative code is a signal that ended the process, never its own exit status)
            if self.exit_code is None or self.exit_code in (1, -15, 15, 143, 0, -2, 2, 130, -1, 129, -3, 131):
                return 2
            return 1 if self.exit_code in (-6, 6, 134) else 0
        if self.kind in ("nccl", "watchdog"):
            return 1
        if self.kind == "exception":
            t = (self.traceback.exc_type if self.traceback else None) or ""
            msg = self.detail
            # (the type from the traceback, or from the exception line itself when the paste has no traceback)
            if (t or msg.split(":", 1)[0]).endswith(("ChildFailedError", "KeyboardInterrupt", "SystemExit", "SignalException")):
                return 2
            if (t or msg.split(":", 1)[0]).endswith("UnhandledCudaError"):
                # NCCL's result name, the line below torch's DistBackendError (`ncclUnhandledCudaError: Call to CUDA
                # function failed.`): the same failure as the NCCL error line above it, not a second one
                return 1
            low = (t + " " + msg).lower()
            # Collective trouble that waits on another rank (a remote rank exited, a watchdog timeout, a closed
            # connection) is class 1, whatever the exception type; torch prints `ncclRemoteError: ...` as an
            # exception line of its own. An NCCL system/internal error on this rank (ncclSystemError: a
            # failed shm allocation) is this rank's own failure.
            if any(m in low for m in _ECHO_MARKERS) or (
                ("nccl" in low or "distbackenderror" in low) and not any(m in low for m in _OWN_NCCL_MARKERS)
            ):
                return 1
            return 0
        return 1

    @property
    def kernel_log(self) -> bool:
        """A GPU driver's kernel-log line (native_messages: NVRM Xid / off the bus): no rank printed it, and its place
        in a paste (dmesg pasted below a training log) says nothing about when it happened."""
        return self.detail.startswith("NVRM")

    def who(self) -> str:
        if self.kernel_log:
            return "the GPU driver, in the kernel log"
        return f"rank {self.rank}" if self.rank is not None else "a rank"

    def describe(self) -> str:
        return f"{self.who()} at {self.line.location()}: {self.detail}"


@dataclass
class Facts:
    """Everything the extractor found."""

    events: list[Event] = field(default_factory=list)
    tracebacks: list[Traceback] = field(default_factory=list)
    ooms: list[OomNumbers] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    version_lines: list[LogLine] = field(default_factory=list)
    markers: list[tuple[str, LogLine, int]] = field(default_factory=list)  # (phase marker, line, seq)
    # source lines of traceback frames that name what the run was doing: (phase, line), read inside tracebacks
    code_hints: list[tuple[str, LogLine]] = field(default_factory=list)
    signature_hits: dict[str, dict[str, int]] = field(default_factory=dict)  # entry -> sig -> count
    signature_lines: dict[str, dict[str, list[tuple[int, LogLine]]]] = field(default_factory=dict)
    warnings: list[tuple[str, LogLine]] = field(default_factory=list)  # (KB entry id, line), deduplicated
    interrupts: list[LogLine] = field(default_factory=list)  # a user's Ctrl-C (`^C`, KeyboardInterrupt)
    # libstdc++'s `terminate called without an active exception` printed after the run's end (no failure of its own:
    # the abort that follows it is, and names it)
    late_terminates: list[LogLine] = field(default_factory=list)
    last_progress: Progress | None = None
    accumulation: int | None = None  # gradient accumulation the run printed (micro-steps per optimizer step)
    # the HF Trainer's save / evaluation interval in steps, as the run printed them (command line, arguments, config)
    save_steps: int | None = None
    eval_steps: int | None = None
    end_phase: str = (
        "unknown"  # the phase where the log ends (markers and progress), for failures with no event
    )
    # the distributed set-up's last line, when the log prints nothing after it (no progress, no phase, no failure)
    ends_after_init: LogLine | None = None
    # the ranks whose lines the scanned logs hold (a `[rankN]:` prefix, a per-rank file), read from the lines that hit
    ranks_in_log: set[int] = field(default_factory=set)
    # the first line in which the paste says the run stopped moving (patterns.py `said-stalled`), outside tracebacks
    said_stalled: LogLine | None = None


def _gib(m: re.Match[str]) -> float | None:
    groups = [g for g in m.groups() if g is not None]
    v = log_float(groups[0])
    return None if v is None else v * _UNITS[groups[1]]


def rank_of_file(source: str) -> int | None:
    """The rank a log file's name or directory says it holds (None when it says none)."""
    return _rank_of_file(source)


@functools.cache
def _rank_of_file(source: str) -> int | None:
    """A rank from a file's name (`rank3.log`, `worker_3.out`) or, in torchrun's --log-dir tree
    (`attempt_0/3/stderr.log`, `.../3/error.json`), from its directory."""
    parts = source.replace("\\", "/").rsplit("/", 2)
    m = _RANK_IN_NAME.search(parts[-1])
    if m:
        return log_int(m.group(1))
    if len(parts) >= 2 and parts[-2].isdigit() and parts[-1].lower() in _TORCHRUN_FILES:
        return log_int(parts[-2])
    return None


_TORCHRUN_FILES = frozenset({"stdout.log", "stderr.log", "error.json", "stdout", "stderr"})


def _neg(v: int | None) -> int | None:
    return None if v is None else -v


def parse_oom(line: LogLine) -> OomNumbers | None:
    vals: dict[str, float | None] = {}
    for name, rx in _OOM_FIELDS.items():
        m = rx.search(line.text)
        vals[name] = _gib(m) if m else None
    if vals["tried"] is None:
        return None
    ru = vals["reserved_unallocated"]
    if ru is None and vals["reserved_total"] is not None and vals["allocated"] is not None:
        ru = max(vals["reserved_total"] - vals["allocated"], 0.0)  # old format: reserved - allocated
    g = _GPU.search(line.text)
    return OomNumbers(
        vals["tried"],
        vals["total"],
        vals["free"],
        vals["allocated"],
        ru,
        vals["in_use"],
        log_int(g.group(1)) if g else None,
        line,
    )


class Extractor:
    """Feed Hits in order (`feed`), then read `facts` (after `finish`)."""

    def __init__(self) -> None:
        self.facts = Facts()
        self._open: dict[tuple[str, int | None], Traceback] = {}
        self._elastic_rank: dict[str, tuple[int, int, int]] = {}  # source -> (rank, local_rank, lineno)
        self._pid_rank: dict[int, int] = {}
        self._last_source = ""
        self._last_seq = 0
        # the last training progress line seen per log, and the bar printed right after a failure that had none before
        # it (matched as the bars come: nothing is kept per progress update, a hit-dense log has many)
        self._last_bar: dict[str, int] = {}
        self._bar_after_event: dict[int, Progress] = {}
        # IPython tracebacks (type named in the header): emitted at the end if no exception line closed them
        self._ipy: list[tuple[Traceback, str, Hit]] = []
        self._asserts: list[tuple[LogLine, Hit]] = []  # `assert ...` / `raise ...(` source lines
        self._kernel_assert: set[str] = set()  # sources with a CUDA kernel assertion event already
        self._size_mismatch: set[str] = (
            set()
        )  # sources with a load_state_dict size-mismatch line read already
        self._cpp_type: dict[
            str, tuple[str, int]
        ] = {}  # source -> (C++ exception type, line) of `terminate ...`
        # the last error line of torch's C++ logging per source (patterns.py `glog-error`): (line, hit, message)
        self._glog_error: dict[str, tuple[LogLine, Hit, str]] = {}
        self._teardown: tuple[LogLine, Hit] | None = None  # DeepSpeed's launcher killing the other ranks
        self._ninja_ext: dict[
            str, str
        ] = {}  # source -> the last JIT-built extension's name (ninja's compile line)
        self._ninja_stop: tuple[LogLine, Hit] | None = None  # ninja's `build stopped: subcommand failed`
        self._not_found: list[
            tuple[LogLine, Hit, str]
        ] = []  # a shell's `X: command not found` (finish decides)
        # Python's import failure quoted inside a line (a logger's warning, prose), and argparse's refusal of a
        # command line: finish decides, as for a command not found - a library that logs a failed optional import
        # and goes on, a script that runs on after one of its commands was refused, are no failure
        self._quoted_imports: list[tuple[LogLine, Hit, str]] = []
        # CPython's report of an exception it could not raise (Python/errors.c format_unraisable /
        # sys.unraisablehook: `Exception ignored in: <finalize object ...>` then its traceback): the line that said
        # so per source and rank, and the tracebacks it introduces - the process goes on, no failure
        self._unraisable: dict[tuple[str, int | None], int] = {}
        self._ignored_tbs: set[int] = set()
        # pip failing to build a package: the compiler's exit (setuptools) and the wheel pip could not build; and the
        # seq of pip's last `Successfully installed` (a failed wheel that pip then installed otherwise is no failure)
        self._pip_cmd: tuple[LogLine, Hit, str] | None = None
        self._pip_wheel: tuple[LogLine, Hit, str] | None = None
        self._pip_ok: dict[str, int] = {}
        self._dist_init: tuple[LogLine, Hit] | None = None  # the distributed set-up's last line
        self._last_frame: tuple[LogLine, Hit] | None = None  # the last traceback frame line read
        # a traceback header's hit, for its training progress (frame lines get none: scan.FAILURE_KEYS); the
        # traceback is kept in the value so its id stays its own
        self._head_hit: dict[int, tuple[Traceback, Hit]] = {}
        self._build_seq: dict[str, int] = {}  # source -> where its latest JIT build started (torch's line)
        self._tool_fail: tuple[LogLine, Hit] | None = (
            None  # the toolchain failing a JIT build (its first line)
        )
        # source -> seq of gcc's `compilation terminated.` (the compiler stopping on a fatal error)
        self._cc_stopped: dict[str, int] = {}
        self._nvcc_cmd: dict[str, int] = {}  # source -> seq of its first nvcc command line
        # failure lines that are the run's failure only if the run did not go on or finish before them (finish)
        self._unless_outlived: list[tuple[str, LogLine, Hit, str, int | None, bool]] = []
        self._dumps: list[tuple[StackDump, Hit]] = []  # faulthandler / py-spy stack dumps
        self._hang_main: dict[
            int, Traceback
        ] = {}  # a hang's dumped stack -> the main thread's stack of that dump
        self._fatal_at: dict[str, int] = {}  # source -> line of CPython's last `Fatal Python error: `
        self._guard_lines: list[LogLine] = []  # the guard's own lines (set in finish)
        self._gradient_sources: set[str] = set()  # sources whose watchdog names a gradient reduction (finish)
        self._last_other_seq = -1  # the seq of the last hit that was not one phase marker alone (_marker)
        self._vscode_head: tuple[LogLine, Hit, str] | None = None  # VS Code's `Exception has occurred: X` (_exception)
        self._end_progress: Mapping[str, Progress | None] = {}  # the scan's progress past each log's last hit (finish)

    # ---- feeding ------------------------------------------------------------------------------------

    def feed(self, hit: Hit) -> None:
        line = hit.line
        self._last_source, self._last_seq = line.source, hit.seq
        if line.rank is None:
            rank = _rank_of_file(line.source)
            if rank is not None:
                line = LogLine(line.source, line.lineno, line.text, rank, line.host, line.timestamp)
        if line.rank is not None and len(self.facts.ranks_in_log) < 4096:
            self.facts.ranks_in_log.add(line.rank)
        if hit.progress is not None:
            self.facts.last_progress = hit.progress
            self._bar(line.source, hit.progress)
        head = self._vscode_head
        if head is not None and not (head[0].source == line.source and head[0].lineno + 1 == line.lineno):
            self._vscode_message(None, None)  # (its message line was no hit: the type alone)
            head = None
        events_before = len(self.facts.events)
        keys = hit.keys
        warning_sigs = _warning_signatures()
        # sorted: a line that two entries' signatures match (the trace-cache warning) must give the same
        # entry whatever the hash seed (frozenset order)
        for k in sorted(keys):
            if k.startswith("kb:"):
                _, entry, sig = k.split(":", 2)
                if (entry, sig) in warning_sigs:
                    self._warning(entry, line)
                counts = self.facts.signature_hits.setdefault(entry, {})
                counts[sig] = counts.get(sig, 0) + 1
                lines = self.facts.signature_lines.setdefault(entry, {}).setdefault(sig, [])
                if len(lines) < MAX_EVIDENCE:
                    lines.append((hit.seq, line))
        if "x:said-stalled" in keys and self.facts.said_stalled is None and self._open_tb(line) is None:
            self.facts.said_stalled = line
        if "x:unraisable" in keys:
            self._unraisable[(line.source, line.rank)] = line.lineno
        if "x:tb-head" in keys:
            tb = self._start_tb(line)
            if 0 < line.lineno - self._unraisable.get((line.source, line.rank), -9) <= 2:
                self._ignored_tbs.add(id(tb))
            if hit.progress is not None and len(self._head_hit) < MAX_TRACEBACKS:
                self._head_hit[id(tb)] = (tb, hit)
            ipy = _IPY_HEAD.match(line.text)
            if ipy and len(self._ipy) < MAX_TRACEBACKS:
                self._ipy.append((tb, ipy.group(1), hit))
        # (a line the frame patterns hit that holds no whole frame - a header cut at the end of a paste - is none)
        if "x:tb-frame" in keys:
            if self._frame(line):
                self._last_frame = (line, hit)
        elif "x:tb-frame-ipy" in keys and self._frame(line, ipython=True):
            self._last_frame = (line, hit)
        if "x:tb-exception" in keys:
            self._exception(line, hit)
        elif "x:quoted-kwarg" in keys:
            self._exception(line, hit)  # (CPython's keyword refusal quoted with no `TypeError: ` before it)
        if "x:config-validation" in keys and not _EXC.match(line.text):
            # a pydantic error line mangled by interleaved ranks (".ValidationError: 3 validation errors ...")
            m = _VALIDATION.search(line.text)
            if m:
                self._event("exception", line, hit, f"ValidationError: {m.group(0)}")
        if "x:glog-error" in keys:
            g = _GLOG_ERROR.match(line.text)
            if g is not None:
                self._glog_error[line.source] = (line, hit, g.group(1).strip())
        if "x:cpp-raised" in keys and not _EXC.match(line.text):
            self._cpp_raised(line)
        if "x:cpp-terminate" in keys:
            t = _TERMINATE.search(line.text)
            if t:
                self._cpp_type[line.source] = (t.group(1), line.lineno)
        if "x:cpp-what" in keys and not _EXC.match(line.text):
            w = _WHAT.search(line.text)
            c = self._cpp_type.get(line.source)
            # `what():` right after (or on the same line as) a `terminate called ...`: the process aborted on it
            # (other threads aborting at the same time print `terminate called recursively` in between: a few lines)
            if w and c is not None and 0 <= line.lineno - c[1] <= 3:
                what = w.group(1).strip()
                kind = "cuda-oom" if DEVICE_OOM.search(what) else "exception"
                self._event(kind, line, hit, f"{c[0]}: {what}"[:300])
        # a message printed below Python (native_messages.py: the table, its sources)
        if "x:native" in keys and not _EXC.match(line.text):
            native = native_messages.read_line(line.text, line.host)
            if native is not None:
                self._event(native.kind, line, hit, native.detail, rank=native.values.get("rank"))
        if "x:bare-oserror" in keys and not _EXC.match(line.text):
            b = _BARE_OSERROR.match(line.text)
            if b:  # the whole line is the error (a bare `[Errno N] ...`), not a word inside a message
                self._event("exception", line, hit, f"OSError: {b.group(0).strip()}"[:300])
        if "x:cuda-check-return" in keys and "x:oom-cuda" not in keys and not _EXC.match(line.text):
            ccr = _CUDA_CHECK_RETURN.search(line.text)
            if ccr is not None:  # the process exits right after it: the failure, in the kernel library's words
                self._event("exception", line, hit, f"RuntimeError: CUDA error: {ccr.group(0)}"[:300])
        if "x:dist-init" in keys:
            self._dist_init = (line, hit)
        if "x:argparse" in keys and not _EXC.match(line.text):
            a = ARGPARSE.match(line.text)
            if a is not None and len(self._quoted_imports) < MAX_EVENTS:
                # (finish decides, as for a quoted import: a script of several commands goes on after one refused)
                said = f"{ARGPARSE_TYPE}: {a.group(1).strip()}: {a.group(2).strip()}"
                self._quoted_imports.append((line, hit, said))
        if "x:xtuner-cmd-error" in keys:
            x = _XTUNER_CMD_ERROR.search(line.text)
            if x is not None and len(self._quoted_imports) < MAX_EVENTS:
                # (the exception's str() only: its type is not printed; finish decides, as for argparse's refusal)
                said = f"xtuner command error: {x.group(1).strip()}"
                if _CHILD_FAILED.search(x.group(1)):
                    # xtuner >= 0.2 runs its train mode as `subprocess.run([...torchrun...], check=True)` in that
                    # try: the CalledProcessError of a child that failed after it printed its end is still that
                    # run's failure
                    self._defer("exception", line, hit, said, ends=False)
                else:
                    self._quoted_imports.append((line, hit, said))
        if "x:cuda-kernel-assert" in keys and line.source not in self._kernel_assert:
            ka = _KERNEL_ASSERT.search(line.text)
            if ka:  # one event per log: every GPU thread prints the same assertion
                self._kernel_assert.add(line.source)
                what = f"RuntimeError: CUDA device-side assertion in {ka.group(1)}: {ka.group(2)}"
                self._event("exception", line, hit, what[:300])
        if "x:c10d-socket" in keys and not _EXC.match(line.text):
            sock = _C10D_SOCKET.search(line.text)
            if sock:  # logged, then raised as DistNetworkError (a paste may keep only the log line)
                what = f"torch.distributed.DistNetworkError: {sock.group(1).strip()}"
                self._event("exception", line, hit, what[:300])
        if "x:load-copy-error" in keys and not _EXC.match(line.text):
            self._event("exception", line, hit, "RuntimeError: " + clip(line.text.strip(), 280))
        if "x:load-size-mismatch" in keys and line.source not in self._size_mismatch:
            # torch's load_state_dict error lists one `size mismatch for NAME: ...` line per parameter under its
            # `RuntimeError: Error(s) in loading state_dict for X:` line; a paste that starts inside that list still
            # shows the failure: one event per log, unless the RuntimeError line itself was read already
            self._size_mismatch.add(line.source)
            if not any(e.line.source == line.source and e.kind == "exception" for e in self.facts.events):
                what = "RuntimeError: Error(s) in loading state_dict: " + clip(line.text.strip(), 260)
                self._event("exception", line, hit, what)
        device_oom_line = False
        if "x:oom-cuda" in keys:
            oom = parse_oom(line)
            if oom is not None and len(self.facts.ooms) < MAX_EVENTS:
                self.facts.ooms.append(oom)
            # an OOM printed without "...Error:" (logged, not raised; a glog FATAL line; NCCL's WARN; the message
            # line under `ResourceExhaustedError:`): with its numbers, or in words only a failed allocation prints
            device_oom_line = not _EXC.match(line.text) and (
                oom is not None or DEVICE_OOM.search(line.text) is not None
            )
            if device_oom_line:
                self._event("cuda-oom", line, hit, clip(line.text.strip(), 300))
        if "x:oom-host" in keys:
            # (srun names the task the OOM killer ended, its global rank: `srun: error: node12: task 3: Out Of Memory`)
            task = _SRUN_TASK.search(line.text)
            self._event(
                "host-oom", line, hit, clip(line.text, 300), rank=log_int(task.group(1)) if task else None
            )
        self._launcher(line, hit, keys)
        if "x:ninja-ext" in keys:
            x = _NINJA_EXT.search(line.text)
            if x and line.source not in self._build_seq:
                self._build_seq[line.source] = hit.seq
            if x:
                self._ninja_ext[line.source] = x.group(1)
        if "x:phase-engine" in keys:
            if "ninja: build stopped" in line.text and self._ninja_stop is None:
                self._ninja_stop = (line, hit)
            b = _BUILDING_EXT.search(line.text)
            if b:  # torch's _jit_compile: `Building extension module NAME...` (before ninja's compile lines)
                self._build_seq[line.source] = hit.seq
                self._ninja_ext.setdefault(line.source, b.group(1))
        if "x:shell-not-found" in keys and not _EXC.match(line.text) and len(self._not_found) < MAX_EVENTS:
            nf = NOT_FOUND.search(line.text)
            cmd = next((g for g in nf.groups() if g), None) if nf else None
            if cmd is not None:
                self._not_found.append((line, hit, cmd))
        # the first failing line of the latest build (an earlier, harmless test compile does not name it)
        if (
            "x:toolchain-failed" in keys
            and _TOOLCHAIN_FAILED.search(line.text)
            and (self._tool_fail is None or self._tool_fail[1].seq < self._build_seq.get(line.source, -1))
        ):
            self._tool_fail = (line, hit)
        if "x:nvcc-cmd" in keys:
            self._nvcc_cmd.setdefault(line.source, hit.seq)
        stopped = _CC_STOPPED.search(line.text) if "x:toolchain-failed" in keys else None
        if stopped is not None and (
            stopped.group(0).startswith("compilation")
            or min(self._build_seq.get(line.source, hit.seq), self._nvcc_cmd.get(line.source, hit.seq)) < hit.seq
        ):
            # (nvcc's own fatal line counts where a compile shows before it: quoted alone, it is advice)
            self._cc_stopped[line.source] = hit.seq
        if "x:ds-backend-unset" in keys and not _EXC.match(line.text):
            d = _DS_BACKEND.search(line.text)
            if d:  # the assertion's message pasted alone
                self._event("exception", line, hit, f"AssertionError: {d.group(0)}")
        if (
            "x:ds-init-assert" in keys
            and not _EXC.match(line.text)
            and quoted_exception(line.text, line.raw) is None
            and len(self._quoted_imports) < MAX_EVENTS
        ):
            d = _DS_INIT.search(line.text)
            # deepspeed.initialize's assertion pasted without its type (finish decides, as for a quoted import); not
            # the `assert ..., "message"` statement itself, quoted from deepspeed/__init__.py or a traceback's frame
            if d and "assert " not in line.text[: d.start()] and self._open_tb(line) is None:
                self._quoted_imports.append((line, hit, f"AssertionError: {d.group(0)}"))
        if "x:fh-head" in keys:
            self._dump_head(line, hit)
        if "x:fh-frame" in keys:
            self._dump_frame(line, hit)
        if "x:pip-build" in keys:
            self._pip_build(line, hit)
        if "x:cuda-mismatch" in keys:
            self._cuda_mismatch(line, hit)
        if "x:ninja-failed" in keys and self._ninja_stop is None:
            self._ninja_stop = (line, hit)  # the step that failed comes first; `build stopped` follows it
        w = _WATCHDOG_EXC.search(line.text) if "x:nccl-watchdog-exc" in keys else None
        if w is not None and not _TIMEOUT_WORDS.search(w.group(1)):
            # the watchdog thread died of a CUDA fault it surfaced (not a timeout): that fault is the failure
            what = w.group(1).strip()
            self._event(
                "cuda-oom" if DEVICE_OOM.search(what) else "exception", line, hit, f"c10::Error: {what}"[:300]
            )
        elif "x:nccl-watchdog" in keys:
            self._event("watchdog", line, hit, clip(line.text, 300))
        elif keys & {"x:nccl-error", "x:nccl-peer"} and not _EXC.match(line.text) and not device_oom_line:
            self._event("nccl", line, hit, clip(line.text, 300))
        if any(k.startswith("x:ver-") for k in keys):
            self._version(line)
        if "x:interrupt" in keys and len(self.facts.interrupts) < MAX_EVENTS:
            self.facts.interrupts.append(line)
        if "x:interval" in keys:
            for iv in INTERVAL.finditer(line.text):
                steps = log_int(iv.group(2))
                if steps:
                    if iv.group(1) == "save":
                        self.facts.save_steps = steps
                    else:
                        self.facts.eval_steps = steps
        if "x:accum" in keys:
            m = ACCUM.search(line.text)
            if m:
                self.facts.accumulation = log_int(m.group(1))
        for k in sorted(keys):
            if k in ("x:code-assert", "x:code-raise"):
                if len(self._asserts) < MAX_EVENTS:
                    self._asserts.append((line, hit))
            elif k.startswith("x:code-") and len(self.facts.code_hints) < MAX_EVENTS:
                self.facts.code_hints.append((_CODE_PHASE[k[len("x:code-") :]], line))
            elif (
                k.startswith("x:msg-")
                and len(self.facts.code_hints) < MAX_EVENTS
                # (the Trainer raises its resume refusal as a ValueError; forks print the same words as a note and
                # train from scratch: review R6)
                and (k != "x:msg-resume" or "ValueError" in line.text)
            ):
                self.facts.code_hints.append((_MESSAGE_PHASE[k[len("x:msg-") :]], line))
            if k.startswith("x:phase-"):
                self._marker(k[len("x:phase-") :], line, hit.seq, plain=len(keys) == 1)
        if len(keys) != 1 or not next(iter(keys)).startswith("x:phase-"):
            self._last_other_seq = hit.seq
        if head is not None and self._vscode_head is head:
            # the line below VS Code's `Exception has occurred: X` is X's message, unless it is a failure of its own
            # or the traceback the terminal printed (that names the failure, with its frames: review R6)
            if len(self.facts.events) == events_before and not keys & _TB_KEYS:
                self._vscode_message(line, hit)
            self._vscode_head = None

    def _vscode_message(self, line: LogLine | None, hit: Hit | None) -> None:
        """The exception VS Code's widget showed: its type's line and the message below it (the type alone when the
        message line holds nothing the scan hits)."""
        if self._vscode_head is None:
            return
        head_line, head_hit, exc_type = self._vscode_head
        self._vscode_head = None
        # (finish decides, as for the other pasted forms: a run that went on after it was not stopped by it)
        if line is None or hit is None:
            self._defer("exception", head_line, head_hit, exc_type)
            return
        message = line.text.strip()
        kind = "cuda-oom" if device_oom(exc_type, message) else "exception"
        self._defer(kind, line, hit, f"{exc_type}: {message}"[:300])

    def _marker(self, kind: str, line: LogLine, seq: int, *, plain: bool) -> None:
        """Keep a phase marker. A line that is only a marker, of the kind and log of the marker before it with no
        other hit between them, replaces that marker: what reads the markers asks for the last one before a line or
        whether one follows a line, and both answer the same; a run of bars that do not collapse in the scan
        (interleaved ranks' `[rankN]:` bars, CRLF bars) would otherwise push the markers before a failure out of the
        bounded list and leave it without a phase (review R4). The guard's markers are each read (`_guard_lines`)."""
        markers = self.facts.markers
        if plain and kind != "guard" and markers:
            last_kind, last_line, last_seq = markers[-1]
            if last_kind == kind and last_line.source == line.source and self._last_other_seq < last_seq:
                markers[-1] = (kind, line, seq)
                return
        markers.append((kind, line, seq))
        if len(markers) > 4 * MAX_EVENTS:
            del markers[:MAX_EVENTS]

    def _warning(self, entry: str, line: LogLine) -> None:
        """Keep the first occurrence of each distinct warning text the KB marks as mattering."""
        text = line.text.strip()
        if len(self.facts.warnings) < MAX_WARNINGS and all(
            w.text.strip() != text for _e, w in self.facts.warnings
        ):
            self.facts.warnings.append((entry, line))

    def _dump_head(self, line: LogLine, hit: Hit) -> None:
        if "Fatal Python error: " in line.text:
            self._fatal_at[line.source] = line.lineno
            return
        if len(self._dumps) < MAX_TRACEBACKS:
            fatal = 0 <= line.lineno - self._fatal_at.get(line.source, -99) <= 3
            self._dumps.append((StackDump(line.source, line.rank, line, fatal), hit))

    def _dump_frame(self, line: LogLine, hit: Hit) -> None:
        m = _FH_FRAME.search(line.text)
        if m:
            file, lineno, func = m.group(1), m.group(2), m.group(3)
        else:
            p = _PYSPY_FRAME.match(line.text)
            if p is None:
                return
            file, lineno, func = p.group(2), p.group(3), p.group(1)
        dump = next(
            (d for d, _h in reversed(self._dumps) if d.source == line.source and d.rank == line.rank), None
        )
        last = (
            dump.frames[-1].line
            if dump is not None and dump.frames
            else dump.head
            if dump is not None
            else None
        )
        if dump is None or last is None or not 0 < line.lineno - last.lineno <= 2:
            # frames with no header of their own (the paste starts below it)
            if len(self._dumps) >= MAX_TRACEBACKS:
                return
            dump = StackDump(line.source, line.rank, None, False)
            self._dumps.append((dump, hit))
        if len(dump.frames) < MAX_FRAMES:
            dump.frames.append(Frame(file, log_int(lineno) or 0, func.rsplit(".", 1)[-1], line))

    def _fatal_dump_phase(self, ev: Event) -> str:
        """A process that died on a signal with faulthandler on prints `Fatal Python error: Segmentation fault` and
        its stack (Python/faulthandler.c faulthandler_fatal_error): the stack places the death."""
        for dump, _hit in self._dumps:
            if (
                dump.fatal
                and dump.frames
                and dump.head is not None
                and dump.source == ev.line.source
                and 0 <= dump.head.lineno - ev.line.lineno <= 3
            ):
                tb = Traceback(dump.source, dump.rank, dump.head, list(reversed(dump.frames)))
                return self._phase_from_frames(tb, ev)
        return "unknown"

    def _stack_dump(self) -> None:
        """A stack dump of a process that had not failed (no exception, no exit in the log): someone dumped a
        stuck run (faulthandler.dump_traceback_later / register, py-spy dump), so the run hung where the dump
        shows it; the thread waiting in a collective is the one that says where, else the deepest stack."""
        if self.facts.events:
            return

        def outlived(d: StackDump, h: Hit) -> bool:
            # a phase marker after the dump (a save, an evaluation, the end of training): the run went on, so the
            # dump was a periodic one (faulthandler.dump_traceback_later(repeat=True)) or of a slow moment
            end = h.file_index * (1 << 40) + d.frames[-1].line.lineno
            return any(m_seq > end and m_line.source == d.source for _k, m_line, m_seq in self.facts.markers)

        dumps = [(d, h) for d, h in self._dumps if d.frames and not d.fatal and not outlived(d, h)]
        if not dumps:
            return

        def waits(d: StackDump) -> bool:
            return any(w in f.file.replace("\\", "/") for f in d.frames[:3] for w in WAIT_FILES)

        dump, hit = max(dumps, key=lambda dh: (waits(dh[0]), len(dh[0].frames)))
        start = dump.head or dump.frames[0].line
        tb = Traceback(dump.source, dump.rank, start, list(reversed(dump.frames)))
        tb.end = dump.frames[-1].line
        inner = dump.frames[0]
        where = f'File "{inner.file}", line {inner.lineno} in {inner.func}'
        self._event("watchdog", start, hit, f"{HANG_DUMP}{where}"[:300], traceback=tb)
        # py-spy names each thread (`Thread 46 (idle): "MainThread"`, py-spy src/dump.rs print_trace): the main
        # thread runs the training loop that the waiting thread serves, so its stack places the hang when the
        # waiting thread's own frames (a collective, a prefetch worker) do not
        main = next(
            (
                d
                for d, _h in dumps
                if d is not dump
                and d.source == dump.source
                and d.rank == dump.rank
                and d.head is not None
                and _PYSPY_MAIN.search(d.head.text)
            ),
            None,
        )
        if main is not None:
            self._hang_main[id(tb)] = Traceback(
                main.source, main.rank, main.frames[0].line, list(reversed(main.frames))
            )

    def _open_tb(self, line: LogLine) -> Traceback | None:
        """The traceback this frame or exception line continues: its rank's, else one opened just above it with no
        rank prefix - torchrun's `[rankN]: ` prefix is lost when the header is glued behind a progress bar that
        another process printed (`46%|...| 464/1000 [...]Traceback (most recent call last):`, then
        `[rank0]:   File ...`), and that traceback becomes this rank's."""
        tb = self._open.get((line.source, line.rank))
        if tb is not None or line.rank is None:
            return tb
        bare = self._open.get((line.source, None))
        if bare is None:
            return None
        last = bare.frames[-1].line.lineno if bare.frames else bare.start.lineno
        if not 0 < line.lineno - last <= 3:
            return None
        del self._open[(line.source, None)]
        bare.rank = line.rank
        self._open[(line.source, line.rank)] = bare
        return bare

    def _start_tb(self, line: LogLine) -> Traceback:
        tb = Traceback(line.source, line.rank, line)
        self._open[(line.source, line.rank)] = tb
        if len(self.facts.tracebacks) < MAX_TRACEBACKS:
            self.facts.tracebacks.append(tb)
        return tb

    def _frame(self, line: LogLine, *, ipython: bool = False) -> bool:
        """Read a frame line into its traceback; False when the line holds no whole frame."""
        m = (_IPY_FRAME if ipython else _FRAME).search(line.text)
        if not m:
            m = (_RICH_FRAME if ipython else _CUT_FRAME).search(line.text)
        if not m:
            return False
        tb = self._open_tb(line) or self._start_tb(line)
        if len(tb.frames) >= MAX_FRAMES:
            del tb.frames[0]
        func = m.group(3).rsplit(".", 1)[
            -1
        ]  # IPython: `DeepSpeedEngine._configure_optimizer` -> the function
        tb.frames.append(Frame(m.group(1), log_int(m.group(2) or "0") or 0, func, line))
        return True

    def _exception(self, line: LogLine, hit: Hit) -> None:
        vscode = _VSCODE_EXC.match(line.text)
        if vscode is not None and self._open_tb(line) is None:
            self._vscode_head = (line, hit, vscode.group(1))  # (its message is the next line: feed joins them)
            return
        m = _EXC.match(line.text) or _RUNPY.search(line.text)
        if not m and "╯" in line.text:
            # a rich traceback box flattened onto one line (a paste that lost its newlines, a quoted comment): the
            # exception rich prints below the box's bottom border (rich/traceback.py _render_exception) follows `╯`
            m = _EXC.match(line.text.rsplit("╯", 1)[1])
        if not m:
            quoted = (
                _QUOTED_IMPORT.search(line.text)
                or _QUOTED_DTYPE.search(line.text)
                or _QUOTED_HF_ARGS.search(line.text)
            )
            if quoted is not None and self._open_tb(line) is None:
                if len(self._quoted_imports) < MAX_EVENTS:
                    self._quoted_imports.append((line, hit, f"{quoted.group(1)}: {quoted.group(2)}"))
                return
            m = quoted
            said = (
                quoted_exception(line.text, line.raw) if m is None and self._open_tb(line) is None else None
            )
            if said is not None:
                # (finish decides, as for a quoted import: an exception the run went on after was no failure)
                if len(self._quoted_imports) < MAX_EVENTS:
                    self._quoted_imports.append((line, hit, f"{said[0]}: {said[1]}"))
                return
        if not m:
            return
        exc_type, message = m.group(1), (m.group(2) or "").strip()
        tb = self._open_tb(line)
        if tb is not None:
            del self._open[(line.source, line.rank)]
        if tb is not None:
            tb.exc_type, tb.exc_message, tb.end = exc_type, message, line
            if id(tb) in self._ignored_tbs:
                return  # an exception Python reported as ignored (a finalizer's, a __del__'s): the run went on
        if _ray_own(exc_type) and "OutOfMemoryError" in exc_type or "running low on memory" in message:
            kind = "host-oom"  # Ray's memory monitor killed a worker for host memory (not CUDA)
        elif device_oom(exc_type, message):
            kind = "cuda-oom"
        else:
            kind = "exception"
        sig = _CALLED_PROCESS_SIGNAL.search(message) if exc_type.endswith("CalledProcessError") else None
        if sig is not None:
            # a launcher (accelerate launch, a wrapper script) reporting that its child was killed by a signal: the
            # child's exit, as torchrun's `exitcode: -9` would report it
            code = log_int(sig.group(1) or sig.group(2))
            detail = f"{exc_type}: {message}"[:300]
            self._event(
                "exit", line, hit, detail, exit_code=None if code is None else -abs(code), traceback=tb
            )
            return
        self._event(kind, line, hit, f"{exc_type}: {message}"[:300] if message else exc_type, traceback=tb)

    def _launcher(self, line: LogLine, hit: Hit, keys: frozenset[str]) -> None:
        text = line.text
        if "x:launch-elastic-rank" in keys:
            m = _ELASTIC_RANK.search(text)
            g_rank, g_local = (log_int(m.group(1)), log_int(m.group(2))) if m else (None, None)
            if g_rank is not None and g_local is not None:
                self._elastic_rank[line.source] = (g_rank, g_local, line.lineno)
        if "x:launch-ds-rc" in keys:
            m = _DS_RC.search(text)
            if m:
                lr = _LOCAL_RANK_ARG.search(text)
                self._event(
                    "exit",
                    line,
                    hit,
                    text.strip()[-300:],
                    exit_code=log_int(m.group(1)),
                    rank=log_int(lr.group(1)) if lr else line.rank,
                )
            return
        if "x:launch-elastic-failed" in keys:
            m = _ELASTIC_FAILED.search(text)
            if m:
                fpid = log_int(m.group(3))
                self._event(
                    "exit",
                    line,
                    hit,
                    text.strip()[:300],
                    exit_code=log_int(m.group(1)),
                    rank=self._pid_rank.get(fpid, log_int(m.group(2)))
                    if fpid is not None
                    else log_int(m.group(2)),
                    pid=fpid,
                )
            return
        if "x:launch-elastic-exitcode" in keys:
            m = _ELASTIC_EXIT.search(text)
            if m:
                pid: int | None = log_int(m.group(2)) if m.group(2) else None
                rank = line.rank
                er = self._elastic_rank.get(line.source)
                if er is not None and 0 <= line.lineno - er[2] <= 4:
                    rank = er[0]
                    if pid is not None:
                        self._pid_rank[pid] = rank
                        for ev in self.facts.events:  # the summary names the global rank of a pid
                            if ev.pid == pid:
                                ev.rank = rank
                self._event(
                    "exit", line, hit, text.strip()[:300], exit_code=log_int(m.group(1)), rank=rank, pid=pid
                )
        if "x:launch-signal" in keys:
            m = _SIGNAL.search(text)
            if m:
                pid = log_int(m.group(3))
                self._event(
                    "exit",
                    line,
                    hit,
                    text.strip()[:300],
                    exit_code=_neg(log_int(m.group(1))),
                    rank=self._pid_rank.get(pid, line.rank) if pid is not None else line.rank,
                    pid=pid,
                )
        if "x:launch-mpirun" in keys:
            m = _MPIRUN.search(text)
            if m:
                self._event(
                    "exit",
                    line,
                    hit,
                    text.strip()[:300],
                    exit_code=_neg(log_int(m.group(4))),
                    rank=log_int(m.group(1)),
                    pid=log_int(m.group(2)),
                )
        if (
            "x:launch-killing" in keys
            and self._teardown is None
            and "sigkill_handler] Killing subprocess" in text
        ):
            self._teardown = (line, hit)
        if "x:launch-death-signal" in keys:
            d = _DEATH_SIGNAL.search(text)
            sig = (log_int(d.group(1)) if d.group(1) else _signal_number(d.group(2))) if d else None
            if sig is not None:
                if sig == 2 and len(self.facts.interrupts) < MAX_EVENTS:
                    self.facts.interrupts.append(line)  # SIGINT: the user's Ctrl-C
                self._event("exit", line, hit, text.strip()[:300], exit_code=-sig)
        if "x:launch-shell-killed" in keys:
            self._event("exit", line, hit, text.strip()[-300:], exit_code=-9)
        if "x:launch-shell-signal" in keys:
            low = text.lower()
            ucx = _UCX_SIGNAL.search(text)
            code = -int(ucx.group(1)) if ucx else next((c for word, c in _SHELL_SIGNALS if word in low), None)
            if code is not None:  # (a job report names the signal before its command: keep its head)
                job = _SHELL_JOB.search(text)
                detail = text[job.start() + 2 :].strip()[:300] if job else text.strip()[-300:]
                self._event("exit", line, hit, detail, exit_code=code)
        if "x:launch-child-signal" in keys:
            self._child_signal(line, hit, text)
        if "x:launch-slurm" in keys and "x:oom-host" not in keys:  # (Slurm's OOM lines are host-oom events)
            code = -9 if "oom" in text.lower() or "OOM" in text else None
            self._event("exit", line, hit, text.strip()[:300], exit_code=code)
        if "x:launch-exit-137" in keys:
            # the tool prints it when the process it ran has ended (kubectl exec, docker compose, PyCharm: patterns.py
            # `launch-exit-137`): a run that trained on after the line was not that process (a note about an earlier
            # attempt); one that had printed its end before it still exited so (classes._exit_after_end names it).
            # docker compose runs one rank per container, and the others print on after one was killed: its line
            # is that container's death whatever follows (review R6)
            if _COMPOSE_EXIT.search(text):
                self._event("exit", line, hit, text.strip()[-300:], exit_code=137)
            else:
                self._defer("exit", line, hit, text.strip()[-300:], 137, ends=False)

    def _pip_build(self, line: LogLine, hit: Hit) -> None:
        if "Successfully installed " in line.text:
            self._pip_ok[line.source] = hit.seq
            return
        w = _PIP_WHEEL.search(line.text)
        if w is not None and self._pip_wheel is None:
            self._pip_wheel = (line, hit, (w.group(1) or w.group(2) or "").strip())
            return
        c = _SETUPTOOLS_CMD.search(line.text)
        if c is not None and self._pip_cmd is None:
            self._pip_cmd = (line, hit, f"{c.group(1).rsplit('/', 1)[-1]} exited with {c.group(2)}")

    def _cuda_mismatch(self, line: LogLine, hit: Hit) -> None:
        """torch's CUDA_MISMATCH_MESSAGE starts on the line below its bare `RuntimeError:`: the message of that
        exception (or, with the exception line cut from the paste, the failure itself)."""
        m = _CUDA_MISMATCH.search(line.text)
        if m is None:
            return
        what = f"RuntimeError: {m.group(0)}" + (" PyTorch." if m.group(1) else ".")
        for ev in reversed(self.facts.events):
            if (
                ev.line.source == line.source
                and 0 < line.lineno - ev.line.lineno <= 2
                and ev.kind == "exception"
            ):
                if ev.detail.rstrip(": ") in ("RuntimeError",):
                    ev.detail = what[:300]
                    if ev.traceback is not None:
                        ev.traceback.exc_message = what.split(": ", 1)[1]
                return
        self._event("exception", line, hit, what[:300])

    def _version(self, line: LogLine) -> None:
        for rx, name in _VERSION_LINES:
            m = rx.search(line.text)
            if m:
                pkg, ver = (m.group(1).lower(), m.group(2)) if not name else (name, m.group(1))
                self.facts.versions[pkg] = ver
                if len(self.facts.version_lines) < 50:
                    self.facts.version_lines.append(line)
                return

    def _outlived(self, line: LogLine, hit: Hit, *, ends: bool = True) -> bool:
        """Whether the run trained or reached another phase after this line, or (`ends`) had printed its end before
        it (`train_runtime`, `Training completed`: a line quoted after a finished run) and no training started since."""
        ended = False
        for kind, m_line, m_seq in self.facts.markers:
            if m_line.source != line.source:
                continue
            if m_seq > hit.seq:
                return True
            ended = kind == "finished" or (ended and kind != "train")
        # (a bar past the log's last hit line is in the scan's end_progress only: a healthy run whose last hit is a
        # quoted message trained on after it - review R6)
        end_bar = self._end_progress.get(line.source)
        if end_bar is not None and end_bar.lineno > line.lineno:
            return True
        return (ended and ends) or self.facts.last_progress != hit.progress

    def _raised_after(self, line: LogLine) -> bool:
        """Whether an exception was raised below this line in its log (a traceback's, or a whole `Type: message`
        line): a user who quotes an earlier error in prose and then pastes the traceback means the traceback."""
        return any(
            e.line.source == line.source
            and e.line.lineno > line.lineno
            and e.kind in ("exception", "cuda-oom", "host-oom")
            and (e.traceback is not None or _EXC.match(e.line.text) is not None)
            for e in self.facts.events
        )

    def _child_signal(self, line: LogLine, hit: Hit, text: str) -> None:
        """A child process a signal ended: the spawn context's `process N terminated with signal SIGKILL` (N: the
        index it was spawned with, its rank), or loky's exit-code set, where a SIGKILL(-9) among them is what the
        kernel's OOM killer sends (loky's own message names "excessive memory usage" as a cause)."""
        spawn = _CHILD_SIGNAL.search(text)
        if spawn is not None:
            number = _signal_number(spawn.group("name"))
            code = -number if number is not None else None
            self._event(
                "exit", line, hit, text.strip()[:300], exit_code=code, rank=log_int(spawn.group("index"))
            )
            return
        died = _CALLED_PROCESS_SIGNAL.search(text) if "died with <Signals." in text else None
        if died is not None:
            # (the whole `CalledProcessError: Command ... died with` line is the exception's event: _exception)
            number = log_int(died.group(1))
            if not _EXC.match(text) and "CalledProcessError" not in text and number:
                self._defer("exit", line, hit, text.strip()[-300:], -number)
            return
        codes = [log_int(m.group("code")) for m in _LOKY_EXIT_CODES.finditer(text)]
        known = [c for c in codes if c is not None]
        if known:
            code = -9 if -9 in known else known[0]
            self._event("exit", line, hit, text.strip()[-300:], exit_code=code)

    def _cpp_raised(self, line: LogLine) -> None:
        """A c10::Error's backtrace header right below an error line of torch's C++ logging: that line is the error's
        message, logged where no Python exception line was printed (torch_npu's operator plugins, an error logged
        before it is raised); an error line that is already a failure (a watchdog's, NCCL's) is left to it."""
        got = self._glog_error.get(line.source)
        if got is None or got[0].lineno != line.lineno - 1:
            return
        err_line, err_hit, message = got
        if any(e.line.source == err_line.source and e.line.lineno == err_line.lineno for e in self.facts.events[-8:]):
            return
        self._defer("exception", err_line, err_hit, f"c10::Error: {message}"[:300])

    def _defer(
        self, kind: str, line: LogLine, hit: Hit, detail: str, exit_code: int | None = None, *, ends: bool = True
    ) -> None:
        """An event for finish to add unless the run went on or (`ends`) had finished before it (_outlived)."""
        if len(self._unless_outlived) < MAX_EVENTS:
            self._unless_outlived.append((kind, line, hit, detail, exit_code, ends))

    def _event(
        self,
        kind: str,
        line: LogLine,
        hit: Hit,
        detail: str,
        *,
        exit_code: int | None = None,
        rank: int | None = None,
        pid: int | None = None,
        traceback: Traceback | None = None,
    ) -> None:
        if len(self.facts.events) >= MAX_EVENTS:
            return
        seq = hit.seq
        if traceback is not None:  # a traceback happened when it started
            seq = hit.file_index * (1 << 40) + traceback.start.lineno
        self.facts.events.append(
            Event(
                kind,
                line,
                seq,
                rank if rank is not None else line.rank,
                detail,
                exit_code,
                pid,
                hit.progress,
                traceback,
            )
        )

    # ---- finishing ----------------------------------------------------------------------------------

    def _bar(self, source: str, p: Progress) -> None:
        """A progress line the scan found: the bar right after the last failures that had none before them.
        tqdm redraws its bar once more when it is closed (tqdm std.py: __del__ -> close() -> display(pos=0) with
        leave=True), and a bar iterated by the loop an exception left is closed after the interpreter printed the
        traceback: its last state is where the run was. A bar speaks for its own process only: one of another rank
        (or an unranked bar in a log of several ranks) says nothing of this failure's place."""
        if p.lineno <= self._last_bar.get(source, 0):
            return
        self._last_bar[source] = p.lineno
        rank = p.rank if p.rank is not None else _rank_of_file(source)  # (a per-rank file's bar is its rank's)
        for ev in self.facts.events[-_BAR_EVENTS:]:
            if ev.line.source != source or ev.progress is not None or id(ev) in self._bar_after_event:
                continue
            if rank != ev.rank and (len(self.facts.ranks_in_log) > 1 or None not in (rank, ev.rank)):
                continue
            end = self._tb_last(ev.traceback) if ev.traceback is not None else ev.line.lineno
            if end < p.lineno <= end + _BAR_AFTER_LINES:
                self._bar_after_event[id(ev)] = p

    def finish(self, end_progress: Mapping[str, Progress | None] | None = None) -> Facts:
        """Close what is open and place every failure. end_progress: the scan's progress at the end of each log,
        past its last hit line (scan.ScanStats.end_progress)."""
        self._end_progress = end_progress or {}
        self._vscode_message(None, None)
        for tb, exc_type, hit in self._ipy:
            if (
                tb.exc_type is None
            ):  # the paste ends inside an IPython traceback: its header named the exception
                tb.exc_type, tb.exc_message = exc_type, ""
                self._event("exception", tb.start, hit, exc_type, traceback=tb)
        for line, hit in self._asserts:
            # a traceback whose last frame's source line is an `assert` and no exception line follows (the paste
            # stops there): the assertion failed
            for tb in self.facts.tracebacks:
                if (
                    tb.exc_type is None
                    and tb.frames
                    and tb.source == line.source
                    and 0 < line.lineno - tb.frames[-1].line.lineno <= 2
                ):
                    m = _ASSERT.match(line.text)
                    r = _RAISE.match(line.text)
                    if r:  # `raise ValueError(f"...")`: the exception the paste stops before
                        tb.exc_type, tb.exc_message = r.group(1), r.group(2).strip().rstrip(")")
                    else:
                        tb.exc_type, tb.exc_message = "AssertionError", m.group(1) if m else ""
                    tb.end = line
                    detail = f"{tb.exc_type}: {tb.exc_message}" if tb.exc_message else tb.exc_type
                    self._event("exception", line, hit, detail[:300], traceback=tb)
                    break
        if self._ninja_stop is None and self._tool_fail is not None:
            # the compiler or linker failed a JIT build and the paste ends before ninja's stop: the build failed
            # there, if a JIT build was running in that log (torch's `Building extension module`, ninja's compile
            # lines) and nothing ran after it (a test compile of DeepSpeed's op compatibility checks, e.g. async_io's
            # io_submit against -laio, fails harmlessly in a run that goes on)
            line, hit = self._tool_fail
            later = self.facts.last_progress != hit.progress or any(
                m_seq > hit.seq and m_line.source == line.source and kind != "engine"
                for kind, m_line, m_seq in self.facts.markers
            )
            # (gcc's `compilation terminated.` after its fatal error proves the compiler stopped even where the
            # build's own lines were cut from the paste)
            building = line.source in self._ninja_ext or self._cc_stopped.get(line.source, -1) >= hit.seq
            if building and not later:
                self._ninja_stop = self._tool_fail
        if self._ninja_stop is not None:
            # ninja stopped a JIT op build and the paste ends before torch's `Error building extension` exception:
            # the build failed (torch/utils/cpp_extension.py _run_ninja_build raises RuntimeError("Error building
            # extension '{name}'") right after ninja's exit), named from ninja's compile line
            line, hit = self._ninja_stop
            if not any(
                e.kind == "exception" and e.line.source == line.source and e.line.lineno > line.lineno
                for e in self.facts.events
            ):
                op = self._ninja_ext.get(line.source)
                what = f"Error building extension '{op}'" if op else "Error building extension"
                f = _NINJA_FAILED.search(line.text)
                parts = []
                if self._ninja_stop is not self._tool_fail:
                    parts.append(
                        "ninja: " + (f"FAILED: {f.group(1)}" if f else "build stopped: subcommand failed")
                    )
                if self._tool_fail is not None and self._tool_fail[0].source == line.source:
                    tool = _TOOLCHAIN_FAILED.search(self._tool_fail[0].text)
                    if tool:  # the compiler's or linker's own words say why (`/usr/bin/ld: ...` as `ld: ...`)
                        parts.append(TOOLCHAIN_SAID + re.sub(r"^\S*/", "", tool.group(0).strip()))
                self._event("exception", line, hit, f"RuntimeError: {what} ({'; '.join(parts)})")
        for line, hit, cmd in self._not_found:
            # a script goes on after a command it could not run (no `set -e`): the run failed there only if it did
            # not train or reach another phase after it
            if not self._outlived(line, hit):
                self._event(
                    "exception", line, hit, f"{NOT_FOUND_TYPE}: {cmd} ({clip(line.text.strip(), 240)})"
                )
        fail = self._pip_wheel or self._pip_cmd
        if fail is not None and self._pip_ok.get(fail[0].source, -1) < fail[1].seq:
            # pip could not build a package from source, and installed nothing after it
            line, hit, _ = fail
            pkg = (self._pip_wheel[2] if self._pip_wheel is not None else "") or "a package"
            said = f" ({self._pip_cmd[2]})" if self._pip_cmd is not None else ""
            self._event("exception", line, hit, f"{PACKAGE_BUILD_TYPE}: {pkg}{said}"[:300])
        for line, hit, said in self._quoted_imports:
            if not self._outlived(line, hit) and not self._raised_after(line):
                self._event("exception", line, hit, said[:300])
        for kind, line, hit, said, code, past_end in self._unless_outlived:
            if not self._outlived(line, hit, ends=past_end) and not any(
                e.line.source == line.source and e.line.lineno == line.lineno for e in self.facts.events
            ):
                self._event(kind, line, hit, said, exit_code=code)
        if self._teardown is not None and not self.facts.events:
            # the launcher killed its ranks because one failed, and nothing else says which or how: the failure is
            # that teardown (its exit code was cut from the paste or printed elsewhere)
            line, hit = self._teardown
            self._event("exit", line, hit, line.text.strip()[-300:], exit_code=None)
        self._logged_oom_outlived()
        self._cut_traceback()
        self._stack_dump()
        self._oom_messages()
        # (read once: phase_of looks at them for every event)
        self._guard_lines = [m_line for kind, m_line, _seq in self.facts.markers if kind == "guard"]
        self._gradient_sources = self._gradient_collectives()
        for source, end_bar in (end_progress or {}).items():
            if end_bar is not None:  # the bar after a log's last failure, past its last hit line
                self._bar(source, end_bar)
        for ev in self.facts.events:
            ev.phase = self.phase_of(ev)
            if ev.phase == "unknown" and ev.kind == "exit":
                ev.phase = self._fatal_dump_phase(ev)
            main = self._hang_main.get(id(ev.traceback)) if ev.traceback is not None else None
            if ev.phase == "unknown" and main is not None:
                ev.phase = self._phase_from_frames(main, ev)
        if self._dist_init is not None and not self.facts.events and not self._outlived(*self._dist_init):
            self.facts.ends_after_init = self._dist_init[0]
        last = self.facts.last_progress
        ends = [p for p in (end_progress or {}).values() if p is not None]
        if len(end_progress or {}) == 1 and ends and (last is None or ends[0].lineno >= last.lineno):
            # a single log's progress past its last hit line (a bar redrawn after a failure report with no traceback,
            # a Ray OOM report forwarded before the actor's bar): the run got that far
            last = ends[0]
        if last is not None:  # where the log ends, for failures without a failure line (NaN losses, hangs)
            end = LogLine(self._last_source, last.lineno + 1, "", None, None, None)
            self.facts.end_phase = self._phase_from_markers_at(end, self._last_seq + 1, last)
        elif self.facts.markers:  # no progress printed: the last marker says where the log ends
            m_line, m_seq = self.facts.markers[-1][1], self.facts.markers[-1][2]
            end = LogLine(m_line.source, m_line.lineno + 1, "", None, None, None)
            self.facts.end_phase = self._phase_from_markers_at(end, m_seq + 1, None)
        return self.facts

    def _logged_oom_outlived(self) -> None:
        """A device OOM printed as text, not raised (no `...Error:` line and no traceback), in a log whose run then
        reached its end (the trainer's `train_runtime` summary, `Training completed`, `Training finished`) is no
        failure: advice quoting the message, a library that catches the OOM and retries with a smaller batch
        (accelerate's find_executable_batch_size, DeepSpeed's autotuner trying configurations). Nor is libstdc++'s
        `terminate called without an active exception` printed after that end (a thread torn down at exit)."""
        ends: dict[str, int] = {}
        for kind, m_line, m_seq in self.facts.markers:
            if kind == "finished":
                ends[m_line.source] = max(ends.get(m_line.source, -1), m_seq)
        if not ends:
            return
        self.facts.late_terminates = [
            e.line
            for e in self.facts.events
            if e.detail == native_messages.NO_EXCEPTION_DETAIL and ends.get(e.line.source, -1) < e.seq
        ]
        self.facts.events = [
            e
            for e in self.facts.events
            if not (
                e.kind == "cuda-oom"
                and e.traceback is None
                and not _EXC.match(e.line.text)
                and ends.get(e.line.source, -1) > e.seq
            )
            and not (e.detail == native_messages.NO_EXCEPTION_DETAIL and ends.get(e.line.source, -1) < e.seq)
        ]

    def _oom_messages(self) -> None:
        """An exception line whose message continues on the next lines with a device OOM: PaddlePaddle's
        `ResourceExhaustedError: ` then `Out of memory error on GPU 0. Cannot allocate ...`, torch's
        `DistBackendError: NCCL error ... ncclUnhandledCudaError: Call to CUDA function failed.` then `Last error:`
        / `Cuda failure 'out of memory'`: that exception is the device running out of memory."""
        excs = {(e.line.source, e.rank, e.line.lineno): e for e in self.facts.events if e.kind == "exception"}
        if not excs:
            return
        for ev in self.facts.events:
            if ev.kind != "cuda-oom" or ev.traceback is not None:
                continue
            at = ev.line.lineno
            while (
                True
            ):  # the exception lines that chain above it (`DistBackendError` over `ncclUnhandledCudaError`)
                exc = next(
                    (
                        e
                        for b in range(1, 5)
                        if (e := excs.pop((ev.line.source, ev.rank, at - b), None)) is not None
                    ),
                    None,
                )
                if exc is None:
                    break
                exc.kind, at = "cuda-oom", exc.line.lineno

    def _cut_traceback(self) -> None:
        """A paste that ends inside a traceback (its exception line cut off) with nothing else failing: the run
        raised there, and the frames say where; the exception's type and message are not in the log."""
        if self.facts.events or self._last_frame is None:
            return
        line, hit = self._last_frame
        tb = next((t for t in reversed(self.facts.tracebacks) if t.contains(line)), None)
        # one frame is enough under a traceback's own header (Python's or rich's boxed `Traceback (most recent call
        # last)`): the paste was cut right after the first frame; a lone frame line with no header is not
        if tb is None or tb.exc_type is not None or not tb.frames:
            return
        if len(tb.frames) < 2 and tb.start is tb.frames[0].line:
            return
        last = tb.frames[-1]
        where = f'File "{last.file}", line {last.lineno}, in {last.func}'
        # (the header's hit carries the training progress printed before the traceback began)
        head = self._head_hit.get(id(tb))
        p = head[1].progress if head is not None and head[0] is tb else None
        if p is not None and not any(
            # (a bar inside another traceback is another rank's, interleaved: not this rank's progress)
            t is not tb and t.source == tb.source and t.start.lineno <= p.lineno <= self._tb_last(t)
            for t in self.facts.tracebacks
        ):
            hit = replace(hit, progress=p)
        self._event("exception", line, hit, f"{CUT_TRACEBACK}{where}"[:300], traceback=tb)

    def _traceback_of(self, ev: Event) -> Traceback | None:
        """The traceback an event belongs to: its own, one that contains its line, or one of the same rank that
        ended just before it (multi-line exception messages: `ncclSystemError: ...` after `DistBackendError`)."""
        if ev.traceback is not None:
            return ev.traceback
        if ev.kind not in ("exception", "cuda-oom", "nccl"):
            return None
        best: Traceback | None = None
        for t in self.facts.tracebacks:
            if t.contains(ev.line):
                return t
            end = t.end.lineno if t.end else None
            if (
                end is not None
                and t.source == ev.line.source
                and t.rank == ev.rank
                and 0 < ev.line.lineno - end <= 3
            ):
                best = t
        return best

    def phase_of(self, ev: Event) -> str:
        """The phase from the failure's own frames, else from the frames of the traceback chained after it
        ("The above exception was the direct cause of the following exception": the callers, e.g.
        deepspeed.initialize around a failed op build), else from the markers and progress before it."""
        if ev.kernel_log:
            return "unknown"
        tb = self._traceback_of(ev)
        guarded = self._guard_phase(ev, tb)
        if guarded is not None:
            return guarded
        phase = self._phase_from_frames(tb, ev) if tb is not None else "unknown"
        if tb is not None and phase == "training_step" and self._forward_only(tb):
            # only a model's own `forward` frames (no loss, backward or loop frame): a forward pass runs in training
            # and in evaluation. The traceback printed right after it (its callers, chained or the rest of the same
            # stack another rank printed) or evaluation's markers say which.
            phase = "forward"
            nxt = self._chained_after(ev)
            if nxt is not None and self._phase_from_frames(nxt, ev) == "evaluation":
                phase = "evaluation"
        if tb is None and ev.kind in ("exception", "cuda-oom"):
            # a failure logged, not raised: loguru's default format names the function that logged it (the handler
            # around the failing call), read like a one-frame traceback
            lg = _LOGURU_WHERE.search(ev.line.text)
            if lg is not None:
                one = Traceback(ev.line.source, ev.rank, ev.line)
                one.frames.append(Frame(lg.group(1), log_int(lg.group(3)) or 0, lg.group(2), ev.line))
                phase = self._phase_from_frames(one, ev)
        if phase == "unknown":
            nxt = self._chained_after(ev)
            if nxt is not None:
                phase = self._phase_from_frames(nxt, ev)
                if self._loop_only(nxt, phase):
                    phase = self._code_phase(nxt.source, nxt.start.lineno, self._tb_last(nxt) + 2) or phase
        if phase == "unknown" and tb is not None:
            # ranks that print the same exception interleaved: each parsed traceback holds part of the frames
            for other in self.same_exception(tb):
                phase = self._phase_from_frames(other, ev)
                if phase != "unknown":
                    break
        if phase == "unknown" and tb is None:
            # an exception line with no traceback of its own: another rank's unfinished traceback printed next to
            # it is the same incident (ranks fail together, each prints part)
            for t in self.facts.tracebacks:
                if (
                    t.source == ev.line.source
                    and t.exc_type is None
                    and abs(t.start.lineno - ev.line.lineno) <= 3
                ):
                    phase = self._phase_from_frames(t, ev)
                    if phase == "unknown":  # its frames' source lines, then
                        phase = self._code_phase(t.source, t.start.lineno, self._tb_last(t) + 2) or phase
                    break
        if phase == "unknown" or (tb is not None and self._loop_only(tb, phase)):
            lo = tb.start.lineno if tb is not None else ev.line.lineno - 6
            phase = self._code_phase(ev.line.source, lo, ev.line.lineno) or phase
        if phase == "unknown" and _ZERO3_TRACE_CHECK.search(ev.detail):
            phase = "forward"
        if phase == "unknown" and _STAGING_CHECKPOINT.search(ev.detail):
            phase = "checkpoint_save"
        if phase == "optimizer":
            phase = self._optimizer_phase(ev, False)
        if phase == "forward":
            # a forward pass runs in training and in evaluation: evaluation's own markers say which
            at = self.phase_at(ev.line, ev.seq, ev.progress)
            phase = at if at == "evaluation" else "training_step"
        if phase == "unknown":
            phase = self.phase_at(ev.line, ev.seq, ev.progress)
            bar = self._bar_after_event.get(id(ev)) if phase == "unknown" and ev.progress is None else None
            if bar is not None:
                phase = self.phase_at(ev.line, ev.seq, replace(bar, lineno=ev.line.lineno))
            if phase == "checkpoint_save" and tb is not None and _fetching_data(tb):
                # the failing frames iterate a DataLoader (its worker or pin-memory loop): the save before it was over
                # and the next batches were being fetched; mmengine/mmcv save at an epoch's end (CheckpointHook
                # .after_train_epoch: `Saving checkpoint at N epochs`), so that is where the run was
                save = self._last_marker(ev.line, ev.seq)
                phase = "epoch_end" if save is not None and _EPOCH_SAVE.search(save.text) else "training_step"
        if phase == "unknown" and ev.kind in ("watchdog", "nccl"):
            phase = self._collective_phase(ev)
        if phase == "first_optimizer_step" and _fetching_batch(ev, tb):
            # the training loop had started (its marker, or a bar at step 0), but the failure is the DataLoader's: the
            # batch never reached the model, so no step (and no optimizer) was running - the loop's own phase
            phase = "training_step"
        return phase

    def _guard_phase(self, ev: Event, tb: Traceback | None) -> str | None:
        """The phase the runtime guard recorded for this exception: its `zerodoctor guard [rank R, step S, PHASE]`
        line heads its error file and follows the traceback on stderr (guard/crash.py). The guard's own state is
        the run's, so it outranks what frames and markers suggest."""
        lo = (tb.start.lineno if tb is not None else ev.line.lineno) - 2
        hi = (self._tb_last(tb) if tb is not None else ev.line.lineno) + 3
        for m_line in self._guard_lines:
            if m_line.source != ev.line.source or not lo <= m_line.lineno <= hi:
                continue
            g = _GUARD.search(m_line.text)
            if g and g.group(3) in _GUARD_PHASE and (ev.rank is None or log_int(g.group(1)) == ev.rank):
                return _GUARD_PHASE[g.group(3)]
        return None

    def _last_marker(self, line: LogLine, seq: int) -> LogLine | None:
        found: LogLine | None = None
        for _kind, m_line, m_seq in self.facts.markers:
            if m_line.source == line.source and m_seq < seq:
                found = m_line
        return found

    def _collective_phase(self, ev: Event) -> str:
        """A watchdog timeout with no marker before it: a gradient-sized reduction is a backward pass
        (training_step); any other collective says nothing about the phase."""
        return "training_step" if ev.line.source in self._gradient_sources else "unknown"

    def _gradient_collectives(self) -> set[str]:
        """The sources whose first watchdog line that names its collective names a gradient-sized reduction."""
        decided: dict[str, bool] = {}
        for other in self.facts.events:
            if other.kind not in ("watchdog", "nccl") or other.line.source in decided:
                continue
            m = WATCHDOG_WORK.search(other.line.text)
            if m is None:
                continue
            nin = log_int(m.group("nin")) if m.group("nin") else None
            decided[other.line.source] = (
                m.group("op") in _GRADIENT_OPS and nin is not None and nin >= GRADIENT_NUMEL
            )
        return {source for source, gradient in decided.items() if gradient}

    def same_exception(self, tb: Traceback) -> list[Traceback]:
        return same_exception(self.facts.tracebacks, tb)

    @staticmethod
    def _tb_last(tb: Traceback) -> int:
        return tb.end.lineno if tb.end else (tb.frames[-1].line.lineno if tb.frames else tb.start.lineno)

    @staticmethod
    def _forward_only(tb: Traceback) -> bool:
        """Whether a traceback's only training frames are modules' `forward` (torch.nn.Module.__call__ -> forward)."""
        return {f.func for f in tb.frames} & _TRAIN_FUNCS == {"forward"}

    @staticmethod
    def _loop_only(tb: Traceback, phase: str) -> bool:
        """A training_step read only from the training loop's own frames (engine start, evaluation and saving
        run inside it too): the frames' source lines say better."""
        funcs = {f.func for f in tb.frames}
        return phase == "training_step" and not (funcs & _TRAIN_FUNCS) - _LOOP_FUNCS

    def _hint_in(self, tb: Traceback, phase: str) -> bool:
        """Whether a frame source line inside the traceback names this phase (patterns.py code-resume /
        code-tokenize: the call a frame was making when the failure happened below it)."""
        hi = self._tb_last(tb)
        return any(
            p == phase and line.source == tb.source and tb.start.lineno <= line.lineno <= hi
            for p, line in self.facts.code_hints
        )

    def _code_phase(self, source: str, lo: int, hi: int) -> str | None:
        """The phase the innermost frame source line between lines lo and hi names, if any."""
        found: str | None = None
        for phase, line in self.facts.code_hints:
            if line.source == source and lo <= line.lineno <= hi:
                found = phase
        return found

    def _chained_after(self, ev: Event) -> Traceback | None:
        tb = self._traceback_of(ev)
        end = tb.end.lineno if tb is not None and tb.end is not None else ev.line.lineno
        for t in self.facts.tracebacks:
            if (
                t is not tb
                and t.source == ev.line.source
                and t.rank == ev.rank
                and 0 < t.start.lineno - end <= 8
                and t.frames
            ):
                return t
        return None

    def _phase_from_frames(self, tb: Traceback, ev: Event) -> str:
        if installing(tb):
            return "unknown"  # pip installing a package: no run, no phase of one
        if tb.frames:
            funcs = {f.func for f in tb.frames}
            files = " ".join(f.file for f in tb.frames)
            if (
                funcs & _SAVE_FUNCS
                or any("PyTorchStreamWriter" in f for f in funcs)
                or any(_SAVE_NAME.match(f) for f in funcs)
                or any(
                    f.func in _SAFETENSORS_SAVE_FUNCS and _SAFETENSORS_TORCH in f.file.replace("\\", "/")
                    for f in tb.frames
                )
            ):
                # (PyTorchStreamWriter: the zip writer under torch.save, caffe2/serialize/inline_container.cc, as a
                # native stack prints it after a crash inside torch.save)
                return "checkpoint_save"
            if funcs & _ZERO_OPT_INIT_FUNCS:
                return "engine_init"
            model_load = _loading_model(tb)
            if _resuming(tb) or (not model_load and self._hint_in(tb, "resume")):
                return "resume"
            if self._hint_in(tb, "tokenization") or any(
                f.func in _DATASET_MAP_FUNCS and "/datasets/" in f.file.replace("\\", "/") for f in tb.frames
            ):
                return "tokenization"  # HF datasets' map: the frameworks' tokenization / preprocessing
            if funcs & _DATA_PREP_FUNCS or any(d in files.replace("\\", "/") for d in _DATA_PREP_FILES):
                return "tokenization"  # a framework converting / tokenizing its dataset before training
            if funcs & _EVAL_FUNCS or any(_EVAL_NAME.match(f) for f in funcs):
                return "evaluation"
            if funcs & _OPT_FUNCS or (
                "step" in funcs and ("torch/optim/" in files or "zero/stage" in files or "ops/adam/" in files)
            ):
                return self._optimizer_phase(ev, "_init_group" in funcs)
            engine_ctor = any(
                f.func == "__init__" and any(c in f.file.replace("\\", "/") for c in _ENGINE_CTOR_FILES)
                for f in tb.frames
            )
            if (
                funcs & _ENGINE_FUNCS
                or engine_ctor
                or any(f in files for f in _ENGINE_FILES)
                or ("initialize" in funcs and "deepspeed/__init__.py" in files)
            ):
                return "engine_init"
            if funcs & _TRAIN_FUNCS:
                return "training_step"
            # zero.Init swaps torch.Tensor.__new__ for DeepSpeed's get_new_tensor_fn_for_dtype: its name in the
            # message places the failure inside the context even when no DeepSpeed frame is printed.
            if (
                "partition_parameters.py" in files and funcs & _ZERO_INIT_FUNCS
            ) or "get_new_tensor_fn_for_dtype" in (tb.exc_message or ""):
                return "zero_init"
            if funcs & _LOAD_FUNCS or model_load:
                return "load"
            if any(f.func in _PLACE_FUNCS and _TORCH_MODULE in f.file.replace("\\", "/") for f in tb.frames):
                # torch.nn.Module.cuda() / .to() walking the model's tensors (module.py _apply) with no training or
                # engine frame above it: the model being placed on the device, part of loading it
                return "load"
        return "unknown"

    def _optimizer_phase(self, ev: Event, creating_state: bool) -> str:
        """First optimizer step or a later one. HF/DeepSpeed progress counts optimizer steps; mmengine's
        Iter(train) counts micro-batches, and the first optimizer step is iteration `accumulative_counts`."""
        if (
            creating_state
        ):  # torch AdamW _init_group creates exp_avg/exp_avg_sq: the first step, by definition
            return "first_optimizer_step"
        p = ev.progress
        if p is None:
            return "first_optimizer_step"  # no progress printed yet
        if p.kind == "trainer":
            return "training_step"  # a logged loss means optimizer steps have already happened
        if not p.step:
            return "first_optimizer_step"
        if p.kind == "mmengine":
            accum = self.facts.accumulation or 1
            return "first_optimizer_step" if p.step + 1 <= accum else "training_step"
        return "training_step"

    def _saving_at(self, p: Progress) -> bool:
        """Whether the Trainer saves a checkpoint right after the step its bar shows: its bar reaches step N when
        step N is done, then `_maybe_log_save_evaluate` evaluates and saves (DefaultFlowCallback.on_step_end sets
        should_save when `global_step % save_steps == 0`); a step the eval interval divides too evaluates first."""
        save, every_eval = self.facts.save_steps, self.facts.eval_steps
        return (
            p.kind in ("tqdm", "trainer")
            and p.step is not None
            and p.step > 0
            and save is not None
            and p.step % save == 0
            and not (every_eval and p.step % every_eval == 0)
        )

    def phase_at(self, line: LogLine, seq: int, progress: Progress | None) -> str:
        """The phase at a line from the markers and progress before it (no traceback to read)."""
        return self._phase_from_markers_at(line, seq, progress)

    def _phase_from_markers(self, ev: Event) -> str:
        return self._phase_from_markers_at(ev.line, ev.seq, ev.progress)

    def _phase_from_markers_at(self, line: LogLine, seq: int, progress: Progress | None) -> str:
        marker: tuple[str, LogLine, int] | None = None
        for m in self.facts.markers:
            # same seq: an earlier segment of the same physical line (a tqdm bar the failure was glued onto)
            if (
                m[1].source == line.source
                and (
                    m[2] < seq
                    or (m[2] == seq and m[1].text != line.text)
                    # a kill glued onto a loading or tokenization bar (`...it/s]Killed`): that bar is the phase
                    or (m[2] == seq and m[0] in ("load", "data") and line.text.find(m[1].text[:20]) == 0)
                    # an op build's own failure line (`Error building extension`, ninja's stop) is its phase's marker
                    or (m[2] == seq and m[0] == "engine" and m[1].text == line.text)
                )
            ):
                marker = m
        p = progress
        p_line = p.lineno if p is not None and p.lineno <= line.lineno else None
        # Evaluation prints progress bars of its own: until its results are logged, it is the phase.
        if marker is not None and marker[0] == "eval":
            return "evaluation"
        if marker is not None and marker[0] == "eval-open":
            # an evaluation loop's own header or bar (Lightning's `Validation DataLoader 0:`, `Evaluating`, lm-eval's
            # `Running loglikelihood requests`): training progress printed after it means evaluation was over
            if p_line is None or p_line <= marker[1].lineno:
                return "evaluation"
            marker = None
        if marker is not None and marker[0] == "guard":
            # the guard names the phase it recorded the exception in
            g = _GUARD.search(marker[1].text)
            if g and g.group(3) in _GUARD_PHASE:
                return _GUARD_PHASE[g.group(3)]
        if marker is not None and (
            p_line is None
            or marker[1].lineno > p_line
            or marker[1].lineno == p_line
            and _marker_after_progress(marker[0], marker[1].text)
        ):
            kind = marker[0]
            return {
                "data": "tokenization",
                "resume": "resume",
                # HF Trainer's `Loading model from {resume_from_checkpoint}.` (trainer.py _load_from_checkpoint,
                # transformers 5.23.0 line 3659) names the Trainer's `checkpoint-N` folder: a resume, not the first
                # load (scripts print `Loading model from` for their first load too, so only that folder counts)
                "load": "resume" if _RESUME_FOLDER.search(marker[1].text) else "load",
                "zero-init": "load" if "finished initializing" in marker[1].text else "zero_init",
                "engine": "engine_init",
                "train": "first_optimizer_step",
                "eval": "evaluation",
                "save": "checkpoint_save",
                "save-done": "training_step",
                "eval-done": "training_step",
                "finished": "unknown",
            }.get(kind, "unknown")
        if p is not None and p_line is not None:
            if p.kind == "mmengine" and p.step is not None and self.facts.accumulation:
                # micro-batch iterations: the first optimizer step runs in iteration accumulative_counts
                if p.step + 1 == self.facts.accumulation:
                    return "first_optimizer_step"
                if p.step + 1 < self.facts.accumulation:
                    return "training_step"
            if p.step is not None and p.total is not None and p.step >= p.total > 0:
                return "epoch_end"
            if p.step == 0:
                return "first_optimizer_step"
            if self._saving_at(p):
                return "checkpoint_save"
            if (
                p.kind == "trainer"
                and p.epoch is not None
                and p.epoch > 0
                and abs(p.epoch - round(p.epoch)) < 1e-6
            ):
                return "epoch_end"
            return "training_step"
        return "unknown"
