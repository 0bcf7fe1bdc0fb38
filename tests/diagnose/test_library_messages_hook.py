"""A frameless exception whose message a library raises itself is placed at that library's statement (issue 10).

The messages come from the installed sources (library_messages' index); the logs are pasted as users paste them:
behind `[rankN]:`, the frames cut, one line, beside a progress bar. A frameless AssertionError a library raises is
`class:library-assertion` with the file:line and function; a frameless RuntimeError / ValueError keeps its class and
gains `data.raised_at`; a user's own generic assertion stays a crash.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import pytest

from zerodoctor.diagnose import library_messages as lm

RECORDED = json.loads(lm.DATA_FILE.read_text(encoding="utf-8"))["installed"]


def _need(pkg: str) -> None:
    try:
        have: str | None = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        have = None
    if have != RECORDED.get(pkg):
        pytest.skip(f"{pkg} {have} is installed, the index was built from {RECORDED.get(pkg)}")


def _top(tmp_path: Path, run_cli: Any, text: str) -> dict[str, Any]:
    log = tmp_path / "run.log"
    log.write_text(text, encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--format", "json")
    assert code in (0, 1), err
    finding: dict[str, Any] = json.loads(out)["findings"][0]
    return finding


def _data(top: dict[str, Any]) -> dict[str, Any]:
    """The failure class's values (`data.failure_class` of the finding)."""
    got: dict[str, Any] = top["data"].get("failure_class", {})
    return got


REDUCED = (
    "The parameter 412 has already been reduced.             Gradient computed twice for this partition.   "
    "          Multiple gradient reductions are currently not supported"
)
INFLIGHT = (
    "expected param {'id': 189, 'status': 'AVAILABLE', 'numel': 0, 'ds_numel': 4096, 'shape': (0,), 'ds_shape': "
    "(4096,), 'requires_grad': True, 'grad_shape': None, 'persist': True, 'active_sub_modules': set()} to be inflight"
)

ASSERTIONS = {
    # (log, package, file, function)
    "stage2-reduced-rank-prefix": (
        f"{{'loss': 1.93, 'epoch': 0.1}}\n[rank3]: AssertionError: {REDUCED}\n",
        "deepspeed",
        "deepspeed/runtime/zero/stage_1_and_2.py",
        "reduce_independent_p_g_buckets_and_remove_grads",
    ),
    "zero3-inflight-cut-traceback": (
        f"[rank1]: Traceback (most recent call last):\n[rank1]: AssertionError: {INFLIGHT}\n",
        "deepspeed",
        "deepspeed/runtime/zero/partition_parameters.py",
        "wait",
    ),
    "accelerate-one-line": (
        "AssertionError: You can't use same `Accelerator()` instance with multiple models when using DeepSpeed\n",
        "accelerate",
        "accelerate/accelerator.py",
        "prepare",
    ),
    "stage3-hybrid-optimizer": (
        "Time to load cpu_adam op: 2.4 seconds\n[rank0]: AssertionError: Hybrid Optimizer Only Supports "
        "DeepSpeedCPUAdam\n",
        "deepspeed",
        "deepspeed/runtime/zero/stage3.py",
        "__init__",
    ),
}


@pytest.mark.parametrize("name", sorted(ASSERTIONS))
def test_a_frameless_library_assertion_names_the_statement_that_raises_it(
    tmp_path: Path, run_cli: Any, name: str
) -> None:
    log, pkg, file, func = ASSERTIONS[name]
    _need(pkg)
    top = _top(tmp_path, run_cli, log)
    assert top["id"] == "class:library-assertion", top["title"]
    at = _data(top)["raised_at"]
    assert (at["package"], at["file"], at["function"]) == (pkg, file, func)
    # (the releases read that raise it, and the one its line is from: the installed, newest one)
    assert at["versions"].startswith(f"{pkg} ") and at["versions"].endswith(RECORDED[pkg])
    assert (
        f"the message is raised at {file}:{at['line']} (in {func}) in {at['versions']} (read at {RECORDED[pkg]})"
        in top["message"]
    )
    assert _data(top)["library"] == pkg


def test_a_log_printing_another_version_says_the_line_may_have_moved(tmp_path: Path, run_cli: Any) -> None:
    _need("deepspeed")
    log = (
        "[2024-05-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.14.4, "
        "git-hash=unknown, git-branch=unknown\n"
        "[rank3]: AssertionError: Hybrid Optimizer Only Supports DeepSpeedCPUAdam\n"
    )
    top = _top(tmp_path, run_cli, log)
    assert top["id"] == "class:library-assertion"
    assert "the log's deepspeed is 0.14.4, so the line may have moved" in top["message"]
    assert "at version 0.14.4" in top["message"]


def test_a_frameless_runtime_error_keeps_its_class_and_gains_where_it_is_raised(
    tmp_path: Path, run_cli: Any
) -> None:
    _need("peft")
    top = _top(
        tmp_path,
        run_cli,
        "[rank1]: RuntimeError: Impossible to merge LoRA with `lora_bias=True` because the base layer has no bias.\n",
    )
    assert top["id"] == "class:crash"
    assert _data(top)["raised_at"]["file"] == "peft/tuners/lora/layer.py"
    assert _data(top)["raised_at"]["function"] == "merge"
    assert "RuntimeError in peft" in top["title"]


@pytest.mark.parametrize(
    "text",
    [
        "AssertionError: shapes do not match\n",
        "[rank0]: AssertionError: loss should be finite here, check the batch\n",
        "RuntimeError: The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1\n",
    ],
)
def test_a_generic_message_is_placed_nowhere(tmp_path: Path, run_cli: Any, text: str) -> None:
    top = _top(tmp_path, run_cli, text)
    assert "raised_at" not in _data(top)
    assert top["id"] != "class:library-assertion"


def test_an_assertion_with_its_frames_keeps_the_frame(tmp_path: Path, run_cli: Any) -> None:
    _need("deepspeed")
    log = (
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", line 1000, in '
        "reduce_independent_p_g_buckets_and_remove_grads\n"
        "    assert self.params_already_reduced[param_id] == False, \\\n"
        f"AssertionError: {REDUCED}\n"
    )
    top = _top(tmp_path, run_cli, log)
    assert top["id"] == "class:library-assertion"
    assert "raised_at" not in _data(top)
    assert _data(top)["library_frame"].startswith("deepspeed/runtime/zero/stage_1_and_2.py:1000")
