"""The extractor's own line patterns, scanned in the same pass as the knowledge-base signatures.

Like KB signatures they stay unanchored (the engine sees raw lines, prefixes included; the extractor's own
anchored regexes run on the normalised text), stay within what RE2 and hyperscan accept (no lookaround, no back-references), are
matched against single lines, and must be rare in a healthy log: every line that hits is decoded and handed
to the extractors, so a pattern that hits every step would cost the speed target. Training progress (tqdm
bars, trainer loss dicts), which is on every step, is therefore not here: `scan` finds the last progress
line before a failure with literal `rfind`s on the chunk (PROGRESS_LITERALS).
"""

from __future__ import annotations

import re

from zerodoctor.diagnose import native_messages
from zerodoctor.diagnose.reader import log_float, log_int

# deepspeed.initialize's own checks of where its config came from (deepspeed/__init__.py, 0.3 to 0.19.8: `assert config
# is None, "Not sure how to proceed, we were given deepspeed configs in the deepspeed arguments and deepspeed.initialize()
# function call"` - one release continued the string with a backslash, so blanks stand inside it -, `... we were given
# both a deepscale_config and deepspeed_config`, `DeepSpeed requires --deepspeed_config to specify configuration
# file`): messages users paste without their `AssertionError: `, raised only while the engine is being built
DS_INIT_ASSERT = (
    r"Not sure how to proceed, we were given (?:deepspeed configs in the deepspeed\s+arguments"
    r"|both a deepscale_config and deepspeed_config)|DeepSpeed requires --deepspeed_config to specify configuration"
)

# name -> pattern. The name's prefix says which extractor reads the line.
EXTRACTOR_PATTERNS: dict[str, str] = {
    # Python tracebacks
    "tb-head": r"Traceback \(most recent call last\)",
    # (a paste cut inside a frame line keeps only `...py", line N, in f`)
    # (and a frame line a terminal cut right after its line number, `File "x.py", line 15` / `3, in f`: the scan
    # joins the wrapped rest)
    # (and a frame line copied as padded terminal rows on one line, cut anywhere: `File "...tr` + blanks + `l/x.py",
    # line 3` - reader.unpad_rows removes the padding before the line is read)
    # (and a frame header a terminal cut anywhere else - inside its path, or its `, line N, in `: `  File "/x/con` +
    # `fig.py", line 700`, `  File "/x/config.py", line 700, i` + `n f`; the scan joins the wrapped rest)
    "tb-frame": r'(File "[^"\n]+|\.py)", line \d+, in |File "[^"\n]+\.py", line \d+\s*$'
    r'|File "[^\n]{1,250} {8}[^ \n]'
    r'|^\s*File "[^"\n]{1,250}$|File "[^"\n]+",(?: (?:l(?:i(?:ne?)?)?|line \d+,?(?: i)?)?)?\s*$',
    # IPython / Jupyter frames: `~/x/cpp_extension.py in _run_ninja_build(...)`, `File /x/engine.py:1184, in F(...)`
    # (and rich's boxed tracebacks, rich/traceback.py _render_stack: `│ /x/deepspeed/runtime/engine.py:1008 in
    # _do_sanity_check │`, the path sometimes wrapped onto the line above)
    "tb-frame-ipy": r"\.py in [A-Za-z_][A-Za-z0-9_.]*\(|File \S+\.py:\d+, in [A-Za-z_]"
    r"|\.py:\d+ in [A-Za-z_<][A-Za-z0-9_.<>]* *(│ *)?$"
    # (rich wrapping the function name onto the box's next row: `│ /x/pc.py:200 in   │`)
    r"|\.py:\d+ in *│ *$",
    # (also inside Markdown emphasis or inline code: `**AssertionError**`, `*Exception: ...*`)
    # CPython's unraisable-exception report (Python/errors.c format_unraisable, the default sys.unraisablehook):
    # `Exception ignored in: <finalize object at 0x...; dead>` (3.8+), `Exception ignored while calling deallocator
    # ...` / `Exception ignored on threading shutdown` (3.13+), then the traceback of an exception the process went on
    # after (a __del__ or weakref finalizer raising, math_verify's timeout handler firing in one)
    # CPython's refusal of an unknown keyword, quoted in a sentence (extract._QUOTED_KWARG)
    "quoted-kwarg": r"\w\(\) got an unexpected keyword argument '",
    "unraisable": r"^Exception ignored (in|on|while|during)\b",
    # a paste's own words that the run stopped moving, with no failure printed (`And then it stuck here with gpu util
    # 100% and didn't log out anything`, `training hangs at 96%`, `卡住了`): read only when the log holds no failure and
    # its last progress bar is unfinished (judge._stalled)
    "said-stalled": r"\b([Ii]t|[Tt]raining|[Tt]he (run|job|process|program|script|training)) ((is|was|got|gets|just|then"
    r"|seems|seemed|has|had|been|always|still) ){0,3}(stuck|hangs|hanging|hung|freezes|froze|frozen)\b"
    r"|\b[Ss]tuck (here|there|at \d)|卡住|卡死",
    "tb-exception": r"[A-Za-z_][A-Za-z0-9_.]*(Error|Exception|Interrupt|Failure|Exit)(\([A-Za-z_][A-Za-z0-9_.]*\))?"
    # (debugpy's note after the type in VS Code's exception widget: extract._VSCODE_EXC)
    r"(: |:?[*_`]*\s*$|\s+\(note: full exception trace )"
    r"|^[\s*_`]*Exception: \S|VersionConflict: \(",
    # a config class refusing values (DeepSpeed's pydantic config models, HF/accelerate dataclasses)
    "config-validation": r"\d+ validation errors? for [A-Za-z_]",
    # a device out of memory, in the words of each accelerator's allocator or runtime (extract.DEVICE_OOM lists
    # their sources; Triton's OutOfResources is no allocation failure and is not here), and host OOM
    "oom-cuda": r"CUDA out of memory|OutOfMemoryError|(HIP|NPU|XPU) out of memory|MPS backend out of memory"
    r"|(CUDA|HIP|CUDA driver) error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|Cuda failure (\d{1,3} )?'out of memory'|(CUDA|[Cc]uda) [Ee]rror: out of memory|cudaErrorMemoryAllocation"
    r"|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY|Out of memory error on GPU \d"
    r"|RESOURCE_EXHAUSTED: (Out of memory|Failed to allocate)|OOM when allocating tensor"
    r"|Workspace can't be allocated, no?t? enough memory|Error out of memory at line \d+ in file "
    # (Ascend CANN's device-memory error codes and the runtime's driver reason: extract.DEVICE_OOM)
    r"|\bE(L0004|L0019|I0011|N0012): |reason=\[driver error:out of memory\]"
    r"|\d\d:\d\d\.\d{3}\.\d{3} Failed to allocate (memory\.|\S{1,40} device memory|\[\d{1,20}\] bytes of NPU memory)"
    # (vLLM's engine refusing to start without GPU memory for its KV cache: extract.DEVICE_OOM)
    r"|No available memory for the cache blocks|KV cache is needed, which is larger than the available KV cache memory"
    r"|larger than the maximum number of tokens that can be stored in KV cache"
    r"|Free memory on device \([\d.]{1,12}/[\d.]{1,12} GiB\) on startup is less than desired GPU memory utilization",
    # (the kernel's OOM killer and memory cgroup, mm/oom_kill.c and mm/memcontrol.c; Kubernetes' container status
    # `Reason: OOMKilled` in `kubectl describe pod`, `OOMKilled` in `kubectl get pods`; docker inspect's
    # `"OOMKilled": true`)
    # (and the task table the OOM killer alone prints, mm/oom_kill.c dump_tasks: its header, and its rows
    # "[%7d] %5d %5d %8lu %8lu %8ld %8lu %5hd %s" -- pid, uid, tgid, total_vm, rss, pgtables_bytes, swapents,
    # oom_score_adj, name -- for a dmesg paste that kept only the table, ktransformers#637)
    # (kernels before 5.0 print the choice and the kill on two lines, mm/oom_kill.c oom_kill_process: `Out of memory: Kill
    # process 23456 (python) score 912 or sacrifice child`, then `Killed process 23456 (python) total-vm:...kB,
    # anon-rss:...kB` - `, UID 1000,` inside on RHEL 7's 3.10 -; the reaper's `oom_reaper: reaped process N (name), now
    # anon-rss:0kB` follows every kill since 4.6, __oom_reap_task_mm)
    # (Slurm's cgroup plugins count the kernel's kills in a step: `Detected 1 oom-kill event(s) in StepId=1.0. Some of
    # your processes may have been killed by the cgroup out-of-memory handler.` (task/cgroup, cgroup v1), `Detected 1
    # oom_kill event in StepId=1.0. Some of the step tasks have been OOM Killed.` (cgroup/v2, 22.05+), printed by
    # slurmstepd or as `error: ...` in the job's output file; jobacct_gather's own limit, src/common/slurm_jobacct_gather.c
    # `%ps exceeded memory limit (%lu > %lu), being killed`; srun's report of the task, `srun: error: node12: task 0: Out
    # Of Memory`; sacct's job state OUT_OF_MEMORY, `OUT_OF_ME+` in its default 10-column table)
    "oom-host": r"Out of memory: Killed process|oom-kill:|invoked oom-killer|Memory cgroup out of memory"
    r"|Out of memory: Kill process \d|Killed process \d{1,10} \([^)\n]{0,64}\),? (UID \d{1,10}, )?total-vm:"
    r"|oom_reaper: reaped process \d"
    r"|Detected \d{1,9} oom[-_]kill events?|exceeded memory limit \(\d{1,20} > \d{1,20}\), being killed"
    r"|: tasks? [\d,-]{1,200}: Out Of Memory|\bOUT_OF_ME(MORY\b|\+)"
    r"|Reason:\s+OOMKilled|\sOOMKilled\s+\d|\"OOMKilled\": ?true|reason: OOMKilled"
    r"|Tasks state \(memory values in pages\)|pgtables_bytes swapents oom_score_adj name"
    r"|\[ {0,6}\d{1,7}\] +\d{1,10} +\d{1,10} +\d{1,20} +\d{1,20} +\d{1,20} +\d{1,20} +-?\d{1,4} +\S",
    # launcher outcomes
    "launch-ds-rc": r"exits with return code = -?\d+",
    "launch-elastic-failed": r"failed \(exitcode: -?\d+\)",
    "launch-elastic-exitcode": r"exitcode\s*:\s*-?\d+",
    "launch-elastic-rank": r"rank\s*: \d+ \(local_rank: \d+\)",
    "launch-signal": r"Signal \d+ \(SIG[A-Z]+\) received by PID \d+",
    "launch-killing": r"sigkill_handler\] Killing subprocess \d+|Sending process \d+ closing signal SIG[A-Z]+",
    "launch-mpirun": r"mpirun noticed that process rank \d+ with PID \d+ on node \S+ exited on signal \d+",
    "launch-child-failed": r"ChildFailedError",
    # torchrun's agent stopped by a signal sent to it (torch/distributed/elastic/agent/server/api.py: `Received %s death
    # signal, shutting down workers` on SignalException): a scheduler's SIGTERM, a user's Ctrl-C (2); `%s` of the
    # signal.Signals it holds prints `15` on Python >= 3.11 and `Signals.SIGTERM` on Python <= 3.10 (IntEnum's str)
    # ... and the same signal in each worker, which the handler elastic/multiprocessing/api.py installs there turns into
    # `SignalException(f"Process {os.getpid()} got signal: {sigval}")` (an IntEnum's format: the number)
    "launch-death-signal": r"Received (?:\d+|Signals\.SIG[A-Z]{2,8}) death signal, shutting down workers"
    r"|SignalException: Process \d{1,10} got signal: (?:\d{1,3}|Signals\.SIG[A-Z]{2,8})",
    # the shell reporting a SIGKILLed foreground job: bash `Killed` (often glued to a progress bar; in a GitHub
    # comment often in Markdown emphasis, `**Killed**`), zsh `[1]    26478 killed     python train.py`, and a
    # non-interactive bash's job report (jobs.c notify_of_job_status: `/bin/bash: line 27: 318 Killed  sh start.sh`)
    "launch-shell-killed": r"(^|\]|[ \t|])(\*{1,3}|_{1,3})?Killed(\*{1,3}|_{1,3})?[ \t]*\r?$"
    r"|\[\d+\]\s+\d+\s+killed\s+\S|: line \d{1,7}: +\d{1,10} Killed\b",
    # a child process that a signal ended, as its parent reports it: torch.multiprocessing.spawn
    # (torch/multiprocessing/spawn.py ProcessContext.join: `process %d terminated with signal %s`) and joblib's loky
    # executor (joblib/externals/loky/process_executor.py TerminatedWorkerError: `The exit codes of the workers
    # are {SIGKILL(-9)}`)
    "launch-child-signal": r"process \d{1,6} terminated with signal SIG[A-Z]{2,8}"
    r"|exit codes of the workers are \{[^}\n]{0,200}\}"
    # (and the tail of subprocess.CalledProcessError's text on a line of its own - CPython Lib/subprocess.py __str__:
    # `Command '[...]' died with <Signals.SIGKILL: 9>.`, the command line long enough that a terminal or a paste puts
    # the tail apart; accelerate launch's simple_launcher raises it for the training process)
    r"|died with <Signals\.SIG[A-Z]{2,8}: \d{1,3}>",
    # the shell's report of a job another signal ended (bash prints strsignal(); zsh `[1]  26478 segmentation fault
    # python train.py`; Bus error is the KB's fw-exitcode-7-sigbus-shm), and a DataLoader worker's own report
    # (torch/csrc/DataLoader.cpp SIGSEGV/SIGFPE handlers)
    "launch-shell-signal": r"(^|\]|[ \t|])(Segmentation fault|Aborted|Floating point exception|Illegal instruction"
    r"|Terminated)( \(core dumped\))?[ \t]*\r?$"
    r"|\[\d+\]\s+\d+\s+(segmentation fault|abort|floating point exception|illegal hardware instruction"
    r"|terminated)\s+\S"
    # (its SIGBUS handler's line too, `ERROR: Unexpected bus error encountered in worker. This might be caused by
    # insufficient shared memory (shm).`: the KB's fw-exitcode-7-sigbus-shm names the cause, the event places it)
    r"|ERROR: Unexpected (?:segmentation fault|floating-point exception|bus error) encountered in worker"
    # (a non-interactive bash's job report, jobs.c notify_of_job_status -> pretty_print_job(JLIST_NONINTERACTIVE):
    # `train.sh: line 29: 3411753 Segmentation fault      (core dumped) python main.py ...`, the status padded
    # and the command behind it; the words are strsignal(3)'s, bash siglist.c / glibc's sys_siglist)
    r"|: line \d{1,7}: +\d{1,10} (Segmentation fault|Aborted|Floating point exception|Illegal instruction)\b"
    # (UCX's fatal-signal handler, in every process of an MPI / HPC-X / NCCL-UCX stack: ucs/debug/debug.c prints
    # `[host:pid:idx:tid] Caught signal 11 (Segmentation fault: address not mapped to object at address (nil))`, the
    # signal's strsignal() and si_code text, then `==== backtrace (tid: N) ====`; the process dies of the signal)
    r"|Caught signal \d{1,2} \((?:Segmentation fault|Bus error|Floating point exception|Illegal instruction|Aborted)[:)]",
    # a user stopping the run: the terminal's echo of Ctrl-C (`^C`, often glued onto the next line) or the
    # KeyboardInterrupt it raises
    "interrupt": r"(^|\s)\^C|KeyboardInterrupt",
    "launch-slurm": r"slurmstepd: error: .*(oom-kill|OOM Killed|CANCELLED|DUE TO TIME LIMIT)",
    # a process's exit status 137 (128 + SIGKILL) as the tool that ran it reports it: kubectl exec (`command terminated
    # with exit code 137`, k8s.io/kubectl pkg/cmd/util/helpers.go), docker compose (`train-1 exited with code 137`),
    # PyCharm's run console (`Process finished with exit code 137 (interrupted by signal 9: SIGKILL)`)
    "launch-exit-137": r"(command terminated with exit|Process finished with exit|[\w.-] exited with) code 137\b",
    # NCCL
    "nccl-error": r"NCCL error|NCCL WARN|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError"
    r"|ncclInvalidUsage"
    # (torch 1.x's own NCCL calls, torch/csrc/cuda/nccl.cpp throw_nccl_error: `NCCL Error <ncclResult_t>:
    # <ncclGetErrorString>` thrown as std::runtime_error - 1 unhandled cuda error, 2 unhandled system error, 3
    # internal error, 4 invalid argument, 5 invalid usage; a C++ abort prints it as `what(): NCCL Error 1: ...`)
    r"|NCCL Error \d{1,2}: [a-z]",
    "nccl-watchdog": r"Watchdog caught collective operation timeout|ProcessGroupNCCL.* (timeout|Timeout|abort)"
    r"|Some NCCL operations have failed or timed out"
    # the heartbeat monitor (torch >= 2.2): the watchdog itself stuck in a NCCL/CUDA call, the process terminated
    r"|watchdog got stuck for \d+ seconds|Terminating the process after attempting to dump debug info"
    # (ProcessGroupNCCL.cpp heartbeatMonitor, torch 2.2+: `[PG 0 Rank 25] Heartbeat monitor timed out! Process will be
    # terminated after dumping debug info. workMetaList_.size()=2`)
    r"|Heartbeat monitor timed out! Process will be terminated"
    # the watchdog's own C++ stack (WorkNCCL::checkTimeout), for pastes that keep only the frames of the timeout
    r"|Exception raised from checkTimeout at |ProcessGroupNCCL::WorkNCCL::checkTimeout\(",
    "nccl-peer": r"Connection (reset|closed) by (peer|remote peer)|remote process exited or there was a network error",
    # the distributed set-up completing, for a log that stops right after it (extract.ends_after_init): NCCL's
    # communicator (init.cc: `comm 0x... rank 0 nranks 8 cudaDev 0 busId 1000 - Init COMPLETE`), DeepSpeed's comm
    # (comm/comm.py init_distributed: `Initializing TorchBackend in DeepSpeed with backend nccl`), torch's store barrier
    # (distributed_c10d.py _store_based_barrier: `Added key: store_based_barrier_key:1 to store for rank: 0`, `Rank 0:
    # Completed store-based barrier for key:store_based_barrier_key:1 with 8 nodes.`, `Waiting in store based barrier
    # to initialize process group for rank: ...`) and ProcessGroupNCCL's barrier warning (`using GPU 0 to perform
    # barrier as devices used by this process are currently unknown`)
    "dist-init": r"NCCL INFO .{0,200} Init COMPLETE|Initializing TorchBackend in DeepSpeed with backend "
    r"|Added key: store_based_barrier_key:\d+ to store for rank|Completed store-based barrier for key"
    r"|Waiting in store based barrier to initialize process group|to perform barrier as devices used by this process",
    # versions printed by the run
    "ver-ds-info": r"DeepSpeed info: version=",
    "ver-ds-report": r"(torch|deepspeed|transformers|accelerate) (version|info) \.{3,}",
    "ver-freeze": r"(deepspeed|torch|transformers|accelerate|peft|bitsandbytes|trl|xtuner|llamafactory"
    r"|flash[-_]attn)==[0-9]",
    "ver-hf-env": r"- (`transformers` version|PyTorch version|Accelerate version|DeepSpeed version"
    r"|PEFT version|bitsandbytes version): ",
    # phase markers (rare lines)
    # dataset preparation: LLaMA-Factory/HF datasets map, TRL's dataset preparation, XTuner's processing
    # (HF datasets' map/filter bars, hf_tqdm(unit=" examples"), end in "examples/s]"; SentencePiece's trainer log,
    # google/sentencepiece src/trainer_interface.cc TrainerInterface::LoadSentences / InitMetaPieces: `LOG(INFO) <<
    # "Loading corpus: "`, `"Loaded " << N << " lines"`, `"Adding meta_piece: "` - a tokenizer being trained)
    "phase-data": r"Running tokenizer on dataset|Tokenizing (?:train|eval) dataset|Applying chat template to"
    r"|Converting format of dataset|Map \(num_proc=\d+\)|Packing (?:train|eval) dataset"
    r"| examples/s\]|(?:^|\s)Map: +\d+%"
    r"|trainer_interface\.cc\(\d+\) LOG\(INFO\) (?:Loaded \d+ lines|Loading corpus|Adding meta_piece)",
    # (transformers >= 5 loads weights under tqdm(desc="Loading weights"))
    # (transformers' PretrainedConfig.from_pretrained warns `You are using a model of type llama to instantiate a model
    # of type llava` - backticked from 5.x, configuration_utils.py - while from_pretrained reads the config)
    "phase-load": r"Loading checkpoint shards|loading weights file|Loading model from|Instantiating \w+ model under"
    r"|While copying the parameter named |Loading weights: +\d+%"
    r"|You are using a model of type `?\w+`? to instantiate a model of type"
    # a Ray worker running a task that loads pretrained weights: Ray titles a worker `ray::{task_name}` while a task
    # runs and `ray::{ClassName}` once it is done (python/ray/_raylet.pyx execute_task: title / next_title), and its
    # memory monitor's kill report lists the top memory users' command lines, the titles (`5313  202.20
    # ray::CriticModelRayActor.init_model_from_pretrained`, OpenRLHF's actors' init_model_from_pretrained)
    r"|ray::\w{1,120}\.\w{0,80}from_pretrained\b",
    # torch's load_state_dict error for one parameter (the RuntimeError that collects them may not be pasted)
    # a CUDA kernel assertion (ATen/.cu file), printed per thread before `CUDA error: device-side assert triggered`
    # (CUDA's device-side assert prints `FILE:LINE: KERNEL: block: [x,y,z], thread: [x,y,z] Assertion `COND` failed.`;
    # the coordinates are padded in some builds, and pastes run through a translator keep them but not the words)
    "cuda-kernel-assert": r"block: \[\d+,\d+,\d+\], thread: \[ ?\d+,\d+,\d+\] ?(Assertion `|\S)",
    # torch's c10d socket logging a rendezvous/store connection that timed out before it raises DistNetworkError
    # (torch/csrc/distributed/c10d/socket.cpp: `[c10d] The client socket has timed out after 900s while trying to
    # connect to (host, port).`)
    "c10d-socket": r"\[c10d\] The client socket has timed out after ",
    # torch's JIT/setup build refusing a toolkit that is not the one torch was built with (torch/utils/cpp_extension.py
    # CUDA_MISMATCH_MESSAGE, printed on the line below a bare `RuntimeError:`: `The detected CUDA version (11.8)
    # mismatches the version that was used to compile`)
    # (and bitsandbytes 0.37-0.41's native-library check, bitsandbytes/cuda_setup/main.py, printed the same way)
    "cuda-mismatch": r"The detected CUDA version \([0-9.]{1,12}\) mismatches the version that was used to compile"
    r"|CUDA Setup failed despite GPU being available",
    "load-copy-error": r"While copying the parameter named \"[^\"]+\", whose dimensions in the model are",
    # torch's load_state_dict per-parameter error inside `Error(s) in loading state_dict for X:`
    "load-size-mismatch": r"size mismatch for [A-Za-z0-9_.]+: copying a param with shape ",
    # resuming: HF Trainer, DeepSpeed's checkpoint engine, XTuner/mmengine
    "phase-resume": r"Continuing training from checkpoint|\[Torch\] Loading checkpoint from|Resum(?:e|ing) (?:training )?from"
    r" (?:checkpoint|the checkpoint)|resumed from checkpoint|Loading (?:ZeRO|zero) checkpoint"
    r"|Resume checkpoint from |Auto resumed from |Attempting to resume from "
    # DeepSpeed's engine loading ZeRO states (0.19.8 engine.py), accelerate's Accelerator.load_state
    r"|[Ll]oading \d+ zero partition checkpoints for rank|successfully read \d+ ZeRO state_dicts for rank"
    r"|loaded universal zero checkpoints from|Loading states from "
    # accelerate checkpointing.py load_accelerator_state (under Accelerator.load_state): `All model weights loaded
    # successfully`, then the optimizer, scheduler, dataloader sampler and random states; litgpt's finetune/pretrain
    # scripts: fabric.print(f"Resuming training from {resume}") before fabric.load
    r"|All (?:model weights|optimizer states|scheduler states|dataloader sampler states|random states) loaded"
    r" successfully|Resuming training from ",
    "phase-zero-init": r"activating zero\.init\(\)|Detected DeepSpeed ZeRO-3: activating|zero\.Init|"
    r"partition_parameters\.py:\d+:__exit__\] finished initializing model",
    # deepspeed.initialize (any caller: HF Trainer, accelerate, LLaMA-Factory, TRL, XTuner): the engine's own
    # start lines, the optimizer it builds, the ops it JIT-builds for it
    "phase-engine": r"DeepSpeed Final Optimizer|Time to load \w+ op|DeepSpeed LR Scheduler = |DeepSpeed info: version="
    r"|Creating (?:\S+ )?ZeRO stage \d optimizer|DeepSpeed Basic Optimizer = |Using client Optimizer as basic optimizer"
    r"|Building extension module \w+|Error building extension '|ninja: build stopped: subcommand failed",
    # the training loop starts: HF Trainer (LLaMA-Factory, TRL), mmengine (XTuner)
    "phase-train": r"\*{5} Running training \*{5}|Checkpoints will be saved to "
    # Megatron-LM's train() (megatron/training/training.py, and Megatron-DeepSpeed / Pai-Megatron-Patch's copies):
    # print_datetime('before the start of training step') right before its iteration loop prints `[before the start of
    # training step] datetime: 2025-05-06 12:45:42`; mmf's TrainerTrainingLoopMixin.training_loop
    # (mmf/trainers/core/training_loop.py) logs `Starting training...` as its logger `mmf.trainers.core.training_loop`
    r"|\[before the start of training step\] datetime: |trainers\.core\.training_loop: Starting training\b",
    "phase-eval": r"\*{5} Running (Evaluation|Prediction) \*{5}|Epoch\(val\)|Running evaluation",
    # evaluation markers that later training progress closes: Lightning's validation / sanity-check bars,
    # DeepSpeed-Chat's `***** Evaluating ...`, lm-eval's `Running <type> requests`, and the evaluation loops of
    # transformers' examples (examples/legacy run_squad.py / run_language_modeling.py and the projects built on them:
    # `for batch in tqdm(eval_dataloader, desc="Evaluating")`), whose bar prints `Evaluating:  37%|...`
    # (the bare word at a line's start - `Evaluating the results...` - is kept only because
    # tests/diagnose/test_phase_evidence.py pins it: no framework printing it was found, see the round-8 report)
    "phase-eval-open": r"Validation DataLoader \d+: |Sanity Checking DataLoader \d+: |\*{5} Evaluating "
    r"|Running (?:loglikelihood|loglikelihood_rolling|generate_until|greedy_until) requests"
    r"|(?:^|[\]:|] ?)Evaluating\b"
    # a tqdm bar whose description ends in Evaluation / Validation (tqdm std.py format_meter: `{desc}: {percentage:3.0f}%|`,
    # e.g. LMOps MiniLLM's `Generation Evaluation:  99%|`, `Validation: 100%|`): an evaluation loop's own bar
    r"|(?:Evaluation|Validation): {1,3}\d{1,3}%\|",
    "phase-save": r"Saving model checkpoint to|Checkpoint global_step\d+ is (ready now|about to be saved)"
    r"|\[Rank \d+\] Saving model checkpoint|Saving checkpoint at \d+ (?:iterations|epochs)"
    r"|\[Torch\] Saving \S+global_step|Saving model weights to |Saving current state to "
    r"|Saving checkpoint\. This may take some time"
    # training loops that name which checkpoint they write: ai2's ACE (fme/ace/train/train.py save_all_checkpoints:
    # logging.info(f"Saving latest checkpoint to {path}"), then its best / EMA checkpoints), and the same words in many
    # training scripts of the code index (`print("Saving latest checkpoint")`, `logger.info("Saving best checkpoint")`,
    # `Saving the final checkpoint`) - a phrase, not one script's line
    r"|[Ss]aving (?:the )?(?:latest|last|best|final) (?:model )?checkpoint"
    # DeepSpeedEngine._save_checkpoint (0.19.8), transformers >= 5 save_pretrained's tqdm
    r"|Saving model checkpoint: |Writing model shards: +\d+%"
    # CompVis latent-diffusion / stable-diffusion main.py melk(): the save on a signal or exception, and its forks
    r"|Summoning checkpoint\."
    # TheLastBen/fast-stable-diffusion Dreambooth/train_dreambooth.py (the Colab notebooks' trainer): print(" SAVING
    # CHECKPOINT...") before save_pretrained and the convertosdv2.py subprocess, then print("Done, resuming training
    # ...") (printed behind the tqdm bar's line) - the upstream script's own lines, kept
    r"|SAVING CHECKPOINT\.\.\."
    # litgpt finetune/pretrain: fabric.print(f"Saving checkpoint to {str(path)!r}") / `Saving LoRA weights to '...'` /
    # `Saving weights to '...'` before fabric.save; transformers save_pretrained writing shards (modeling_utils.py:
    # `The model is bigger than the maximum size per checkpoint ({max_shard_size}) and is going to be split in N
    # checkpoint shards`)
    r"|Saving (?:LoRA weights|weights|checkpoint) to '|The model is bigger than the maximum size per checkpoint",
    # ("Checkpoint global_stepN is ready now!" is printed while HF's save sequence still runs: not "done")
    "phase-save-done": r"zero checkpoint saved|Done, resuming training \.\.\.",
    "phase-finished": r"Training completed\. Do not forget|\{'train_runtime': |Training finished",
    "phase-eval-done": r"\{'eval_loss': ",
    # the runtime guard's own line (zerodoctor guard [rank R, step S, PHASE]: ...), on stderr and in its error files
    "phase-guard": r"zerodoctor guard \[rank \d+, step \S+, \w+\]",
    # source lines of traceback frames that name what the run was doing (read only inside a traceback)
    "code-engine": r"accelerator\.prepare\(|deepspeed\.initialize\(|deepspeed_init\(|_prepare_deepspeed\(",
    # (torch.autograd.backward / graph._engine_run_backward's source line, the frame under every `loss.backward()`)
    "code-train": r"\.backward\(|\.training_step\(|\.compute_loss\(|_execution_engine\.run_backward\(",
    "code-eval": r"\.evaluate\(|\.evaluation_loop\(|\.prediction_step\(|\.predict\(",
    "code-step": r"optimizer\.step\(\)|engine\.step\(\)|model\.step\(\)",
    # an assert / raise statement as a frame's source line (a paste cut before its exception line)
    "code-assert": r"\s{2}assert \S",
    "code-raise": r"\s{2}raise [A-Za-z_][A-Za-z0-9_.]*(Error|Exception)\(",
    # a C++ exception that ended the process (no Python traceback): `terminate called after throwing an instance of
    # 'c10::Error'` then `  what():  CUDA error: ...`
    # an OSError printed as its str() alone (`[Errno 2] No such file or directory: 'x'`), as scripts log it
    "bare-oserror": r"\[Errno \d+\] [A-Z][a-z]",
    # the CUDA_CHECK_RETURN macro of NVIDIA's samples that bitsandbytes' kernels use (csrc/ops.cuh: `Error %s at line %d
    # in file %s` with cudaGetErrorString, then exit(1)): `Error named symbol not found at line 74 in file .../ops.cu`
    # - the library's binary does not match the CUDA it runs on (its out-of-memory form is "oom-cuda")
    "cuda-check-return": r"Error [a-z][a-z ]{2,60} at line \d+ in file \S+\.(cu|cuh|cpp|c)\b",
    # a script's argparse refusing its command line (extract.ARGPARSE names the messages): `train.py: error:
    # unrecognized arguments: --local-rank=0`
    "argparse": r": error: (unrecognized arguments: |the following arguments are required: |argument -)",
    # xtuner's command line catching what its mode raised (xtuner/entry_point.py cli: `except Exception as e:
    # print_log(f"WARNING: command error: '{e}'!", ...)`, then the usage text and `return`): the command did not run
    "xtuner-cmd-error": r"WARNING: command error: '.{1,400}'!",
    "cpp-terminate": r"terminate called after throwing an instance of '",
    # a c10::Error's backtrace header (c10/util/Exception.cpp Error::Error(SourceLocation, msg): `Exception raised from
    # FUNC at FILE:LINE (most recent call first):`; Habana's bridge throws it as `Habana exception raised from ...`),
    # and an error line of torch's C++ logging (c10/util/logging_is_google_glog.h / c10's own: `[E326
    # 08:57:33.451117940 compiler_depend.ts:418] msg` from torch 2.3, `[E ProcessGroupNCCL.cpp:587] msg` before) -
    # extract pairs them: such an error line right above the header is the exception's message
    "cpp-raised": r"[Ee]xception raised from \S{1,200} at \S{1,300} \(most recent call first\):",
    "glog-error": r"\[E(\d{3,4} \d\d:\d\d:\d\d\.\d{3,9})? [^\]\n]{1,120}:\d{1,6}\] \S",
    # a shell that could not run a command: the launcher, the interpreter or a tool is not installed or not on PATH
    # (extract.NOT_FOUND lists each shell's wording and its source)
    "shell-not-found": r": command not found|command not found: [\w.+-]|: \d+: [\w./+-]+: not found\s*$"
    r"|Unknown command: [\w./+-]|: bad interpreter: |env: .{0,3}[\w./+-]+.{0,3}: No such file or directory",
    # a JIT op build: the extension's name on ninja's compile command (torch/utils/cpp_extension.py
    # _write_ninja_file_to_build_library puts -DTORCH_EXTENSION_NAME={name} on every compile line)
    "ninja-ext": r"-DTORCH_EXTENSION_NAME=\w+",
    # nvcc's command line as torch's cpp_extension builds it (_get_cuda_arch_flags: `-gencode=arch=compute_86,code=...`
    # for every architecture): a CUDA compile ran in this log
    "nvcc-cmd": r"-gencode[= ]arch=compute_\d",
    # ninja's report of the build step that failed (ninja src/status_printer.cc BuildEdgeFinished: `FAILED: ` then the
    # step's outputs; ninja >= 1.12 adds `[code=N] `), for a C++/CUDA object or the extension library
    "ninja-failed": r"FAILED: (?:\[code=-?\d+\] )?\S+\.(?:o|so|obj|pyd)\b",
    # the toolchain failing a JIT op build (torch/utils/cpp_extension.py runs ninja -> c++ / nvcc / the linker), in
    # the tools' own words: the linker failing the link step (GNU ld / gold / lld: `/usr/bin/ld: cannot find -lcurand`,
    # ld >= 2.40 adds `: No such file or directory`; lld `ld.lld: error: unable to find library -lcurand`; gcc's
    # driver `collect2: error: ld returned 1 exit status` - `collect2: ` reads as a host prefix, reader._PREFIXES, so
    # the pattern starts after it), a header the compiler cannot find (gcc/clang/nvcc `fatal error: Python.h: No such
    # file or directory`), nvcc refusing its input (`nvcc fatal   : Unsupported gpu architecture 'compute_90'`), CUDA's
    # crt/host_config.h refusing the host compiler (`#error -- unsupported GNU version! gcc versions later than 12 are
    # not supported!`)
    "toolchain-failed": r"error: ld returned \d+ exit status|ld(\.[a-z]+)?: cannot find -l[A-Za-z0-9_+.-]+"
    r"|ld(\.lld)?: error: unable to find library -l|fatal error: [^ :]+: No such file or directory"
    r"|nvcc fatal +: |#error -- unsupported [A-Za-z ]{1,40} version!"
    # (gcc's own notice that it stopped on that fatal error, gcc/diagnostic.cc: `compilation terminated.`)
    r"|compilation terminated\.",
    # pip building a package from source that failed (a C++/CUDA extension package: flash-attn, apex, deepspeed with
    # DS_BUILD_OPS, bitsandbytes): pip/_internal/wheel_builder.py `Failed building wheel for %s`, pip 21-23's `ERROR:
    # Could not build wheels for %s, which is required to install pyproject.toml-based projects`, pip 24+'s `ERROR:
    # Failed to build installable wheels for some pyproject.toml based projects (%s)`; the compiler's exit as
    # setuptools' distutils reports it (_distutils/spawn.py DistutilsExecError: `error: command '/usr/local/cuda/bin/nvcc'
    # failed with exit code 1`, `exit status 1` before setuptools 59); and pip's own success line, which ends it (pip <
    # 23 installs with `setup.py install` after a failed wheel build)
    "pip-build": r"Failed building wheel for [A-Za-z0-9]|Could not build wheels for [A-Za-z0-9]"
    r"|Failed to build installable wheels for some pyproject"
    r"|error: command '[^'\n]{1,250}' failed with exit (status|code) \d"
    r"|Successfully installed [A-Za-z0-9]",
    # DeepSpeed's communication API used before its backend was set (deepspeed/comm/comm.py: `assert cdb is not None
    # and cdb.is_initialized(), 'DeepSpeed backend not set, please initialize it using init_process_group()'` in
    # every collective wrapper, 0.6.5 to 0.19.8), a message users paste without its `AssertionError: `
    "ds-backend-unset": r"DeepSpeed backend not set, please initialize it using init_process_group",
    # a stack dump of a live process: CPython's faulthandler (Python/traceback.c: `Thread 0x... (most recent call
    # first):`, `Current thread 0x...`, `Stack (most recent call first):`, frames `  File "F", line N in FUNC` - no
    # comma before `in`; dump_traceback_later's `Timeout (0:05:00)!`; a crash's `Fatal Python error: `) and py-spy
    # dump (`Thread 12345 (idle): "MainThread"`, frames `    FUNC (FILE.py:N)`), the tools users run on a hung job
    "fh-head": r"(Thread|Current thread) 0x[0-9a-fA-F]+ \(most recent call first\):|Stack \(most recent call first\):"
    r"|Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!|Fatal Python error: "
    r"|Thread (0x[0-9A-Fa-f]+|\d+) \((active|idle)[^)]{0,20}\): \"",
    # (each alternative starts at a literal - `", line ` and ` (` - so the scan stays literal-driven)
    "fh-frame": r"\", line \d+ in [A-Za-z_<]|[A-Za-z0-9_>] \([^ ()]+\.py:\d+\)\s*$",
    # ProcessGroupNCCL's watchdog thread ending on an exception that is no timeout (a CUDA fault it surfaced:
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp ncclCommWatchdog, "Process group watchdog thread terminated
    # with exception: " + e.what())
    "nccl-watchdog-exc": r"[Ww]atchdog thread terminated with exception: ",
    "cpp-what": r"what\(\):\s+\S",
    # messages printed below Python (CUDA/HIP runtimes, NVIDIA's driver, ROCr, the mlx5 verbs provider, gloo, glibc's
    # malloc): native_messages.py holds their table, their sources and the reader of the lines this pattern hits
    "native": native_messages.SCAN_PATTERN,
    # a frame writing a checkpoint: the engines' and trainers' save calls, accelerate's Accelerator.save_state and
    # the HF Trainer's save_state (accelerator.py, trainer.py), DeepSpeed's engine.save_16bit_model, OpenRLHF's
    # strategy.save_ckpt (openrlhf/utils/deepspeed/deepspeed.py), ColossalAI's booster.save_optimizer
    # (colossalai/booster/booster.py), and LLaVA's / FastChat's gathering save helpers (llava/train/train.py
    # safe_save_model_for_hf_trainer, fastchat/train/train.py trainer_save_model_safe)
    "code-save": r"\.save_checkpoint\(|\._save_checkpoint\(|\.save_model\(|\.save_pretrained\(|\.save_state\("
    r"|\.save_16bit_model\(|\.save_ckpt\(|\.save_optimizer\(|safe_save_model_for_hf_trainer\(|trainer_save_model_safe\(",
    # a frame reading training state back - an optimizer's or LR scheduler's state dict (torch/optim/optimizer.py
    # Optimizer.load_state_dict, torch/optim/lr_scheduler.py LRScheduler.load_state_dict: a fresh run creates that
    # state, only a resume loads it; the failure is often in the torch.load evaluated inside the call), DeepSpeed's
    # engine.load_checkpoint (runtime/engine.py), HF Trainer's _load_from_checkpoint / _load_optimizer_and_scheduler
    # (trainer.py): a resume
    # (and accelerate's accelerator.load_state (accelerator.py), ColossalAI's booster.load_optimizer
    # (colossalai/booster/booster.py), OpenRLHF's strategy.load_ckpt (openrlhf/utils/deepspeed/deepspeed.py), all
    # called only to resume)
    "code-resume": r"(optimizer|scheduler|optim)\.load_state_dict\(|\.load_checkpoint\(|\._load_from_checkpoint\("
    r"|\._load_optimizer_and_scheduler\(|\.load_state\(|\.load_optimizer\(|\.load_ckpt\(",
    # a frame inside transformers' TrainingArguments.main_process_first(desc=...) (training_args.py: the main process
    # runs the block first, the others wait at a barrier; the examples and LLaMA-Factory wrap their dataset map in
    # it: `desc="dataset map tokenization"`, `"grouping texts together"`, `"dataset map pre-processing"`)
    "code-tokenize": r"\.main_process_first\(desc=",
    # a model's forward as its frames' source lines show it (torch.nn.functional and the HF decoder layers): a
    # forward pass, of training unless evaluation is running (see extract.phase_of)
    "code-forward": r"= input\.softmax\(dim|return torch\.embedding\(|F\.scaled_dot_product_attention\("
    r"|= self\.self_attn\(|= self\.mlp\(|= self\.lm_head\(|= self\.embed_tokens\(",
    # torch.nn.Module.to()/.cuda()/.half() (Module._apply(convert)): the whole model placed or cast at load; a
    # frame calling the loader (`model = load_model(...)`, `X.from_pretrained(...)`)
    # (and LLaVA's `= load_pretrained_model(` (llava/model/builder.py), Lightning Fabric's `.load_raw(` (litgpt's load of
    # pretrained weights), ColossalAI's `LazyInitContext.materialize(` (colossalai/lazy/lazy_init.py))
    "code-load": r"return self\._apply\(convert\)|return t\.to\(device, dtype if t\.is_floating_point"
    r"|= load_model\(|\.from_pretrained\(|= load_pretrained_model\(|\.load_raw\(|LazyInitContext\.materialize\(",
    # failure messages that are only raised in one phase (the reasons: extract._MESSAGE_PHASE_REASONS)
    "msg-forward": r"ds_status == ZeroParamStatus\.AVAILABLE|indexSelect(?:Large|Small)Index"
    r"|srcIndex < srcSelectDimSize|'status': '(?:INFLIGHT|NOT_AVAILABLE)', 'numel'",
    "msg-train": r"no_sync context manager is incompatible|object has no attribute 'no_sync'",
    # (and torch's load_state_dict refusal, torch/nn/modules/module.py Module.load_state_dict: `Error(s) in loading
    # state_dict for X:` with its `size mismatch for NAME: copying a param with shape` lines; a resume's frames, when
    # printed, are read first)
    "msg-load": r"Cannot copy out of meta tensor|Error\(s\) in loading state_dict for "
    r"|size mismatch for [A-Za-z0-9_.]+: copying a param with shape "
    # transformers' PreTrainedModel.from_pretrained refusing a device_map / low_cpu_mem_usage under ZeRO-3
    # (modeling_utils.py, 4.2x-4.4x: `DeepSpeed Zero-3 is not compatible with `low_cpu_mem_usage=True` or with
    # passing a `device_map`.`; pastes drop or change the backticks)
    r"|DeepSpeed Zero-3 is not compatible with \W?low_cpu_mem_usage=True",
    # HF datasets' Dataset.map with num_proc when a worker process died (utils/py_utils.py iflatmap_unordered, under
    # arrow_dataset.py Dataset.map: RuntimeError("One of the subprocesses has abruptly died during map operation.To debug the
    # error, disable multiprocessing.")): the frameworks' dataset tokenization / preprocessing
    "msg-tokenize": r"One of the subprocesses has abruptly died during map operation",
    "msg-engine": DS_INIT_ASSERT,
    # FSDP's full-state-dict hook failing to copy a gathered parameter (torch/distributed/fsdp/_state_dict_utils.py
    # _full_post_state_dict_hook's param_hook, torch 2.0-2.13: `Failed to clone() tensor with name {fqn} on rank
    # {rank}. This may mean that this state_dict entry could point to invalid memory regions after returning from
    # state_dict() call if this parameter is managed by FSDP. ... Error: {e}`): a full state dict is gathered to save
    "msg-save": r"Failed to clone\(\) tensor with name |state_dict entry could point to invalid memory regions after",
    # transformers' Trainer.train with resume_from_checkpoint=True and no `checkpoint-N` folder in the output directory
    # (trainer.py: `raise ValueError(f"No valid checkpoint found in output directory ({args.output_dir})")`, 4.x-5.x)
    "msg-resume": r"No valid checkpoint found in output directory",
    # (the same deepspeed.initialize assertions, read as the failure when pasted without their type: extract)
    "ds-init-assert": DS_INIT_ASSERT,
    # gradient accumulation as the run prints it (XTuner config dump, HF "Running training" block, DS config)
    # the Trainer's save / eval interval (extract.INTERVAL reads the number)
    "interval": r"(save|eval)_steps\"?( ?= ?|[ =]+|: ?)\d",
    "accum": r"accumulative_counts\s*=\s*\d+|Gradient Accumulation steps = \d+|\"gradient_accumulation_steps\": \d+",
    # coloured lines are re-scanned after the colour codes are removed
    "ansi": r"\x1b\[",
}

# Training progress: literals that every progress line contains, searched backwards from a failure.
PROGRESS_LITERALS: tuple[bytes, ...] = (
    b"it/s]",
    b"s/it]",
    b"it/s, ",  # a bar with a postfix
    b"s/it, ",
    b"'epoch': ",
    b"] step=",
    b"Iter(train) [",
    b"Epoch(train)",
    # pytorch/examples' ProgressMeter (imagenet/main.py, copied into many training scripts): `Epoch: [0][ 415/1736]`
    b"Epoch: [",
    # litgpt's finetune/pretrain loops (finetune/adapter.py, lora.py, full.py, pretrain.py: fabric.print(f"iter
    # {iter_num} step {step_count}: loss {loss.item():.4f}, iter time: {...:.2f}ms"), older ones `train time:`; later
    # `Epoch E | iter I step S | loss train: ...| iter time: ...`); step_count counts optimizer steps
    b"iter time: ",
    b"train time: ",
    # Megatron-LM's training_log (megatron/training/training.py; Megatron-DeepSpeed and the forks too): `[2025-04-13
    # 23:41:12] iteration       10/    1000 | consumed samples: 160 | elapsed time per iteration (ms): 1147.6 |`, the
    # iteration counter first, `elapsed time per iteration (ms): ` in every version since 2019
    b"time per iteration (ms): ",
    # mmf's training log (mmf/utils/logger.py summarize_report -> log_progress, since MMF's rename in 2020: the dict
    # `{"progress": f"{num_updates}/{max_updates}", <meter>, <extra>}` joined as `key: value, ...` or dumped as JSON,
    # its extra holding `num_updates` - trainers/callbacks/logistics.py on_update_end / on_validation_end)
    b"num_updates: ",
    b'num_updates": ',
    # a tqdm bar whose unit is a step (`tqdm(..., unit="step")` in training scripts): tqdm's format_meter prints its
    # rate as `{rate:5.2f}{unit}/s` or, slower than one per second, `{1/rate:5.2f}s/{unit}` (std.py rate_noinv_fmt,
    # rate_inv_fmt; tqdm 4.x): `5.00step/s`, `6.00s/steps`
    b"step/s",
    b"steps/s",
    b"s/step",
)
# a tqdm bar cut right after its bar characters (a paste, a terminal row): `{percentage:3.0f}%|` starts every bar
# without a description (tqdm std.py format_meter's l_bar); _PCT_BAR reads only such a line's start. Found by this
# regex, the lines _PCT_BAR reads, not by the literal `%|`: every bar holds that, and a download's or a dataset map's
# bar in other units (`42%|███| 42M/10000M [00:01<00:01, 246MB/s]`, one line per update) is no progress line
_CUT_BAR = rb"[ \t\r\f\v]{0,4}\d{1,3}(?P<bar>%\|)[^|\n]*(?=\n|\Z)"
CUT_BAR_LINE = re.compile(rb"\n" + _CUT_BAR)  # (a line found by its newline: ten times as fast as `(?m)^`)
CUT_BAR_HEAD = re.compile(_CUT_BAR)  # (a chunk's first line)
# (a bar with a postfix, as Lightning and set_postfix print it: `1.37it/s, loss=2.6, v_num=95nc]`)
# (a bar with no description whose counts were cut off: its percentage is all it shows)
_PCT_BAR = re.compile(r"^\s{0,4}(\d{1,3})%\|")
_TQDM = re.compile(r"(\d+)/(\d+) \[[\d:]+<[\d:?]+,\s*[^\]]*(?:(?:it|steps?)/s|s/(?:it|steps?))(?:,[^\[\]]*)?\]")
_HF = re.compile(r"\{'loss': [^}]*'epoch': ([\d.]+)")
_DS = re.compile(r"\] step=(\d+), skipped=")
_MM = re.compile(r"(?:Epoch\(train\)\s*\[(\d+)\])?\s*\[\s*(\d+)/(\d+)\]")
_MM_ITER = re.compile(r"Iter\(train\) \[\s*(\d+)/(\d+)\]")
_METER = re.compile(r"Epoch: \[(\d+)\]\[\s*(\d+)/(\d+)\]")
# (Megatron's iteration counts optimizer steps: one global batch each)
_MEGATRON = re.compile(r"\biteration\s{1,12}(\d{1,12})\s{0,12}/\s{0,12}(\d{1,12}) \|")
_MMF = re.compile(r"(?:\bprogress: |\"progress\": \")(\d{1,12})/(\d{1,12})[,\"]")
_LITGPT = re.compile(r"\biter (\d{1,12}) step (\d{1,12})(?::| \|) loss\b.{0,120}\b(?:iter|train) time: ")


# Progress bars of work that is not training (loading, data preparation, generation): not training progress.
_NOT_TRAINING = re.compile(
    r"Loading checkpoint shards|^\s*Map\b|Map \(num_proc|Tokeniz|Running tokenizer|Generat"
    r"|Download|Convert|Fetching|Filter|Packing|Preprocess|Loading weights|Writing model shards|examples/s\]"
)
# the HF Trainer's save and evaluation intervals as a run prints them: the command line (`--save_steps 1000`),
# TrainingArguments' repr (`save_steps=1000,`), a JSON or YAML config (`"save_steps": 1000`, `save_steps: 1000`)
INTERVAL = re.compile(r"(?<![\w-])(?:--)?(save|eval)_steps\"?(?: ?= ?|[ =]+|: ?)(\d{1,9})(?![\d.])")
ACCUM = re.compile(
    r"(?:accumulative_counts\s*=\s*|Gradient Accumulation steps = |\"gradient_accumulation_steps\": )(\d+)"
)


def parse_progress(text: str) -> tuple[str, int | None, int | None, float | None] | None:
    """(kind, completed steps, total steps, epoch) from the last progress update in a line, or None."""
    if _NOT_TRAINING.search(text):
        return None
    last: tuple[str, int | None, int | None, float | None] | None = None
    for m in _TQDM.finditer(text):
        last = ("tqdm", log_int(m.group(1)), log_int(m.group(2)), None)
    if last is not None:
        return last
    pct = _PCT_BAR.match(text)
    if pct is not None and "|" not in text[pct.end() :]:
        # the bar's percentage out of 100 (kind `tqdm-pct`: no step count to compare with a save interval)
        return ("tqdm-pct", min(log_int(pct.group(1)) or 0, 100), 100, None)
    m2 = _HF.search(text)
    if m2:
        return ("trainer", None, None, log_float(m2.group(1)))
    m3 = _DS.search(text)
    if m3:
        return ("deepspeed", log_int(m3.group(1)), None, None)
    m4 = _MM_ITER.search(text)
    if m4:
        return ("mmengine", log_int(m4.group(1)), log_int(m4.group(2)), None)
    m6 = _METER.search(text)
    if m6:
        return ("meter", log_int(m6.group(2)), log_int(m6.group(3)), log_float(m6.group(1)))
    m7 = _LITGPT.search(text)
    if m7:
        return ("litgpt", log_int(m7.group(2)), None, None)
    if "time per iteration (ms): " in text:
        m8 = _MEGATRON.search(text)
        if m8:
            return ("megatron", log_int(m8.group(1)), log_int(m8.group(2)), None)
    if "num_updates" in text:
        m9 = _MMF.search(text)
        if m9:  # (mmf counts optimizer updates: num_updates of max_updates)
            return ("mmf", log_int(m9.group(1)), log_int(m9.group(2)), None)
    if "Epoch(train)" in text:
        m5 = _MM.search(text)
        if m5 and m5.group(2):
            epoch = log_float(m5.group(1)) if m5.group(1) else None
            return ("mmengine", log_int(m5.group(2)), log_int(m5.group(3)), epoch)
    return None
