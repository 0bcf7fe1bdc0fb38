"""Review R6 of diagnose round 12 (issue 10): each problem R6 found, as its probe (small, in memory) that failed before
the fix.

- an exception quoted in prose is not the failure when a raised one follows it in the same log, nor when the run went
  on after it (bars past the log's last hit line), nor when the quotes hold a program's text that only mentions one.
- a SIGKILL (exit 137) after a run's end: an OOM line anywhere keeps it a host OOM, a second run's start ends the
  first run's end, docker compose's per-container exit is not deferred, and its next step is the kill's (dmesg).
- VS Code's exception widget: a header above the terminal's traceback yields to it, a run that went on after the
  widget outlived it, debugpy's `(note: ...)` suffix and the zh-cn/ja headers are read.
- a KB fix can be ranked first for one signature: vLLM refusing an empty weight gets the gather-before-sync fix.
- deepspeed.initialize's assert statement quoted from its source, and a fork's `No valid checkpoint found` note
  without its ValueError, are no failure and no resume.
"""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml
from test_source_forms_r11 import _run, _top  # (pytest puts this directory on sys.path)
from test_source_forms_r12 import RUN_END, RUN_START

from zerodoctor.findings import Severity
from zerodoctor.kb import validate

ENTRY = Path(validate.__file__).parent / "entries" / "z3-empty-partition-outside-engine.yaml"

# a traceback as the interpreter prints it (torch's CUDA error raised in a forward)
ILLEGAL_ACCESS_TB = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 50, in <module>\n'
    "    trainer.train()\n"
    '  File "/env/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl\n'
    "    return forward_call(*args, **kwargs)\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
)
MORE_BARS = " 20%|##        | 2/10 [00:02<00:08, 1.00it/s]\n 30%|###       | 3/10 [00:03<00:07, 1.00it/s]\n"


def _no_error(tmp_path: Path, text: str) -> None:
    d = _run(tmp_path, text)
    assert all(f.severity != Severity.ERROR for f in d.findings), d.findings


# ---- 1. a quoted exception before the real traceback --------------------------------------------------------------
def test_an_error_quoted_before_the_pasted_traceback_is_not_the_failure(tmp_path):
    for said in (
        'Earlier I got "ValueError: Tokenizer class LlamaTokenizer does not exist" and fixed it, but now:\n',
        "Earlier I got `ValueError: Tokenizer class LlamaTokenizer does not exist` and fixed it, but now:\n",
    ):
        top = _top(tmp_path, said + ILLEGAL_ACCESS_TB)
        assert top.data["first_failure"]["line"] == 7, top
        assert "illegal memory access" in top.title, top.title


def test_an_error_quoted_in_curly_quotes_before_a_bare_oom_line(tmp_path):
    text = (
        "I tried the suggestion from #123 (\u201cRuntimeError: Expected all tensors to be on the same device\u201d) "
        "but it did not apply. Log:\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.06 MiB is free.\n"
    )
    top = _top(tmp_path, text)
    assert top.data["first_failure"]["line"] == 2, top


# ---- 2. a quoted exception the run trained on after (no hit line after it) ----------------------------------------
def test_a_quoted_error_followed_only_by_bars_is_no_failure(tmp_path):
    _no_error(
        tmp_path, RUN_START + 'note: "ValueError: something odd" was printed by the reward fn\n' + MORE_BARS
    )


def test_a_model_completion_that_mentions_an_error_is_no_failure(tmp_path):
    # (the quotes hold a sampled completion, which only names the exception inside its sentence)
    _no_error(
        tmp_path,
        RUN_START
        + 'sample 3 completion: "I think the answer raises TypeError: unsupported operand type(s) for +: int and str"\n',
    )


def test_a_quoted_error_at_the_end_of_a_paste_is_still_the_failure(tmp_path):
    # (negative of the two above: nothing ran after it, and the quotes open on the exception)
    top = _top(tmp_path, RUN_START + 'then it printed "ValueError: something odd" and stopped\n')
    assert top.severity == Severity.ERROR and "ValueError" in top.title, top


# ---- 3-6. an exit status 137 after a run's end ---------------------------------------------------------------------
KUBECTL_137 = (
    "command terminated with exit code 137\n"  # kubectl exec (k8s.io/kubectl pkg/cmd/util/helpers.go)
)


def test_an_exit_137_after_the_end_that_kubectl_says_was_oomkilled_is_a_host_oom(tmp_path):
    describe = (
        "$ kubectl describe pod train-0\n"
        "    Last State:     Terminated\n"
        "      Reason:       OOMKilled\n"
        "      Exit Code:    137\n"
    )
    top = _top(tmp_path, RUN_START + RUN_END + KUBECTL_137 + describe)
    assert top.data["failure_class"]["id"] == "class:host-oom-kill", top


def test_a_second_run_killed_while_loading_or_tokenizing_is_a_kill_not_an_exit_after_the_end(tmp_path):
    for second, phase in (
        ("Loading checkpoint shards:  50%|#####     | 1/2 [00:30<00:30, 30.0s/it]\n" + KUBECTL_137, "load"),
        (
            "Running tokenizer on dataset:  40%|####      | 400/1000 [00:10<00:15, 40.0 examples/s]\n"
            "train-1 exited with code 137\n",
            "tokenization",
        ),
    ):
        top = _top(tmp_path, RUN_START + RUN_END + second)
        assert top.data["failure_class"]["id"] == "class:host-oom-kill", top
        assert top.data["phase"] == phase, top


def test_a_compose_container_killed_while_the_others_train_on_is_the_failure(tmp_path):
    text = (
        RUN_START
        + "worker-1 exited with code 137\n"
        + "worker-0  | {'loss': 1.2, 'learning_rate': 1e-05, 'epoch': 0.3}\n"
        + " worker-0  |  30%|###       | 3/10 [00:03<00:07, 1.00it/s]\n"
        + "worker-0  | [E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=100, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800123 "
        "milliseconds before timing out.\n"
    )
    top = _top(tmp_path, text)
    assert top.data["failure_class"]["id"] == "class:host-oom-kill", top


def test_a_sigkill_after_the_end_gets_the_kill_s_next_step_not_the_abort_s(tmp_path):
    top = _top(tmp_path, RUN_START + RUN_END + "Saving model checkpoint to ./out\n" + KUBECTL_137)
    assert "after the run had finished" in top.title, top.title
    text = top.message + " ".join(f.text for f in top.fixes)
    assert "dmesg" in text and "zerodoctor plan" in text, text
    assert "aborted" not in text and "abort." not in text, text


# ---- 7-8, 13. VS Code's exception widget ---------------------------------------------------------------------------
def test_a_vscode_header_above_the_terminal_s_traceback_lets_the_traceback_name_the_failure(tmp_path):
    for prefix in ("", "[rank0]: "):
        text = (
            "Exception has occurred: RuntimeError\n"
            f"{prefix}Traceback (most recent call last):\n"
            f'{prefix}  File "train.py", line 3, in <module>\n'
            f"{prefix}    main()\n"
            f"{prefix}RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n"
        )
        top = _top(tmp_path, text)
        assert top.data["first_failure"]["line"] == 5, top
        assert "Traceback" not in top.data["first_failure"]["text"], top


def test_a_vscode_widget_the_run_went_on_after_is_no_failure(tmp_path):
    _no_error(tmp_path, "Exception has occurred: KeyError\n'labels'\n" + RUN_START + RUN_END)


def test_vscode_widget_with_debugpy_s_note_or_a_localized_header_is_read(tmp_path):
    for head in (
        # debugpy, stopped in another frame than the one that raised
        "Exception has occurred: KeyError       (note: full exception trace is shown but execution is paused at: "
        "<module>)",
        # the zh-cn and ja editors' translations of the header
        "发生异常: KeyError",
        "例外が発生しました: KeyError",
    ):
        top = _top(tmp_path, head + "\n'running_avg'\n")
        assert top.severity == Severity.ERROR and "KeyError" in top.data["first_failure"]["text"], top


# ---- 9. vLLM refusing an empty weight: the weight-sync fix first ---------------------------------------------------
def test_vllm_refusing_an_empty_weight_ranks_the_gather_before_its_sync_first(tmp_path):
    text = (
        "Traceback (most recent call last):\n"
        '  File "/env/lib/python3.10/site-packages/vllm/model_executor/model_loader/weight_utils.py", line 400, in '
        "default_weight_loader\n"
        "    assert param.size() == loaded_weight.size()\n"
        "AssertionError: Attempted to load weight (torch.Size([0])) into parameter (torch.Size([4096]))\n"
    )
    top = _top(tmp_path, text)
    assert top.id == "z3-empty-partition-outside-engine", top
    assert "vLLM" in top.fixes[0].text and "GatheredParameters" in top.fixes[0].text, top.fixes[0]


def test_a_lora_merge_under_zero3_keeps_the_merge_fix_first(tmp_path):
    # (negative: the entry's other signatures keep its own order)
    text = (
        '  File "/usr/lib/python3.10/site-packages/peft/tuners/lora/layer.py", line 305, in merge\n'
        "    base_layer.weight.data += self.get_delta_weight(active_adapter)\n"
        "RuntimeError: The size of tensor a (0) must match the size of tensor b (4096) at non-singleton dimension 1\n"
    )
    top = _top(tmp_path, text)
    assert top.id == "z3-empty-partition-outside-engine", top
    assert top.fixes[0].text.startswith("Merge LoRA adapters"), top.fixes[0]


def test_a_fix_first_for_a_signature_the_entry_lacks_is_refused():
    entry = yaml.safe_load(ENTRY.read_text(encoding="utf-8"))
    entry["fixes"][-1]["first_for"] = ["no-such-signature"]
    with pytest.raises(pydantic.ValidationError, match="no-such-signature"):
        validate.Entry.model_validate(entry)


# ---- 10-11. source text and a fork's note read as failures ---------------------------------------------------------
def test_deepspeed_s_assert_statement_quoted_from_its_source_is_no_failure(tmp_path):
    # deepspeed/__init__.py initialize: the statement, not the AssertionError it raises
    _no_error(
        tmp_path,
        'the check in deepspeed: assert config is not None, "DeepSpeed requires --deepspeed_config to specify '
        'configuration file"\n',
    )


def test_a_fork_s_no_valid_checkpoint_note_gives_no_resume_phase(tmp_path):
    text = (
        "No valid checkpoint found in output directory (./out)\n"
        "Continuing training from scratch\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.06 MiB is free.\n"
    )
    assert _top(tmp_path, text).data["phase"] != "resume"
