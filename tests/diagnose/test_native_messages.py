"""Messages printed below Python when a job dies are named, each in its source's exact words (native_messages.py lists
the sources), inside a real run's surroundings (rank prefixes, timestamps, a tqdm bar glued in front); the same words
in a healthy run's lines are no failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoctor.diagnose import diagnose
from zerodoctor.diagnose.native_messages import CUDA_ERRORS, XID_FAULTS, cuda_error, read_line
from zerodoctor.findings import Severity

_START = (
    "[2024-05-01 10:00:00,001] [INFO] [launch.py:256:main] process 4242 spawned with command: ['python', 'train.py']\n"
    "[rank0]:[2024-05-01 10:01:12] {'loss': 1.8731, 'grad_norm': 0.91, 'learning_rate': 2e-05, 'epoch': 0.12}\n"
)
_BAR = " 12%|#2        | 120/1000 [02:00<14:40,  1.00s/it]"
_TB = (
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "/opt/train.py", line 88, in <module>\n'
    "[rank1]:     loss.backward()\n"
)


def _top(tmp_path: Path, text: str) -> tuple[dict, object]:
    log = tmp_path / "run.log"
    log.write_text(_START + text)
    top = diagnose([str(log)]).findings[0]
    fc = top.data.get("failure_class") or {"id": top.id, **top.data}
    return fc, top


# (name, log text after a run's start, failure class, words its title or message must hold: the log's own values)
CASES: list[tuple[str, str, str, list[str]]] = [
    (
        "THC check, out of memory (torch <= 1.4)",
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCCachingHostAllocator.cpp line=278 error=2 : out of memory\n",
        "class:gpu-oom",
        ["out of GPU memory"],
    ),
    (
        "THC check, illegal memory access, then the RuntimeError it raises",
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/generic/THCTensorMath.cu line=26 error=77 : an illegal memory "
        "access was encountered\n"
        + _TB
        + "[rank1]: RuntimeError: cuda runtime error (77) : an illegal memory access "
        "was encountered at /pytorch/aten/src/THC/generic/THCTensorMath.cu:26\n",
        "class:crash",
        ["GPU kernel fault", "(77)", "THCTensorMath.cu:26"],
    ),
    (
        "ROCr memory access fault (agent handle form), glued to a tqdm bar",
        _BAR
        + "Memory access fault by GPU node-2 (Agent handle: 0x55d5c1e0a4b0) on address 0x7f3a00000000. Reason: "
        "Page not present or supervisor privilege.\nAborted (core dumped)\n",
        "class:crash",
        ["GPU kernel fault", "GPU node-2", "0x7f3a00000000", "Page not present"],
    ),
    (
        "ROCr memory access fault, ECC reason",
        "Memory access fault by GPU node-5 (Agent handle: 0x5a1) on address 0x7fcd499e6000. Reason: DRAM ECC "
        "failure.\n",
        "class:crash",
        ["GPU hardware/driver fault", "GPU node-5", "DRAM ECC failure"],
    ),
    (
        "ROCr HW exception, GPU hang",
        _BAR + "HW Exception by GPU node-9 (Agent handle: 0x631351bb5a20) reason :GPU Hang\n",
        "class:crash",
        ["GPU hardware/driver fault", "GPU node-9", "GPU Hang"],
    ),
    (
        "mlx5 provider's error CQE dump",
        "mlx5: gpu-node-07: got completion with error:\n"
        "00000000 00000000 00000000 00000000\n"
        "00000000 00008716 0a001f8e 000027d2\n",
        "class:nccl-error",
        ["InfiniBand/RoCE", "gpu-node-07"],
    ),
    (
        "mlx5 dump under a rank prefix",
        "[rank3]: mlx5: n136-096-142: got completion with error:\n",
        "class:nccl-error",
        ["n136-096-142", "rank 3"],
    ),
    (
        "NCCL 2.20.3-2.28.3 IB completion (status=, hca)",
        "node1:2011:2093 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<39361> "
        "with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2 "
        "hca mlx5_0\n",
        "class:nccl-error",
        [
            "transport retry counter exceeded",
            "'ib_status': 12",
            "'vendor_err': 129",
            "10.0.0.2<39361>",
            "mlx5_0",
        ],
    ),
    (
        "NCCL 2.28.7-2.28.9 IB completion (status=words(N), reqSize, vendor_err, req_type)",
        "node1:1234:5678 [0] transport/net_ib.cc:2543 NCCL WARN NET/IB: Got completion from peer 10.0.0.2<52345> "
        "with status=remote access error(10) opcode=RDMA_WRITE(0) reqSize=0 vendor_err=136 req_type=Send localGid "
        "::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2 hca mlx5_2\n",
        "class:nccl-error",
        ["remote access error", "'ib_status': 10", "'vendor_err': 136", "10.0.0.2<52345>", "mlx5_2"],
    ),
    (
        "NCCL 2.29+ IB completion (net_ib/p2p.cc: no reqSize, no req_type)",
        "node1:1234:5678 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer 10.0.0.3<4242> "
        "with status=local protection error(4) opcode=RDMA_READ(2) vendor_err=81 localGid ::ffff:10.0.0.1 "
        "remoteGids::ffff:10.0.0.3 hca mlx5_1\n",
        "class:nccl-error",
        ["local protection error", "'ib_status': 4", "'vendor_err': 81", "10.0.0.3<4242>", "mlx5_1"],
    ),
    (
        "NCCL 2.3-2.9 IB completion (error N, opcode N)",
        "node1:2011:2093 [0] NCCL WARN NET/IB : Got completion with error 5, opcode 0, len 0, vendor err 249\n",
        "class:nccl-error",
        ["Work Request Flushed Error", "'ib_status': 5", "'vendor_err': 249"],
    ),
    (
        "NVRM Xid 79 (pid=, name=) in a dmesg paste",
        "[ 5107.644336] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n",
        "class:crash",
        ["GPU hardware/driver fault", "Xid 79", "PCI:0000:3b:00", "1234"],
    ),
    (
        "NVRM Xid 48 (journalctl, no pid)",
        "May 18 19:02:39 node3 kernel: NVRM: Xid (PCI:0000:2b:00): 48, An uncorrectable double bit error (DBE) has "
        "been detected on GPU in the framebuffer at partition 6, subpartition 0.\n",
        "class:crash",
        ["GPU hardware/driver fault", "Xid 48", "Double Bit ECC Error", "PCI:0000:2b:00"],
    ),
    (
        "NVRM Xid 94 on a MIG instance",
        "NVRM: Xid (PCI:0000:10:00 GPU-I:02 GPU-CI:00): 94, pid=777, name=python3, Contained: SM (0x1). RST: No, "
        "D-RST: No\n",
        "class:crash",
        ["GPU hardware/driver fault", "Xid 94", "PCI:0000:10:00"],
    ),
    (
        "NVRM off the bus without its Xid line",
        "Mar 26 12:33:30 host kernel: NVRM: GPU 0000:65:00.0: GPU has fallen off the bus.\n",
        "class:crash",
        ["GPU hardware/driver fault", "0000:65:00.0"],
    ),
    (
        "glibc >= 2.26 double free, then the shell's abort",
        "[rank0]: double free or corruption (!prev)\nAborted (core dumped)\n",
        "class:crash",
        ["heap corruption", "double free or corruption (!prev)"],
    ),
    (
        "glibc < 2.26 form",
        "*** Error in `/usr/bin/python3': corrupted size vs. prev_size: 0x000055d5c1e0a4b0 ***\n",
        "class:crash",
        ["heap corruption", "corrupted size vs. prev_size"],
    ),
    (
        "glibc malloc top size, glued to a bar",
        _BAR + "malloc(): corrupted top size\n",
        "class:crash",
        ["heap corruption", "malloc(): corrupted top size"],
    ),
    (
        "c10::Error terminate, another thread's abort between it and its what()",
        "[rank0]: terminate called after throwing an instance of 'c10::Error'\n"
        "[rank0]: terminate called recursively\n"
        "[rank0]:   what():  CUDA error: misaligned address\n",
        "class:crash",
        ["GPU kernel fault", "misaligned address", "(716)"],
    ),
    (
        "std::terminate with no exception, then the shell's abort",
        _BAR + "terminate called without an active exception\nAborted (core dumped)\n",
        "class:crash",
        ["std::terminate", "without an active exception"],
    ),
    (
        "std::terminate with no exception under a rank prefix",
        "[rank2]: terminate called without an active exception\n",
        "class:crash",
        ["std::terminate", "rank 2"],
    ),
    (
        "c10::Error terminate + what()",
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
        "incorrect.\n",
        "class:crash",
        ["GPU kernel fault", "an illegal memory access was encountered", "cudaErrorIllegalAddress (700)"],
    ),
    (
        "the NCCL watchdog dying of an ECC error (c10::DistBackendError)",
        "[rank2]:[E1125 06:00:00.000000000 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 2] Process group watchdog thread "
        "terminated with exception: CUDA error: uncorrectable ECC error encountered\n",
        "class:crash",
        ["GPU hardware/driver fault", "uncorrectable ECC error encountered", "rank 2"],
    ),
    (
        "gloo monitored barrier, glog line",
        "[E ProcessGroupGloo.cpp:138] Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
        "for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n",
        "class:collective-timeout",
        ["Rank 0", "rank 1"],
    ),
    (
        "gloo monitored barrier, the RuntimeError",
        _TB
        + "[rank1]: RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
        "for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n",
        "class:collective-timeout",
        ["Rank 0", "rank 1"],
    ),
    (
        "ECC as a Python exception",
        _TB + "[rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n",
        "class:crash",
        ["GPU hardware/driver fault", "cudaErrorECCUncorrectable (214)", "rank 1"],
    ),
    (
        "unspecified launch failure as a Python exception",
        _TB + "[rank1]: RuntimeError: CUDA error: unspecified launch failure\n",
        "class:crash",
        ["GPU kernel fault", "unspecified launch failure"],
    ),
    (
        "a kernel fault with the driver's Xid in the same paste: the hardware is named",
        _TB + "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[ 9001.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n",
        "class:crash",
        ["GPU hardware/driver fault", "Xid 79", "an illegal memory access"],
    ),
    (
        "device-side assert",
        _TB + "[rank1]: RuntimeError: CUDA error: device-side assert triggered\n",
        "class:crash",
        ["device-side assertion"],
    ),
    (
        "busy or unavailable (CUDA 11+ words)",
        _TB + "[rank1]: RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n",
        "class:crash",
        ["GPU not usable", "cudaErrorDevicesUnavailable (46)"],
    ),
    (
        "busy or unavailable (CUDA <= 10 words)",
        _TB + "[rank1]: RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable\n",
        "class:crash",
        ["GPU not usable"],
    ),
    (
        "no device",
        _TB + "[rank1]: RuntimeError: CUDA error: no CUDA-capable device is detected\n",
        "class:crash",
        ["GPU not usable"],
    ),
    (
        "driver older than the runtime",
        _TB
        + "[rank1]: RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n",
        "class:crash",
        ["GPU not usable", "(35)"],
    ),
    (
        "no kernel image",
        _TB + "[rank1]: RuntimeError: CUDA error: no kernel image is available for execution on the device\n",
        "class:crash",
        ["architecture", "(209)"],
    ),
    (
        "HIP error (ROCm build)",
        _TB + "[rank1]: RuntimeError: HIP error: an illegal memory access was encountered\n",
        "class:crash",
        ["GPU kernel fault"],
    ),
    (
        "NCCL 2.19+'s CUDA check with the error's number",
        "node1:1234:1300 [1] NCCL WARN Cuda failure 214 'uncorrectable ECC error encountered'\n",
        "class:crash",
        ["GPU hardware/driver fault", "'error_code': 214"],
    ),
    (
        "ROCr memory access fault, older form (no agent handle)",
        "Memory access fault by GPU node-4 on address 0x7551d8402000. Reason: Write access to a read-only page.\n",
        "class:crash",
        ["GPU kernel fault", "GPU node-4", "0x7551d8402000", "read-only page"],
    ),
    (
        "NCCL's CUDA check on a launch timeout",
        "node1:1234:1300 [0] enqueue.cc:1118 NCCL WARN Cuda failure 'the launch timed out and was terminated'\n",
        "class:crash",
        ["GPU kernel fault", "the launch timed out and was terminated"],
    ),
]


@pytest.mark.parametrize(("name", "text", "class_id", "must_say"), CASES, ids=[c[0] for c in CASES])
def test_each_native_message_names_its_class(
    tmp_path: Path, name: str, text: str, class_id: str, must_say: list[str]
) -> None:
    fc, top = _top(tmp_path, text)
    assert fc["id"] == class_id, (name, top.id, top.title)  # type: ignore[attr-defined]
    # (a knowledge-base entry that names the failure keeps the class's values in its data)
    said = f"{top.title} {top.message} {fc}"  # type: ignore[attr-defined]
    for words in must_say:
        assert words in said, (name, words, said)


def test_the_earliest_failure_stays_first(tmp_path: Path) -> None:
    """A native line, then the Python traceback it caused on another rank: the native line is the first failure."""
    fc, top = _top(
        tmp_path,
        "[rank0]: mlx5: gpu-node-07: got completion with error:\n"
        + _TB
        + "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
        "exited or there was a network error, NCCL version 2.20.5\n",
    )
    assert fc["id"] == "class:nccl-error" and fc["native"] == "mlx5-error-cqe", (top.id, fc)  # type: ignore[attr-defined]


def test_a_python_traceback_before_a_native_line_stays_first(tmp_path: Path) -> None:
    fc, _ = _top(tmp_path, _TB + "[rank1]: ValueError: bad batch\n[rank1]: double free or corruption (out)\n")
    assert fc["id"] == "class:crash" and fc.get("native") is None and fc["exception"] == "ValueError"


# the same words in a healthy run: none may become a failure
HEALTHY: list[tuple[str, str]] = [
    (
        "NCCL INFO lines of a healthy start",
        "node1:2011:2011 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB ib0:10.0.0.1<0>\n"
        "node1:2011:2093 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
        "node1:2011:2093 [0] NCCL INFO comm 0x55d5c1e0 rank 0 nranks 8 cudaDev 0 busId 3b000 - Init COMPLETE\n",
    ),
    (
        "the word Xid in an unrelated line",
        "[INFO] health check: no Xid errors in dmesg (checked Xid 79, Xid 48)\n"
        "Xid (PCI:0000:3b:00) monitor started\n",
    ),
    (
        "an Xid code that is no GPU fault (45: cleanup after a process was killed)",
        "[ 5107.6] NVRM: Xid (PCI:0000:3b:00): 45, pid=1234, name=python, Ch 00000010\n",
    ),
    (
        "ECC in nvidia-smi output",
        "| GPU  Name        Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |\n"
        "|   0  NVIDIA A100-SXM4-80GB  On | 00000000:3B:00.0 Off |                    0 |\n"
        "        Volatile\n            DRAM Uncorrectable            : 0\n"
        "    Retired Pages\n        Double Bit ECC                    : N/A\n",
    ),
    (
        "THC's warning at exit",
        "THCudaCheckWarn FAIL file=/pytorch/aten/src/THC/THCStream.cpp line=50 error=29 : driver shutting down\n",
    ),
    (
        "a CUDA error string in prose",
        "[INFO] tip: if you see an illegal memory access was encountered, set CUDA_LAUNCH_BLOCKING=1\n",
    ),
    (
        "heap words inside a sentence",
        "[INFO] fixed a double free or corruption (!prev) crash in the tokenizer (release notes)\n",
    ),
    (
        # (NVIDIA's Xid catalog: 63 records a retirement/remap that worked, 92 counts corrected single-bit errors,
        # 61 is the micro-controller's breakpoint/warning; the job runs on)
        "Xid 63 (row remapping recorded) in a dmesg paste",
        "[Wed May  1 10:01:00 2024] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
        "remapping, reset gpu to activate.\n",
    ),
    (
        "Xid 92 (high single-bit ECC error rate)",
        "May 18 19:02:39 node3 kernel: NVRM: Xid (PCI:0000:3b:00): 92, pid=1896, name=python, High single-bit ECC "
        "error rate\n",
    ),
    (
        "Xid 61 (micro-controller breakpoint/warning)",
        "[ 5107.6] NVRM: Xid (PCI:0000:3b:00): 61, pid=1896, name=python, 0cd8(2e38) 00000000 00000000\n",
    ),
    (
        "native messages quoted in prose",
        'WARNING: if you see "free(): invalid pointer" with bitsandbytes, upgrade it.\n'
        "[tips] free(): invalid pointer\n"
        "[tips] double free or corruption (out) means an extension mismatch; see FAQ\n"
        "UserWarning: this may print: terminate called without an active exception (harmless)\n"
        "hint: mlx5: got completion with error means the link dropped\n"
        "Known CUDA issue: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus. is reported by dmesg\n",
    ),
    (
        "mlx5 and completion words in an INFO line",
        "node1:2011:2011 [0] NCCL INFO NET/IB: Dev 0 Port 1 qpn 1234 mtu 5 LID 12 subnet-prefix fe80 (mlx5_0)\n"
        "[INFO] waiting for completion with error handling enabled\n",
    ),
]


@pytest.mark.parametrize(("name", "text"), HEALTHY, ids=[h[0] for h in HEALTHY])
def test_the_same_words_in_a_healthy_run_are_no_failure(tmp_path: Path, name: str, text: str) -> None:
    log = tmp_path / "run.log"
    log.write_text(_START + text + " 100%|##########| 1000/1000 [16:40<00:00,  1.00s/it]\n")
    findings = diagnose([str(log)]).findings
    assert all(f.severity is not Severity.ERROR for f in findings), (
        name,
        [(f.id, f.title) for f in findings],
    )


def test_std_terminate_at_exit_after_the_run_finished_is_no_failure(tmp_path: Path) -> None:
    """A run that finished (the trainer's summary, its model saved), then libstdc++'s abort at exit: a thread torn down
    then. (A shell's `Aborted (core dumped)` after it is still read as the process's SIGABRT exit.)"""
    done = (
        "{'train_runtime': 100.0, 'train_samples_per_second': 10.0, 'train_steps_per_second': 1.0, 'train_loss': "
        "1.2, 'epoch': 1.0}\n"
        "[INFO|trainer.py:3000] 2024-05-01 10:02:00,000 >> Saving model checkpoint to out/\n"
    )
    abort = "terminate called without an active exception\n"
    log = tmp_path / "run.log"
    log.write_text(_START + done + abort)
    assert all(f.severity is not Severity.ERROR for f in diagnose([str(log)]).findings)
    # the same abort before the run's end is the failure
    fc, _ = _top(tmp_path, abort + done)
    assert fc["id"] == "class:crash" and fc["native"] == "libstdcxx-terminate", fc


@pytest.mark.parametrize(
    "said",
    [
        "with status=transport retry counter exceeded(12) opcode=RDMA_WRITE(0) reqSize=0 vendor_err=129 req_type=Send",
        "with status=transport retry counter exceeded(12) opcode=RDMA_WRITE(0) vendor_err=129",
        "with status=12 opcode=0 len=0 vendor err 129 (Send)",
    ],
)
def test_the_knowledge_base_reads_ib_status_12_in_every_nccl_form(tmp_path: Path, said: str) -> None:
    fc, top = _top(
        tmp_path,
        f"node1:1234:5678 [0] NCCL WARN NET/IB: Got completion from peer 10.0.0.2<52345> {said} hca mlx5_0\n",
    )
    assert top.id == "nccl-ib-completion-error-12", (top.id, top.title)  # type: ignore[attr-defined]


def test_a_kernel_log_line_takes_no_phase_and_no_rank_from_the_training_log(tmp_path: Path) -> None:
    """dmesg pasted below a training log: its place says nothing about when the fault happened, and no rank printed
    it."""
    fc, top = _top(
        tmp_path,
        "[INFO|trainer.py:3000] 2024-05-01 10:02:00,000 >> Saving model checkpoint to out/\n"
        "[Wed May  1 10:01:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the "
        "bus.\n",
    )
    assert fc["id"] == "class:crash" and fc["xid"] == 79 and fc["phase"] == "unknown", fc
    said = f"{top.title} {top.message}"  # type: ignore[attr-defined]
    assert "the GPU driver" in said and "a rank" not in said and "checkpoint save" not in said, said


def test_the_table_reads_each_runtime_string_only_where_a_cuda_call_said_it() -> None:
    for text, enum, family in CUDA_ERRORS:
        assert cuda_error(f"RuntimeError: CUDA error: {text}") == (text, enum, family)
        assert cuda_error(f"Cuda failure '{text}'") == (text, enum, family)
        assert cuda_error(f"the docs say {text}") is None


def test_every_xid_fault_reads_with_its_code_and_pci_address() -> None:
    for code, (name, family) in XID_FAULTS.items():
        n = read_line(f"NVRM: Xid (PCI:0000:af:00): {code}, pid=99, name=python, some driver text")
        assert (
            n is not None
            and n.family == family
            and n.values["xid"] == code
            and n.values["pci"] == "0000:af:00"
        )
        assert name in n.detail
    for code in (45, 61, 63, 92):  # (no failure of the job: see XID_FAULTS)
        assert code not in XID_FAULTS
        assert read_line(f"NVRM: Xid (PCI:0000:af:00): {code}, pid=99, name=python, some driver text") is None
