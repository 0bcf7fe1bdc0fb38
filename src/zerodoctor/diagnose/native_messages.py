"""Messages printed below Python when a training job dies: the CUDA/HIP runtimes, the GPU driver, the InfiniBand
verbs provider, NCCL, gloo and glibc, each in its source's own words.

A Python exception names itself; these lines do not. This module is a table of them (the exact texts across versions,
and the file that prints each) and two readers:

  read_line(text)      a log line the scan's `native` pattern hit -> the event it is (kind, detail), or None
  classify(ev, facts)  the run's first failure -> the failure class its native message names, or None

Families and the failure class each reads as (classes.py names the classes):

  gpu-hardware     ECC, NVLink, a GPU off the bus, GSP/micro-controller faults (Xid 48/62/64/74/79/94/95/119/120)
                   -> crash, titled "GPU hardware/driver fault"
  gpu-kernel       a kernel that faulted: illegal address, misaligned address, illegal instruction, launch failure,
                   launch timeout, ROCr's `Memory access fault by GPU node-N`, Xid 13/31/43 -> crash
  gpu-assert       a kernel's device-side assert -> crash
  gpu-unavailable  no device, busy/unavailable devices, a driver older than the runtime -> crash
  gpu-arch         no kernel image for this GPU's architecture -> crash
  gpu-oom          THCudaCheck's out of memory -> gpu-oom (classes._gpu_oom builds it)
  ib               an InfiniBand/RoCE work request that completed with an error (NCCL's NET/IB, mlx5) -> nccl-error
  peer-failed      gloo's monitored barrier on a rank whose rank 0 failed -> collective-timeout
  heap             glibc's malloc aborting on a corrupted heap -> crash
  cpp-abort        libstdc++'s std::terminate with no exception in flight -> crash

Every value in a message is read from the log line (GPU node, PCI address, Xid code, error code, status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zerodoctor.textutil import clip

if TYPE_CHECKING:
    from zerodoctor.diagnose.extract import Event, Facts

# ---- the CUDA / HIP runtime's error strings --------------------------------------------------------------------
# cudaGetErrorString (CUDA runtime) / hipGetErrorString (HIP, the same words): what `CUDA error: X` (c10/cuda
# CUDAException.h C10_CUDA_CHECK, torch >= 1.5), `cuda runtime error (N) : X` (THC/THCGeneral.cpp __THCudaCheck,
# torch <= 1.4), `HIP error: X` (ROCm builds) and NCCL's `Cuda failure 'X'` (src/include/checks.h CUDACHECK) quote.
# The texts were read from hip-tests' hipDrvGetErrorString table (its HT_NVIDIA branch holds CUDA's words) and a
# cudart re-implementation's cudaGetErrorString; the codes are driver_types.h's cudaError enum.
# (text, enum name and code, family)
CUDA_ERRORS: tuple[tuple[str, str, str], ...] = (
    ("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable (214)", "gpu-hardware"),
    (
        "uncorrectable NVLink error detected during the execution",
        "cudaErrorNvlinkUncorrectable (220)",
        "gpu-hardware",
    ),
    ("an illegal memory access was encountered", "cudaErrorIllegalAddress (700)", "gpu-kernel"),
    ("the launch timed out and was terminated", "cudaErrorLaunchTimeout (702)", "gpu-kernel"),
    ("hardware stack error", "cudaErrorHardwareStackError (714)", "gpu-kernel"),
    ("an illegal instruction was encountered", "cudaErrorIllegalInstruction (715)", "gpu-kernel"),
    ("misaligned address", "cudaErrorMisalignedAddress (716)", "gpu-kernel"),
    ("invalid program counter", "cudaErrorInvalidPc (718)", "gpu-kernel"),
    # (`unspecified launch failure in prior launch` is cudaErrorPriorLaunchFailure (53), the same fault seen later)
    ("unspecified launch failure", "cudaErrorLaunchFailure (719)", "gpu-kernel"),
    ("device-side assert triggered", "cudaErrorAssert (710)", "gpu-assert"),
    # (CUDA 11+ words; CUDA <= 10 said `all CUDA-capable devices are busy or unavailable`)
    (
        "CUDA-capable device(s) is/are busy or unavailable",
        "cudaErrorDevicesUnavailable (46)",
        "gpu-unavailable",
    ),
    (
        "all CUDA-capable devices are busy or unavailable",
        "cudaErrorDevicesUnavailable (46)",
        "gpu-unavailable",
    ),
    ("no CUDA-capable device is detected", "cudaErrorNoDevice (100)", "gpu-unavailable"),
    ("no ROCm-capable device is detected", "hipErrorNoDevice (100)", "gpu-unavailable"),
    (
        "CUDA driver version is insufficient for CUDA runtime version",
        "cudaErrorInsufficientDriver (35)",
        "gpu-unavailable",
    ),
    (
        "system has unsupported display driver / cuda driver combination",
        "cudaErrorSystemDriverMismatch (803)",
        "gpu-unavailable",
    ),
    (
        "no kernel image is available for execution on the device",
        "cudaErrorNoKernelImageForDevice (209)",
        "gpu-arch",
    ),
)
# the words around a runtime error string that say a CUDA/HIP call returned it (not prose that happens to hold them)
_CUDA_SAID = re.compile(
    r"(?:CUDA|HIP|cuda runtime|CUDA driver|hip) error(?: \((?P<code>\d{1,4})\))?\s?:"
    r"|Cuda failure (?:(?P<code2>\d{1,4}) )?'"
    r"|error=(?P<code3>\d{1,4}) : |hipError\w+|cudaError\w+"
)

# ---- NVIDIA's kernel driver: Xid lines -------------------------------------------------------------------------
# open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c: `NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s,
# name=%s, %s` (with ` GPU-I:%02u GPU-CI:%02u` inside the parenthesis on a MIG GPU; older drivers print no `pid=` /
# `name=` and `Xid (0000:01:00)`), and `NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>` / `NVRM: GPU 0000:3b:00.0: GPU has
# fallen off the bus.` beside Xid 79. The names are NVIDIA's Xid catalog's (docs.nvidia.com/deploy/xid-errors); only
# the codes that mean a GPU fault are read: others are no failure of the job and give no event - 45 (preemptive
# cleanup after a kill), display and video engine codes, 61 (micro-controller breakpoint/warning), 63 (a page retired
# or a row marked for remapping: the recording worked, the remap waits for a reset; 64 is its failure) and 92 (a high
# rate of single-bit errors, each one corrected).
XID_FAULTS: dict[int, tuple[str, str]] = {
    13: ("Graphics Engine Exception", "gpu-kernel"),
    31: ("GPU memory page fault", "gpu-kernel"),
    43: ("GPU stopped processing", "gpu-kernel"),
    48: ("Double Bit ECC Error", "gpu-hardware"),
    62: ("Internal micro-controller halt", "gpu-hardware"),
    64: ("ECC page retirement or row remapper recording failure", "gpu-hardware"),
    74: ("NVLINK Error", "gpu-hardware"),
    79: ("GPU has fallen off the bus", "gpu-hardware"),
    94: ("Contained ECC error", "gpu-hardware"),
    95: ("Uncontained ECC error", "gpu-hardware"),
    119: ("GSP RPC Timeout", "gpu-hardware"),
    120: ("GSP Error", "gpu-hardware"),
}
# the kernel log's own line: NVRM at its start, after dmesg's `[ 5107.6] ` / `[Wed May  1 10:01:00 2024] ` or
# journalctl/syslog's `... kernel: ` (not a sentence that quotes one)
_KERNEL_LOG = r"(?:^\s*|\]\s*|kernel:\s*)"
_XID = re.compile(
    _KERNEL_LOG
    + r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)[^)]{0,40}\): "
    r"(?P<code>\d{1,3}),"
    r"\s*(?:pid=(?P<pid>[^,\s]{1,20}),\s*)?(?:name=(?P<name>[^,]{1,64}),\s*)?(?P<msg>.{0,300})"
)
_OFF_BUS = re.compile(
    _KERNEL_LOG
    + r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?):? (?:GPU )?"
    r"has fallen off"
    r" the bus"
)

# ---- ROCm: ROCr's fault handlers -----------------------------------------------------------------------------
# ROCR-Runtime src/core/runtime/runtime.cpp VMFaultHandler: `Memory access fault by GPU node-%u (Agent handle: %p) on
# address %p%s. Reason: %s.` (older: no agent handle), then abort(); HwExceptionHandler: `HW Exception by GPU node-%u
# (Agent handle: %p) reason :GPU Hang`. The reasons: `Page not present or supervisor privilege`, `Write access to a
# read-only page`, `Execute access to a page marked NX`, `Host access only`, `DRAM ECC failure`, `SRAM ECC failure`,
# `Generic hang recovery`, `Unknown`.
_ROCR_FAULT = re.compile(
    r"Memory access fault by GPU node-(?P<node>\d{1,4})(?: \(Agent handle: [^)]{1,40}\))? on address "
    r"(?P<addr>0x[0-9a-fA-F]"
    r"{1,16}|\(nil\)|\.\.\.)(?:\(may not be exact address\))?\.?(?: Reason: (?P<reason>[^.\n]{1,120}))?"
)
_ROCR_HW = re.compile(
    r"HW Exception by GPU node-(?P<node>\d{1,4})(?: \(Agent handle: [^)]{1,40}\))? reason ?: ?"
    r"(?P<reason>GPU Hang|[\w ]{1,60})"
)
_ROCR_ECC = re.compile(r"(?:DRAM|SRAM) ECC failure|ECC failure \(if supported by HW\)")

# ---- torch <= 1.4: THC's check -------------------------------------------------------------------------------
# THC/THCGeneral.cpp __THCudaCheck: `THCudaCheck FAIL file=%s line=%i error=%i : %s` (cudaGetErrorString), printed
# once before `RuntimeError: cuda runtime error (N) : X at FILE:LINE`. (__THCudaCheckWarn's `THCudaCheckWarn FAIL` is a
# warning - a destructor at exit - and is not read.)
_THC = re.compile(
    r"THCudaCheck FAIL file=(?P<file>\S{1,300}) line=(?P<line>\d{1,7}) error=(?P<code>\d{1,4}) : (?P<msg>.{1,200})"
)

# ---- InfiniBand / RoCE --------------------------------------------------------------------------------------
# rdma-core providers/mlx5/cq.c mlx5_parse_cqe: `fprintf(fp, PFX "%s: got completion with error:\n", hostname)` (PFX
# "mlx5: ") then the error CQE in hex rows (dump_cqe), for every error completion but a flush or a transport retry.
# (the line reader takes `mlx5: ` at a line's start for a host prefix: the reader is given that host back; the
# message starts its line, or follows a launcher's `[...]:` prefix or a tqdm bar glued before it - not a sentence)
_LINE_START = r"(?:^\s*|\]|\]:\s*)"
_MLX5 = re.compile(_LINE_START + r"(?:mlx5: )?(?P<host>[\w.-]{1,128}): got completion with error")
# NCCL's WARN, in the tags of NVIDIA/nccl (src/transport/net_ib.cu to 2.4.2, net_ib.cc, net_ib/p2p.cc from 2.29):
#   2.3.5-2.9.9    `NET/IB : Got completion with error %d, opcode %d, len %d, vendor err %d`
#   2.10.3-2.19.4  `NET/IB : Got completion from peer %s with error %d, opcode %d, len %d, vendor err %d` (then
#                  ` (%s)%s%s%s%s`, the request type and GIDs, from 2.18.1)
#   2.20.3-2.28.3  `... from peer %s with status=%d opcode=%d len=%d vendor err %d (%s)%s%s%s%s` (`NET/IB:` and ` hca %s`
#                  after it from 2.22.3; `NET/IB/GIN:` keeps this form for the GPU-initiated path from 2.28.7)
#   2.28.7-2.28.9  `NET/IB: ... with status=%s(%d) opcode=%s(%d) reqSize=%d vendor_err=%u req_type=%s%s%s%s%s hca %s`
#   2.29.2+        `NET/IB: ... with status=%s(%d) opcode=%s(%d) vendor_err=%u %s%s%s%s hca %s` (ibvWcStatusStr's words)
_IB_COMPLETION = re.compile(
    r"NET/IB(?:/GIN)? ?: Got completion (?:from peer (?P<peer>\S{1,80}) )?with (?:status=(?:[^(]{1,60}\()?|error )"
    r"(?P<status>\d{1,3})\)?(?:,? opcode[ =](?:[^(\s]{1,40}\()?(?P<opcode>\d{1,4})\)?)?"
    r"(?:,? (?:len|reqSize)[ =](?P<len>-?\d{1,12}))?,? vendor[ _]err[ =](?P<vendor>\d{1,10})"
    r"(?: (?:\(|req_type=)(?P<req>\w{1,20})\)?)?(?:.*? hca (?P<hca>[\w.-]{1,40}))?"
)
# rdma-core libibverbs/verbs.c ibv_wc_status_str (a subset: 3, 6, 7 and 14-18 are not listed; a status not here is
# reported by its number alone)
IBV_WC_STATUS = {
    1: "local length error",
    2: "local QP operation error",
    4: "local protection error",
    5: "Work Request Flushed Error",
    8: "local access error",
    9: "remote invalid request error",
    10: "remote access error",
    11: "remote operation error",
    12: "transport retry counter exceeded",
    13: "RNR retry counter exceeded",
    19: "fatal error",
    20: "response timeout error",
    21: "general error",
}

# ---- gloo ---------------------------------------------------------------------------------------------------
# torch/csrc/distributed/c10d/ProcessGroupGloo.cpp monitoredBarrier, on every rank but 0: `Rank %d successfully
# reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for
# faulty rank.` (logAndThrow: an `[E ProcessGroupGloo.cpp:N]` log line, then a RuntimeError with `Original exception:`)
_GLOO_PEER_FAILED = re.compile(
    r"Rank (?P<rank>\d{1,7}) successfully reached monitoredBarrier, but received errors while waiting for send/recv"
    r" from rank (?P<peer>\d{1,7})"
)

# ---- glibc: malloc aborting ---------------------------------------------------------------------------------
# glibc malloc/malloc.c malloc_printerr: since 2.26 `__libc_message (do_abort, "%s\n", str)` - the message alone on
# its line, then SIGABRT (`Aborted (core dumped)`); before, `*** Error in `%s': %s: 0x%s ***` and a backtrace.
_HEAP_WORDS = (
    r"double free or corruption \((?:!prev|out|fasttop|top)\)|free\(\): (?:invalid (?:pointer|size|next size "
    r"\((?:fast|normal)\))|double free detected in tcache 2|unaligned chunk detected in tcache 2)"
    r"|corrupted size vs\. prev_size(?: while consolidating| in fastbins)?"
    r"|corrupted double-linked list(?: \(not small\))?"
    r"|malloc\(\): (?:corrupted top size|memory corruption(?: \(fast\))?|unaligned tcache chunk detected"
    r"|invalid size \(unsorted\)|smallbin double linked list corrupted|unsorted double linked list corrupted"
    r"|mismatching next->prev_size \(unsorted\)|invalid next size \(unsorted\))"
    r"|malloc_consolidate\(\): (?:invalid chunk size|unaligned fastbin chunk detected)"
    r"|munmap_chunk\(\): invalid pointer"
    r"|realloc\(\): invalid (?:next size|pointer|old size)"
)
_HEAP = re.compile(
    rf"{_LINE_START}(?P<msg>{_HEAP_WORDS})\s*$|\*\*\* Error in `(?P<prog>[^`']{{1,200}})': (?P<msg2>{_HEAP_WORDS}): 0x"
)

# ---- libstdc++: std::terminate ------------------------------------------------------------------------------
# libstdc++-v3/libsupc++/vterminate.cc __verbose_terminate_handler: `terminate called after throwing an instance of
# '%s'` then `  what():  %s` (extract reads that pair: patterns `cpp-terminate` / `cpp-what`), `terminate called
# recursively` (another thread aborting meanwhile), and `terminate called without an active exception` (std::terminate
# with nothing thrown: a joinable std::thread destroyed, a noexcept function that threw through), then abort().
_NO_EXCEPTION = "terminate called without an active exception"
_NO_EXCEPTION_LINE = re.compile(_LINE_START + _NO_EXCEPTION + r"\s*$")
# (the event's detail: extract drops the event after a run's end)
NO_EXCEPTION_DETAIL = f"std::terminate: {_NO_EXCEPTION}"

# The scan's pattern (patterns.EXTRACTOR_PATTERNS["native"]): each alternative starts at a literal; a line it hits is
# decoded and read by `read_line`, which decides.
SCAN_PATTERN = (
    r"THCudaCheck FAIL file=|Memory access fault by GPU node-|HW Exception by GPU node-|: got completion with error"
    r"|NVRM: Xid \(|NVRM: GPU .{0,40}has fallen off the bus|successfully reached monitoredBarrier, but received errors"
    r"|double free or corruption \(|free\(\): (invalid|double free|unaligned)|corrupted size vs\. prev_size"
    r"|corrupted double-linked list|malloc\(\): (corrupted|memory corruption|unaligned|invalid|smallbin|unsorted"
    r"|mismatching)|malloc_consolidate\(\): |munmap_chunk\(\): invalid pointer|realloc\(\): invalid"
    r"|terminate called without an active exception"
)


@dataclass(frozen=True)
class NativeLine:
    """What a native line says: the event it is, and the values read from it."""

    id: str
    family: str
    kind: str  # the extractor's event kind: exception | cuda-oom | nccl
    detail: str
    values: dict[str, Any] = field(default_factory=dict)


def read_line(text: str, host: str | None = None) -> NativeLine | None:
    """The event a native line is (its text normalised: prefixes removed; `host`, the prefix the reader took from it),
    or None for a line that is none."""
    if "THCudaCheck FAIL" in text and (m := _THC.search(text)):
        msg = m.group("msg").strip()
        vals = {
            "error_code": int(m.group("code")),
            "file": m.group("file"),
            "file_line": int(m.group("line")),
        }
        if msg == "out of memory":
            return NativeLine("thc-check", "gpu-oom", "cuda-oom", clip(text.strip(), 300), vals)
        family = next((e[2] for e in CUDA_ERRORS if e[0] == msg), "gpu-kernel")
        at = f"{m.group('file')}:{m.group('line')}"
        what = f"RuntimeError: cuda runtime error ({m.group('code')}) : {msg} (THCudaCheck FAIL at {at})"
        return NativeLine("thc-check", family, "exception", clip(what, 300), vals)
    if "Memory access fault" in text and (m := _ROCR_FAULT.search(text)):
        reason = (m.group("reason") or "").strip()
        family = "gpu-hardware" if _ROCR_ECC.search(reason) else "gpu-kernel"
        vals = {"gpu_node": int(m.group("node")), "address": m.group("addr"), "reason": reason or None}
        return NativeLine("rocr-memory-fault", family, "exception", clip(m.group(0), 300), vals)
    if "HW Exception" in text and (m := _ROCR_HW.search(text)):
        vals = {"gpu_node": int(m.group("node")), "reason": m.group("reason").strip()}
        return NativeLine("rocr-hw-exception", "gpu-hardware", "exception", clip(m.group(0), 300), vals)
    if "NVRM:" in text:
        return _xid_line(text)
    if (
        "got completion with error" in text
        and ("mlx5: " in text or host == "mlx5")
        and (m := _MLX5.search(text))
    ):
        return NativeLine("mlx5-error-cqe", "ib", "nccl", clip(m.group(0), 300), {"host": m.group("host")})
    if "monitoredBarrier" in text and (g := _gloo_peer_failed(text, "nccl")) is not None:
        return g
    if _NO_EXCEPTION in text and _NO_EXCEPTION_LINE.search(text.strip()):
        return NativeLine("libstdcxx-terminate", "cpp-abort", "exception", NO_EXCEPTION_DETAIL)
    m = _HEAP.search(text.strip())
    if m is not None:
        msg = m.group("msg") or m.group("msg2")
        vals = {"message": msg, "program": m.group("prog")}
        return NativeLine("glibc-malloc-abort", "heap", "exception", f"glibc abort: {msg}", vals)
    return None


def _gloo_peer_failed(text: str, kind: str) -> NativeLine | None:
    """gloo's monitored barrier failing on a rank (its log line, or the RuntimeError that quotes it), or None."""
    m = _GLOO_PEER_FAILED.search(text)
    if m is None:
        return None
    vals = {"rank": int(m.group("rank")), "peer": int(m.group("peer"))}
    return NativeLine("gloo-monitored-barrier-peer", "peer-failed", kind, clip(m.group(0), 300), vals)


def _xid_line(text: str) -> NativeLine | None:
    m = _XID.search(text)
    if m is not None:
        code = int(m.group("code"))
        known = XID_FAULTS.get(code)
        if known is None:
            return None
        name, fam = known
        msg = m.group("msg").strip().rstrip(".")
        vals = {
            "xid": code,
            "pci": m.group("pci"),
            "pid": m.group("pid"),
            "process": m.group("name"),
            "xid_name": name,
        }
        detail = f"NVRM Xid {code} ({name}) on GPU PCI:{m.group('pci')}" + (f": {msg}" if msg else "")
        return NativeLine(f"nvrm-xid-{code}", fam, "exception", clip(detail, 300), vals)
    b = _OFF_BUS.search(text)
    if b is not None:
        vals = {"xid": 79, "pci": b.group("pci"), "xid_name": XID_FAULTS[79][0]}
        return NativeLine(
            "nvrm-off-bus",
            "gpu-hardware",
            "exception",
            f"NVRM: GPU PCI:{b.group('pci')} has fallen off the bus",
            vals,
        )
    return None


def cuda_error(text: str) -> tuple[str, str, str] | None:
    """The CUDA/HIP runtime error a message quotes (its text, enum name and code, family), or None."""
    said = _CUDA_SAID.search(text)
    if said is None:
        return None
    rest = text[said.start() :]
    return next((e for e in CUDA_ERRORS if e[0] in rest), None)


# an exception line's type (a C++ type keeps its namespace: `c10::Error`) and message
_EXC_HEAD = re.compile(r"([A-Za-z_][\w.]{0,200}(?:::[A-Za-z_]\w{0,80}){0,6}): ?(.*)$", re.S)


@dataclass(frozen=True)
class NativeClass:
    """A failure class's fields (classes.FailureClass takes them as they are)."""

    name: str
    title: str
    proves: str
    does_not_prove: str
    next_step: str
    data: dict[str, Any]


def _who(ev: Event, rank: int | None = None) -> str:
    who = ev.who() if rank is None else f"rank {rank}"
    phase = ev.phase.replace("_", " ") if ev.phase != "unknown" else "an unknown phase"
    return f"{who} ({ev.line.location()}) during {phase}"


def _hardware_lines(facts: Facts) -> list[tuple[Event, NativeLine]]:
    """The GPU hardware faults (driver Xid lines, ROCr ECC/hang) anywhere in the logs, in log order."""
    out = []
    for e in facts.events:
        if e.kind == "exception" and e.detail.startswith(("NVRM", "HW Exception", "Memory access fault")):
            n = read_line(e.line.text, e.line.host)
            if n is not None and n.family == "gpu-hardware":
                out.append((e, n))
    return out


def classify(ev: Event, facts: Facts) -> NativeClass | None:
    """The failure class a native message names for the run's first failure `ev`, or None when it quotes none."""
    native = read_line(ev.line.text, ev.line.host) if ev.kind in ("exception", "nccl") else None
    if native is not None and native.family == "gpu-oom":
        return None  # (classes._gpu_oom)
    text = ev.traceback.exc_message if ev.traceback is not None and ev.traceback.exc_message else ev.detail
    data: dict[str, Any] = {"rank": ev.rank, "phase": ev.phase, "line": ev.line.location()}
    if native is not None:
        data.update({"native": native.id, **{k: v for k, v in native.values.items() if v is not None}})
        if native.family == "ib":
            return _ib(ev, native, data, facts)
        if native.family == "peer-failed":
            return _peer_failed(ev, native, data)
        if native.family == "heap":
            return _heap(ev, native, data)
        if native.family == "cpp-abort":
            return _cpp_abort(ev, data)
        return _gpu(ev, native.family, native.detail, data, facts)
    ib = _IB_COMPLETION.search(ev.detail)
    if ib is not None:
        return _ib(
            ev, NativeLine("nccl-ib-completion", "ib", "nccl", clip(ib.group(0), 300)), data, facts, ib
        )
    if ev.kind == "exception" and (g := _gloo_peer_failed(text, "exception")) is not None:
        data.update(g.values)
        return _peer_failed(ev, g, data)
    err = cuda_error(text)
    if err is None:
        return None
    if ev.kind == "exception":  # (the exception's type and message, as every crash class's data holds them)
        head = _EXC_HEAD.match(ev.detail)
        tb_type = ev.traceback.exc_type if ev.traceback is not None else None
        data["exception"] = tb_type or (head.group(1) if head else None)
        data["message"] = clip(text if tb_type or head is None else head.group(2), 300)
    said = _CUDA_SAID.search(text)
    code = next((g for g in said.groups() if g), None) if said else None
    data.update({"cuda_error": err[0], "cuda_error_enum": err[1], "error_code": int(code) if code else None})
    return _gpu(ev, err[2], clip(text, 240), data, facts, err)


_GPU_TITLES = {
    "gpu-hardware": "GPU hardware/driver fault",
    "gpu-kernel": "GPU kernel fault",
    "gpu-assert": "CUDA device-side assertion",
    "gpu-unavailable": "GPU not usable by this process",
    "gpu-arch": "No GPU code for this GPU's architecture",
}


def _gpu(
    ev: Event,
    family: str,
    said: str,
    data: dict[str, Any],
    facts: Facts,
    err: tuple[str, str, str] | None = None,
) -> NativeClass:
    where = _who(ev)
    hw = [(e, n) for e, n in _hardware_lines(facts) if e is not ev]
    if family == "gpu-kernel" and hw:
        family = "gpu-hardware"  # a kernel fault on a GPU the driver reports faulty: the hardware is the first suspect
    what = f"{err[0]} ({err[1]})" if err else said
    gpu = _gpu_named(data)
    title = _GPU_TITLES[family] + (f": {err[0]}" if err else f" ({gpu})" if gpu else "")
    verb = "reported" if ev.kernel_log else "stopped on"
    proves = f"{where} {verb} {what}" + (f" [{clip(said, 200)}]" if err else "")
    if data.get("pid"):
        proves += f" (process {data['pid']}" + (f", {data['process']}" if data.get("process") else "") + ")"
    proves += "."
    if hw:
        e, n = hw[0]
        proves += f" The kernel log in these logs reports {n.detail} ({e.line.location()})."
        data["hardware_line"] = e.line.location()
    if family == "gpu-hardware":
        not_proven = (
            "that the hardware is broken for good: one fault can be a transient error; which tensors or step were hit, "
            "nor whether the run's results before it were affected (an uncontained error can corrupt them)."
        )
        step = (
            "take this GPU/node out of the job and check it: `nvidia-smi -q -d ECC,ROW_REMAPPER` (or `rocm-smi "
            "--showrasinfo`) and the kernel log (`dmesg | grep -i xid`); resume from the last checkpoint on other "
            "GPUs; if the same GPU faults again, it needs a reset or service."
        )
    elif family == "gpu-kernel":
        not_proven = (
            "which kernel faulted (kernel errors are reported asynchronously, at a later CUDA call) nor whether the "
            "code (a custom/fused kernel, an index out of range, a library bug) or the hardware caused it: no driver "
            "Xid line is in these logs."
        )
        step = (
            "rerun with CUDA_LAUNCH_BLOCKING=1 (HIP_LAUNCH_BLOCKING=1 on ROCm) to get the faulting call in the "
            "traceback; disable fused/custom kernels one at a time (flash-attention, fused Adam, bitsandbytes); check "
            "`dmesg | grep -i xid` on the node for a driver-reported fault."
        )
    elif family == "gpu-assert":
        not_proven = (
            "which assertion fired unless a kernel's `Assertion ... failed` line is in the log above it."
        )
        step = (
            "rerun with CUDA_LAUNCH_BLOCKING=1 (or on CPU) to get the failing operation; the usual cause is an index "
            "out of range: labels or token ids >= the vocabulary/embedding size, a padding id of -1."
        )
    elif family == "gpu-unavailable":
        not_proven = (
            "why: another process holding the GPU in exclusive mode, CUDA_VISIBLE_DEVICES, a container without "
            "GPUs, or a driver older than the CUDA runtime."
        )
        step = (
            "run `nvidia-smi` on the node (the driver version, the compute mode, the processes holding each GPU) and "
            "compare the driver's CUDA version with torch.version.cuda; check CUDA_VISIBLE_DEVICES and the container's "
            "GPU options."
        )
    else:  # gpu-arch
        not_proven = (
            "which library's binary lacks this GPU's architecture (torch, an extension, flash-attention)."
        )
        step = (
            "install builds compiled for this GPU (torch and every CUDA extension: check `torch.cuda.get_arch_list()` "
            "against the GPU's compute capability), or rebuild the extensions with TORCH_CUDA_ARCH_LIST set to it."
        )
    data["family"] = family
    return NativeClass("crash", title, proves, not_proven, step, data)


def _gpu_named(data: dict[str, Any]) -> str | None:
    if "xid" in data:
        return f"Xid {data['xid']} on PCI:{data['pci']}"
    if "gpu_node" in data:
        return f"GPU node-{data['gpu_node']}"
    return None


def _ib(
    ev: Event, native: NativeLine, data: dict[str, Any], facts: Facts, m: re.Match[str] | None = None
) -> NativeClass:
    data["family"] = "ib"
    warns = [e for e in facts.events if "NCCL WARN" in e.line.text]
    if warns:  # (the nearest to this failure, in its own log first)
        near = min(
            warns, key=lambda e: (e.line.source != ev.line.source, abs(e.line.lineno - ev.line.lineno))
        )
        data["nccl_warn"] = clip(near.line.text.strip(), 300)
    said = native.detail
    if m is not None:
        status = int(m.group("status"))
        data.update(
            {
                "ib_status": status,
                "vendor_err": int(m.group("vendor")),
                "peer": m.group("peer"),
                "hca": m.group("hca"),
            }
        )
        words = IBV_WC_STATUS.get(status)
        data["ib_status_text"] = words
        said = (
            f"a work request completed with status {status}"
            + (f" ({words})" if words else "")
            + f", vendor err {m.group('vendor')}"
        )
        if m.group("peer"):
            said += f", peer {m.group('peer')}"
        if m.group("hca"):
            said += f", on {m.group('hca')}"
    else:
        said = (
            f"the mlx5 adapter on {native.values.get('host')} reported a work request that completed with an "
            "error (the CQE dump follows it)"
        )
    return NativeClass(
        "nccl-error",
        "InfiniBand/RoCE transfer failed"
        + (f" ({IBV_WC_STATUS[data['ib_status']]})" if data.get("ib_status") in IBV_WC_STATUS else ""),
        f"{_who(ev)}: {said}. The network adapter could not complete a transfer to its peer.",
        "whether the link (a cable, a switch port, a flapping port), the peer (a rank that died first and closed its "
        "queue pairs) or the configuration (GID index, MTU, RoCE/IB mismatch) caused it.",
        "check whether another rank failed before this line (its own log); `ibstat` / `ibv_devinfo` on both nodes "
        "(port state, link layer), the switch counters; with RoCE set NCCL_IB_GID_INDEX; rerun with NCCL_DEBUG=INFO "
        "NCCL_DEBUG_SUBSYS=NET; transport retry errors (status 12) name a link or a peer that stopped answering.",
        data,
    )


def _peer_failed(ev: Event, native: NativeLine, data: dict[str, Any]) -> NativeClass:
    data["family"] = "peer-failed"
    peer = native.values["peer"]
    return NativeClass(
        "collective-timeout",
        f"Rank {peer} failed or hung at monitored_barrier (gloo)",
        f"{_who(ev, native.values.get('rank'))} reached torch.distributed.monitored_barrier, but its exchange "
        f"with rank {peer} failed: rank "
        f"{peer} stopped (an error, a kill) or timed out before the barrier.",
        f"what happened to rank {peer}: its own log says it.",
        f"read rank {peer}'s log first (an earlier error, an OOM kill); if it was slow rather than dead, raise the "
        "barrier's timeout or find the work only it does before the barrier.",
        data,
    )


def _heap(ev: Event, native: NativeLine, data: dict[str, Any]) -> NativeClass:
    data["family"] = "heap"
    msg = native.values["message"]
    return NativeClass(
        "crash",
        f"Native heap corruption: glibc aborted ({msg})",
        f"{_who(ev)}: glibc's malloc found its heap corrupted (`{msg}`) and aborted the process (SIGABRT): native code "
        "(a C/C++/CUDA extension, a library's binary) wrote past a buffer or freed memory twice.",
        "which library did it: the corruption is found later than it happens, often in another library's free().",
        "get the native stack: run under gdb or with `catchsegv` / `PYTHONFAULTHANDLER=1`, or with "
        "MALLOC_CHECK_=3; check that compiled extensions (flash-attn, apex, bitsandbytes, DeepSpeed ops) were built "
        "against the installed torch; DataLoader workers: try num_workers=0.",
        data,
    )


def _cpp_abort(ev: Event, data: dict[str, Any]) -> NativeClass:
    data["family"] = "cpp-abort"
    return NativeClass(
        "crash",
        "C++ runtime abort: std::terminate with no exception",
        f"{_who(ev)}: the C++ runtime called std::terminate with no exception in flight (`{_NO_EXCEPTION}`) "
        "and aborted the process (SIGABRT): native code destroyed a std::thread that was still running, or an "
        "exception left a noexcept function or a destructor.",
        "which library did it: libstdc++ prints no stack; often a thread pool (a DataLoader's, a C++ extension's) "
        "torn down while the interpreter exits after another error.",
        "look above this line for a first error (a Python exception, a killed worker) that made the process exit; "
        "otherwise get the native stack with gdb (`gdb -ex r -ex bt --args python train.py ...`).",
        data,
    )
