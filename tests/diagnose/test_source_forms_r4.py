"""Round 4 of the failure forms read from the tools' sources (issue 10): terminal rows padded with blanks and cut
inside a word (one physical line of rows, or one row per line), TRL refusing a GRPO config in its trainer's
constructor, assertions raised inside Megatron-LM / vLLM / TRL / PEFT / accelerate, and a line pasted inside
Markdown emphasis. Each test writes the lines as the source prints them (named beside it) and checks what diagnose
makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_source_forms_r3 import _run  # (pytest puts this directory on sys.path)

from zerodoctor.diagnose.reader import parse_line, unpad_rows


def _rows_on_one_line(line: str, inner: int, outer: int) -> str:
    """`line` as a terminal shows it wrapped at `inner` columns, each row copied as a field of `outer` columns
    (padded with blanks), the rows one after another on one physical line (the last one unpadded)."""
    rows = [line[i : i + inner] for i in range(0, len(line), inner)]
    return "".join(r.ljust(outer) for r in rows[:-1]) + rows[-1]


# TRL v0.15.0-v0.17.0 trl/trainer/grpo_trainer.py GRPOTrainer.__init__ (line 346 at v0.15.0):
#   f"The global train batch size ({num_processes} x {args.per_device_train_batch_size}) must be evenly "
#   f"divisible by the number of generations per prompt ({self.num_generations}). Given the current train "
#   f"batch size, the valid values for the number of generations are: {possible_values}."
GRPO_TB = [
    "Traceback (most recent call last):",
    '  File "/home/user/project/deepseek_r1_train.py", line 141, in <module>',
    "    trainer = GRPOTrainer(",
    '  File "/home/user/.conda/envs/rl/lib/python3.9/site-packages/trl/trainer/grpo_trainer.py", line 346, in '
    "__init__",
    "    raise ValueError(",
    "ValueError: The global train batch size (1 x 1) must be evenly divisible by the number of generations per "
    "prompt (16). Given the current train batch size, the valid values for the number of generations are: [].",
]


@pytest.mark.parametrize(("inner", "outer"), [(73, 165), (80, 120), (100, 200), (60, 132)])
def test_rows_padded_on_one_line_are_joined_and_trl_refuses_the_config(
    tmp_path: Path, inner: int, outer: int
) -> None:
    # llm_related#11: every long line of the traceback is its rows, each padded to the window's width, on one line
    text = "\n".join(_rows_on_one_line(line, inner, outer) for line in GRPO_TB) + "\n"
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:config-rejected", top
    assert str(fc["judged_by"]).startswith("trl/trainer/grpo_trainer.py:346 in __init__")
    assert "evenly divisible by the number of generations per prompt (16)" in str(fc["message"])


def test_unpad_rows_restores_the_text_cut_inside_words_and_at_blanks() -> None:
    line = GRPO_TB[-1]
    assert unpad_rows(_rows_on_one_line(line, 73, 165)) == line
    # a path cut inside a word on a single padded row: joined with no blank
    frame = GRPO_TB[3]
    assert unpad_rows(_rows_on_one_line(frame, 73, 165)) == frame
    # the same through the line model, behind torchrun's rank prefix (the prefix is part of the first row)
    (parsed,) = parse_line("x.log", 1, _rows_on_one_line("[rank0]: " + line, 73, 165).encode())
    assert parsed.text == line and parsed.rank == 0
    (parsed,) = parse_line("x.log", 1, _rows_on_one_line("[rank0]: " + frame, 73, 165).encode())
    assert parsed.text == frame and parsed.rank == 0


@pytest.mark.parametrize(
    "text",
    [
        # aligned columns (a table, a config dump): the runs do not end on one row grid
        "train_batch_size             8                    gradient_accumulation_steps          4"
        + " " * 30
        + "x",
        # DeepSpeed's see_memory_usage line (runtime/utils.py: nine blanks between its fields)
        "[INFO] [utils.py:802:see_memory_usage] MA 12.55 GB         Max_MA 12.55 GB         CA 12.57 GB         "
        "Max_CA 13 GB",
        # a short cell before a long run: no row of text
        "loss" + " " * 116 + "0.52",
        # only trailing blanks
        "step 10 loss 0.5" + " " * 100,
        # tqdm's empty bar (tqdm/std.py format_meter: the bar's blanks between its `|` borders)
        "Loading checkpoint shards:   0%|" + " " * 150 + "| 0/7 [00:00<?, ?it/s]",
        # rich's traceback box (rich/traceback.py): the frame padded up to the box's right border
        "│ /home/user/diffusers/examples/dreambooth/train_dreambooth.py:828 in <module>" + " " * 40 + "│",
        # bash's job status (jobs.c: the status column padded) and the OOM killer's task table (mm/oom_kill.c)
        'StdErr: "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed'
        + " " * 18
        + "python3 main.py",
        "[Thu Mar 20 21:01:25 2025] [   2665]     0  2665    55756      339    77824       68"
        + " " * 13
        + "0 crond",
    ],
)
def test_aligned_text_is_not_read_as_padded_rows(text: str) -> None:
    assert unpad_rows(text) == text


def test_one_row_per_line_padded_to_the_width_is_joined(tmp_path: Path) -> None:
    # the other copy of a terminal: each row of W columns on its own line, padded to W with blanks; a row cut inside
    # a word continues on the next line
    width = 120
    rows = []
    for line in GRPO_TB:
        rows += [line[i : i + width].ljust(width) for i in range(0, len(line), width)]
    top, fc, _ = _run(tmp_path, "\n".join(rows) + "\n")
    assert fc["id"] == "class:config-rejected", top
    assert str(fc["judged_by"]).startswith("trl/trainer/grpo_trainer.py")


def test_a_trl_trainer_constructor_refusal_is_config_rejected(tmp_path: Path) -> None:
    # trl/trainer/grpo_trainer.py GRPOTrainer.__init__ at v0.16.0 (line 361)
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/train_grpo.py", line 80, in <module>\n'
        "    trainer = GRPOTrainer(\n"
        '  File "/env/lib/python3.11/site-packages/trl/trainer/grpo_trainer.py", line 361, in __init__\n'
        '    raise ValueError("The number of reward processing classes must match the number of reward functions.")\n'
        "ValueError: The number of reward processing classes must match the number of reward functions.\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:config-rejected", top
    assert str(fc["judged_by"]) == "trl/trainer/grpo_trainer.py:361 in __init__"


def test_a_runtime_error_in_a_trl_trainer_step_is_no_config(tmp_path: Path) -> None:
    # outside the constructor a TRL trainer's ValueError is no config check (e.g. _prepare_inputs at step time)
    text = (
        "Traceback (most recent call last):\n"
        '  File "/env/lib/python3.11/site-packages/trl/trainer/grpo_trainer.py", line 902, in compute_loss\n'
        '    raise ValueError("The GRPOTrainer does not support returning outputs")\n'
        "ValueError: The GRPOTrainer does not support returning outputs\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] != "class:config-rejected", top


# ---- assertions raised inside other training libraries ---------------------------------------------------------

# Megatron-LM megatron/data/gpt_dataset.py _build_index_mappings (Megatron-LM#176; Megatron-DeepSpeed the same file,
# `<=` since):  assert last_epoch_num_samples < (num_samples_per_epoch + 1), \
#                   'last epoch number of samples exceeded max value.'
MEGATRON_TB = (
    "Traceback (most recent call last):\n"
    '  File "pretrain_gpt.py", line 109, in train_valid_test_datasets_provider\n'
    "    train_ds, valid_ds, test_ds = build_train_valid_test_datasets(\n"
    '  File "/workspace/Megatron-LM/megatron/data/gpt_dataset.py", line 152, in __init__\n'
    "    self.doc_idx, self.sample_idx, self.shuffle_idx = _build_index_mappings(\n"
    '  File "/workspace/Megatron-LM/megatron/data/gpt_dataset.py", line 242, in _build_index_mappings\n'
    "    assert last_epoch_num_samples < (num_samples_per_epoch + 1), \\\n"
)
MEGATRON_EXC = "AssertionError: last epoch number of samples exceeded max value."


@pytest.mark.parametrize(
    "last",
    [
        MEGATRON_EXC,
        # a GitHub comment wrapping the pasted line in Markdown emphasis or inline code
        f"*{MEGATRON_EXC}*",
        f"_{MEGATRON_EXC}_",
        f"**{MEGATRON_EXC}**",
        f"***{MEGATRON_EXC}***",
        f"__{MEGATRON_EXC}__",
        f"`{MEGATRON_EXC}`",
        f"[rank3]: **{MEGATRON_EXC}**",
    ],
    ids=[
        "plain",
        "em-star",
        "em-underscore",
        "strong",
        "strong-em",
        "strong-underscore",
        "code",
        "rank-strong",
    ],
)
def test_a_megatron_dataset_assertion_is_a_library_assertion(tmp_path: Path, last: str) -> None:
    top, fc, _ = _run(tmp_path, MEGATRON_TB + last + "\n")
    assert fc["id"] == "class:library-assertion", top
    assert fc["library_frame"] == "megatron/data/gpt_dataset.py:242 in _build_index_mappings"
    assert str(fc["message"]) == "last epoch number of samples exceeded max value."


@pytest.mark.parametrize(
    ("frame", "exc", "lib"),
    [
        # vllm/worker/model_runner.py (v0.4-v0.6 _prepare_model_input_tensors): assert len(...) == ...
        (
            '  File "/env/lib/python3.10/site-packages/vllm/worker/model_runner.py", line 1212, in profile_run',
            "AssertionError",
            "vllm",
        ),
        # trl/trainer/grpo_trainer.py _move_model_to_vllm (TRL#2877)
        (
            '  File "/env/lib/python3.10/site-packages/trl/trainer/grpo_trainer.py", line 630, in '
            "_move_model_to_vllm",
            "AssertionError: the model weights must be gathered",
            "trl",
        ),
        # peft/tuners/lora/layer.py update_layer
        (
            '  File "/env/lib/python3.10/site-packages/peft/tuners/lora/layer.py", line 120, in update_layer',
            "AssertionError",
            "peft",
        ),
        # peft/tuners/adalora/layer.py RankAllocator.__init__: assert self.beta1 > 0 and self.beta1 < 1
        (
            '  File "/env/lib/python3.10/site-packages/peft/tuners/adalora/layer.py", line 365, in __init__',
            "AssertionError",
            "peft",
        ),
    ],
    ids=["vllm", "trl", "peft", "peft-adalora"],
)
def test_assertions_in_training_libraries_are_library_assertions(
    tmp_path: Path, frame: str, exc: str, lib: str
) -> None:
    text = "Traceback (most recent call last):\n" + frame + "\n    assert x\n" + f"*{exc}*\n"
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:library-assertion", top
    assert str(fc["library_frame"]).startswith(lib + "/")


@pytest.mark.parametrize(
    "line",
    [
        "*** Error in `python': double free or corruption (!prev): 0x000055d5c ***",
        "**kwargs are passed to the model**",
        "__init__.py",
        "________________________________",
    ],
)
def test_emphasis_like_lines_that_are_not_emphasis_are_kept(line: str) -> None:
    (parsed,) = parse_line("x.log", 1, line.encode())
    if line.startswith("**kwargs"):
        assert (
            parsed.text == "kwargs are passed to the model"
        )  # (whole-line emphasis: Markdown renders it so)
    else:
        assert parsed.text == line


@pytest.mark.parametrize(
    ("line", "where"),
    [
        (
            "*AssertionError: megatron/data/gpt_dataset.py:242 last epoch number of samples exceeded max value.*",
            "megatron/data/gpt_dataset.py:242",
        ),
        ("AssertionError: assert failed in vllm/worker/model_runner.py", "vllm/worker/model_runner.py"),
    ],
)
def test_a_frameless_assertion_naming_a_library_file_is_a_library_assertion(
    tmp_path: Path, line: str, where: str
) -> None:
    top, fc, _ = _run(tmp_path, line + "\n")
    assert fc["id"] == "class:library-assertion", top
    assert fc["library_frame"] == where


def test_a_frameless_assertion_naming_no_library_stays_a_crash(tmp_path: Path) -> None:
    # (the script's own assertion: nothing says a library raised it)
    top, fc, _ = _run(tmp_path, "**AssertionError: dataset contains training images and labels**\n")
    assert fc["id"] == "class:crash", top


def test_a_source_line_with_the_next_frame_glued_behind_it_is_two_lines(tmp_path: Path) -> None:
    # Megatron-LM#176: the newline between a frame's source line and the next frame header was lost in the paste
    glued = MEGATRON_TB.replace(
        "build_train_valid_test_datasets(\n", "build_train_valid_test_datasets(  "
    ).replace("_build_index_mappings(\n", "_build_index_mappings(  ")
    assert glued.count("\n") == MEGATRON_TB.count("\n") - 2
    top, fc, _ = _run(tmp_path, glued + MEGATRON_EXC + "\n")
    assert fc["id"] == "class:library-assertion", top
    assert fc["library_frame"] == "megatron/data/gpt_dataset.py:242 in _build_index_mappings"
    lines = parse_line(
        "x.log",
        1,
        b"    x = build_dataset(2, 'test')  File \"/m/gpt_dataset.py\", line 110, in build_dataset",
    )
    assert [ln.text for ln in lines] == [
        "    x = build_dataset(2, 'test')",
        'File "/m/gpt_dataset.py", line 110, in build_dataset',
    ]


def _screen(lines: list[str], width: int) -> str:
    """`lines` as a screen copy of a `width`-column terminal: each logical line cut every `width` characters, every
    row (the last of each line too) padded with blanks to `width`."""
    rows = [ln[i : i + width].ljust(width) for ln in lines for i in range(0, max(len(ln), 1), width)]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("width", [100, 120, 137])
def test_a_padded_screen_copy_joins_full_rows_and_keeps_line_ends(tmp_path: Path, width: int) -> None:
    # every row padded to the width (tmux capture-pane -J off, a console's "copy all"): a row whose text reaches the
    # width goes on, one that ends earlier ended its line - the message after the exception line is no part of it
    lines = [*GRPO_TB, "Please check your config"]
    top, fc, _ = _run(tmp_path, _screen(lines, width))
    assert fc["id"] == "class:config-rejected", top
    assert str(fc["message"]).endswith("the valid values for the number of generations are: [].")


def test_a_screen_row_cut_at_a_blank_keeps_it(tmp_path: Path) -> None:
    # the row's last column was the blank between two words: the padded copy shows the row one short of its width
    msg = GRPO_TB[-1]
    width = msg.index(" ", 90) + 1  # the blank falls on the first row's last column
    top, fc, _ = _run(tmp_path, "\n".join(GRPO_TB[:-1]) + "\n" + _screen([msg], width))
    assert fc["id"] == "class:config-rejected", top
    assert str(fc["message"]) == msg.split(": ", 1)[1]


@pytest.mark.parametrize(
    "line",
    [
        GRPO_TB[-1],
        # grpo_config.py GRPOConfig.__post_init__ (TRL after 0.17): the effective batch, the same refusal
        "ValueError: The effective train batch size (3 x 1 x 4) must be evenly divisible by the number of generations"
        " per prompt (8). Given the current effective train batch size, the valid values for the number of "
        "generations are: [2, 3, 4, 6, 12].",
    ],
)
def test_trls_generation_batch_refusal_pasted_alone_is_config_rejected(tmp_path: Path, line: str) -> None:
    for text in (line, f"**{line}**"):
        top, fc, _ = _run(tmp_path, text + "\n")
        assert fc["id"] == "class:config-rejected", top


# ---- rich's boxed traceback with a frame wrapped inside the box -------------------------------------------------


def _rich_traceback(tmp_path: Path, width: int, func: str) -> str:
    """A real rich traceback (rich/traceback.py, as accelerate and diffusers scripts install it) of an assertion
    raised in a file at a site-packages path under `tmp_path`, rendered at `width` columns."""
    import importlib.util
    import io

    from rich.console import Console
    from rich.traceback import Traceback

    mod = tmp_path / "home/user/.conda/envs/train/lib/python3.10/site-packages/deepspeed/runtime/zero"
    mod.mkdir(parents=True)
    path = mod / "partitioned_param_coordinator.py"
    path.write_text(f"def {func}(p):\n    assert p['status'] == 'AVAILABLE', p\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("ppc_r4", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        getattr(module, func)({"id": 5, "status": "INFLIGHT", "ds_numel": 4096})
    except AssertionError as exc:
        buf = io.StringIO()
        console = Console(file=buf, width=width, color_system=None)
        console.print(Traceback.from_exception(type(exc), exc, exc.__traceback__, width=width))
        return buf.getvalue()
    raise AssertionError("the module did not raise")


@pytest.mark.parametrize("width", [80, 100, 120, 150])
@pytest.mark.parametrize("func", ["fetch_sub_module", "_all_gather_params_and_wait_for_completion_of_fetch"])
def test_a_rich_frame_wrapped_inside_its_box_is_read_whole(tmp_path: Path, width: int, func: str) -> None:
    # rich wraps a frame longer than the box: a path folded at the last column, or the function name moved to the
    # next row at the blank before it
    text = _rich_traceback(tmp_path, width, func)
    # also as torchrun --tee prints it, each row behind the rank's prefix
    for log in (text, "".join(f"[default1]:{row}" for row in text.splitlines(keepends=True))):
        top, fc, _ = _run(tmp_path, log)
        assert fc["id"] == "class:library-assertion", (top, log)
        assert (
            fc["library_frame"] == f"deepspeed/runtime/zero/partitioned_param_coordinator.py:2 in {func}"
        ), log


@pytest.mark.parametrize("last", ["**AssertionError**", "*AssertionError*", "`AssertionError`"])
def test_a_bare_assertion_line_in_emphasis_ends_the_traceback(tmp_path: Path, last: str) -> None:
    # an `assert` without a message prints `AssertionError` alone (traceback.format_exception_only)
    text = (
        "Traceback (most recent call last):\n"
        '  File "/env/lib/python3.10/site-packages/peft/tuners/adalora/layer.py", line 365, in __init__\n'
        "    assert self.beta1 > 0 and self.beta1 < 1\n" + last + "\n"
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:library-assertion", top
    assert fc["library_frame"] == "peft/tuners/adalora/layer.py:365 in __init__"


def test_deepspeeds_plain_exception_in_emphasis_is_read(tmp_path: Path) -> None:
    # DeepSpeed raises a plain Exception (runtime/engine.py _configure_zero_optimizer at 0.19.8)
    msg = (
        "Exception: The deprecated version of ZeRO Stage 1 is not supported in deepspeed >= 0.5.9. Please downgrade "
        "to a version less than 0.5.9 if you need to use this deprecated version of ZeRO."
    )
    plain = _run(tmp_path, msg + "\n")[1]["id"]
    assert plain != "no-known-failure"
    top, fc, _ = _run(tmp_path, f"*{msg}*\n")
    assert fc["id"] == plain, top


@pytest.mark.parametrize(
    ("path", "want"),
    [
        # a conda env named after a library is no frame of it; the package below it is
        ("/home/u/.conda/envs/vllm/lib/python3.11/site-packages/trl/trainer/grpo_trainer.py", "trl/trainer/"),
        (
            "/home/u/.conda/envs/deepspeed/lib/python3.9/site-packages/deepspeed/runtime/engine.py",
            "deepspeed/runtime/",
        ),
        # a source checkout holds the package one level down
        ("/home/u/src/trl/trl/trainer/grpo_trainer.py", "trl/trainer/"),
        ("/workspace/Megatron-DeepSpeed/megatron/training.py", "megatron/training.py"),
        # any installed package (Python puts them under site-packages, dist-packages on Debian): an assertion whose
        # innermost frame is there broke that package's invariant, not the training script's
        (
            "/env/lib/python3.10/site-packages/flash_attn/flash_attn_interface.py",
            "flash_attn/flash_attn_interface.py",
        ),
        ("/usr/local/lib/python3.10/dist-packages/openrlhf/trainer/ppo_trainer.py", "openrlhf/trainer/"),
        ("/env/lib/python3.10/site-packages/six.py", "six.py:490 in f"),
    ],
)
def test_the_library_frame_is_the_package_not_an_env_or_checkout_dir(
    tmp_path: Path, path: str, want: str
) -> None:
    text = (
        f'Traceback (most recent call last):\n  File "{path}", line 490, in f\n    assert x\nAssertionError\n'
    )
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:library-assertion", top
    assert str(fc["library_frame"]).startswith(want)


# DeepSpeed runtime/config.py DeepSpeedConfig._batch_assertion (0.19.8): the assertion users hit most
DS_BATCH_TB = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/deepspeed/runtime/config.py", line 700, in _batch_assertion',
    "    assert train_batch == micro_batch * grad_acc * self.world_size, (",
    "AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
    "gradient_acc_step * world_size 64 != 4 * 8 * 1",
]


@pytest.mark.parametrize("width", [80, 92, 100, 131])
@pytest.mark.parametrize("pad", [False, True])
def test_a_frame_header_cut_anywhere_by_the_terminal_keeps_its_frame(
    tmp_path: Path, width: int, pad: bool
) -> None:
    # a row cut inside `, line N, in F` (`..., line 700, i` + `n _batch_assertion`) or right after a blank of the
    # text (`config.py", ` + `line 700`): the frame and its judging function are read whole
    unwrapped = _run(tmp_path, "\n".join(DS_BATCH_TB) + "\n")[1]
    rows = [ln[i : i + width] for ln in DS_BATCH_TB for i in range(0, len(ln), width)]
    text = "\n".join(r.ljust(width) if pad else r for r in rows) + "\n"
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == unwrapped["id"] == "class:config-rejected", top
    assert fc.get("judged_by") == unwrapped.get("judged_by")


@pytest.mark.parametrize("inner", [61, 68, 72, 75])
def test_a_frame_header_in_padded_rows_on_one_line_is_read_whole(tmp_path: Path, inner: int) -> None:
    # one padded row per frame header, cut inside the path, inside `line` or inside `in`
    text = "\n".join(_rows_on_one_line(line, inner, 160) for line in DS_BATCH_TB) + "\n"
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:config-rejected", top
    assert str(fc["judged_by"]).startswith("deepspeed/runtime/config.py:700 in _batch_assertion")


OOM_TB = [
    "[rank3]: Traceback (most recent call last):",
    '[rank3]:   File "/env/lib/python3.10/site-packages/torch/optim/adamw.py", line 180, in _init_group',
    "[rank3]:     state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)",
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 3 has a total capacity of "
    "79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.11 GiB memory in use.",
]
TRACEBACKS = {
    "ds-batch": DS_BATCH_TB,
    "grpo": GRPO_TB,
    "megatron": MEGATRON_TB.splitlines() + [MEGATRON_EXC],
    "oom": OOM_TB,
}


@pytest.mark.parametrize("name", sorted(TRACEBACKS))
def test_every_wrap_of_a_traceback_names_the_same_class(tmp_path: Path, name: str) -> None:
    # the same traceback cut at many terminal widths, in the three copies seen (rows per line, rows per line padded
    # to the width, padded rows on one line): the class is the unwrapped one's
    lines = TRACEBACKS[name]
    want = _run(tmp_path, "\n".join(lines) + "\n")[1]["id"]
    forms = []
    for w in (80, 86, 93, 100, 117, 120, 144, 200):
        forms.append("\n".join(ln[i : i + w] for ln in lines for i in range(0, len(ln), w)))
        forms.append(_screen(lines, w).rstrip("\n"))
    forms += ["\n".join(_rows_on_one_line(ln, inner, 160) for ln in lines) for inner in (50, 64, 73, 99)]
    got = [_run(tmp_path, text + "\n")[1]["id"] for text in forms]
    assert got == [want] * len(forms)


def test_an_assertion_in_the_users_own_file_stays_a_crash(tmp_path: Path) -> None:
    text = 'Traceback (most recent call last):\n  File "/home/u/train.py", line 77, in f\n    assert x\nAssertionError\n'
    top, fc, _ = _run(tmp_path, text)
    assert fc["id"] == "class:crash", top
