"""Which library raises a pasted message, from the libraries' own source (zerodoctor.diagnose.library_messages).

The positives are real messages of the installed DeepSpeed, transformers, accelerate and PEFT, as users paste them:
behind torchrun's `[rankN]:`, after `AssertionError: `, on one line with the frames cut, wrapped by a terminal. Each
message is rebuilt from the statement in the installed source (its f-string fields filled with values a run prints),
and the expected file:line is the statement's own line there. The negatives: prose, a user's own assertion with a
generic message, a message two libraries raise alike, Python's own wording.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerodoctor.diagnose import library_messages as lm
from zerodoctor.diagnose.library_messages import owner_of

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads(lm.DATA_FILE.read_text(encoding="utf-8"))
MESSAGES = [lm.decode_row(r) for r in DATA["messages"]]
RECORDED = DATA["installed"]


def _installed(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _need(pkg: str) -> None:
    have = _installed(pkg)
    if have != RECORDED.get(pkg):
        pytest.skip(f"{pkg} {have} is installed, the index was built from {RECORDED.get(pkg)}")


def _site(path: str, needle: str) -> tuple[int, str]:
    """(line, function) of the assert/raise statement in the installed `path` whose source line holds `needle`."""
    pkg, rest = path.split("/", 1)
    found = lm._package_dir(pkg)
    assert found is not None
    src = (found[0] / rest).read_text(encoding="utf-8")
    at = [i for i, text in enumerate(src.splitlines(), 1) if needle in text]
    assert at, f"{needle!r} is no longer in {path}"
    hits: list[tuple[int, str]] = []

    def walk(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, (ast.Assert, ast.Raise)) and child.lineno <= at[0] <= (
                child.end_lineno or 0
            ):
                hits.append((child.lineno, func))
            walk(child, name)

    walk(ast.parse(src), "<module>")
    assert hits, f"{needle!r} is no longer raised in {path}"
    return hits[-1]


# (package file, a piece of the statement's source that finds it, the exception type, the text as pasted)
POSITIVES = [
    (
        "deepspeed/runtime/zero/stage_1_and_2.py",
        "Multiple gradient reductions are currently not supported",
        "AssertionError",
        "[rank3]: AssertionError: The parameter 412 has already been reduced.             Gradient computed twice for "
        "this partition.             Multiple gradient reductions are currently not supported",
    ),
    (
        "deepspeed/runtime/zero/stage_1_and_2.py",
        "Multiple gradient reduction is currently not supported",
        "AssertionError",
        "AssertionError: The parameter 7 has already been reduced. Gradient computed twice for this partition. "
        "Multiple gradient reduction is currently not supported",
    ),
    (
        "deepspeed/runtime/zero/partition_parameters.py",
        "to be inflight",
        "AssertionError",
        "[rank1]: AssertionError: expected param {'id': 189, 'status': 'AVAILABLE', 'numel': 0, 'ds_numel': 4096, "
        "'shape': (0,), 'ds_shape': (4096,), 'requires_grad': True, 'grad_shape': None, 'persist': True, "
        "'active_sub_modules': set(), 'ds_tensor.shape': torch.Size([512])} to be inflight",
    ),
    (
        "deepspeed/runtime/zero/partition_parameters.py",
        "Cannot partition a param in flight",
        "AssertionError",
        "AssertionError:  Parameter containing:\ntensor([], device='cuda:0', dtype=torch.bfloat16, requires_grad=True)"
        " Cannot partition a param in flight",
    ),
    (
        "deepspeed/runtime/zero/partition_parameters.py",
        "Parameters cannot be scattered without initializing deepspeed.comm",
        "AssertionError",
        "[rank0]: AssertionError: Parameters cannot be scattered without initializing deepspeed.comm",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "Hybrid Optimizer Only Supports DeepSpeedCPUAdam",
        "AssertionError",
        "AssertionError: Hybrid Optimizer Only Supports DeepSpeedCPUAdam",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "gradient_predivide_factor != 1.0 is not yet supported with ZeRO-3",
        "AssertionError",
        "[rank5]: AssertionError: gradient_predivide_factor != 1.0 is not yet supported with ZeRO-3 with reduce "
        "scatter enabled",
    ),
    (
        "deepspeed/runtime/engine.py",
        "attempting to reduce an unsupported grad type",
        "AssertionError",
        "AssertionError: attempting to reduce an unsupported grad type: torch.cuda.sparse.FloatTensor",
    ),
    (
        "deepspeed/runtime/config.py",
        "Check batch related parameters",
        "AssertionError",
        "[rank0]: AssertionError: Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 64 != 4 * 8 * 1",
    ),
    (
        "transformers/trainer.py",
        "cannot be used as is for training",
        "ValueError",
        "ValueError: The model you have picked (LlamaModel) cannot be used as is for training: it only computes "
        "hidden states and does not accept any labels. You should choose a model with a head suitable for your "
        "task like any of the `AutoModelForXxx` listed at https://huggingface.co/docs/transformers/model_doc/auto",
    ),
    (
        "accelerate/accelerator.py",
        "instance with multiple models when using DeepSpeed",
        "AssertionError",
        "[rank1]: AssertionError: You can't use same `Accelerator()` instance with multiple models when using "
        "DeepSpeed",
    ),
    (
        "peft/tuners/lora/layer.py",
        "Impossible to merge LoRA with `lora_bias=True`",
        "RuntimeError",
        "RuntimeError: Impossible to merge LoRA with `lora_bias=True` because the base layer has no bias.",
    ),
]


@pytest.mark.parametrize(("path", "needle", "exc", "pasted"), POSITIVES, ids=[p[1][:40] for p in POSITIVES])
def test_a_pasted_library_message_names_its_file_line_and_function(
    path: str, needle: str, exc: str, pasted: str
) -> None:
    _need(path.split("/", 1)[0])
    line, func = _site(path, needle)
    message = pasted.split(f"{exc}: ", 1)[1]
    for form in (message, pasted, pasted.replace("\n", " "), message.upper()):
        got = owner_of(exc, form)
        assert got is not None, form
        assert (got.package, got.file, got.line, got.function) == (path.split("/", 1)[0], path, line, func)
        assert got.version == RECORDED[got.package]
    # (the type may be left out; a type the statement does not raise is no match)
    assert owner_of(None, message) == owner_of(exc, message)
    assert owner_of("TypeError", message) is None


def test_a_message_wrapped_by_the_terminal_still_matches() -> None:
    _need("deepspeed")
    text = (
        "The parameter 412 has already been reduced. Gradient computed twice for this partition. Multiple gradient "
        "reductions are currently not supported"
    )
    wrapped = "\n".join(text[i : i + 80] for i in range(0, len(text), 80))  # cut inside words
    got = owner_of("AssertionError", wrapped)
    assert got is not None and got.file == "deepspeed/runtime/zero/stage_1_and_2.py"


def test_the_longest_static_match_wins_over_a_shorter_message_it_contains() -> None:
    _need("transformers")
    short = owner_of(
        "ValueError", "`Trainer` requires either a `model` or `model_init` argument, but not both."
    )
    assert short is not None and short.function == "__init__"
    # the RuntimeError sharing the first half is a different statement
    other = owner_of("RuntimeError", "`Trainer` requires either a `model` or `model_init` argument")
    assert other is not None and other.line != short.line
    assert (
        owner_of(None, "`Trainer` requires either a `model` or `model_init` argument, but not both.") == short
    )


NEGATIVES = [
    ("AssertionError", "shapes do not match"),  # a user's own assert with a generic message
    ("AssertionError", "x must be positive"),
    ("AssertionError", ""),
    ("ValueError", "This is not supported"),
    (
        "RuntimeError",
        "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1",
    ),
    # prose that shares words with a DeepSpeed message, without its whole static text
    ("AssertionError", "I think the parameter has already been reduced somewhere in my loop, any idea?"),
    (None, "Multiple gradient reductions are currently not supported by my script"),
    # Python's own wording, which libraries copy
    ("AttributeError", "module 'deepspeed' has no attribute 'zero'"),
    ("AttributeError", "'LlamaForCausalLM' object has no attribute 'module'"),
    # torch's Module.load_state_dict, which transformers' loading report raises in the same words
    ("RuntimeError", "Error(s) in loading state_dict for BoringModel:\n\tsize mismatch for layer.weight"),
]


@pytest.mark.parametrize(("exc", "text"), NEGATIVES)
def test_prose_and_generic_messages_name_no_owner(exc: str | None, text: str) -> None:
    assert owner_of(exc, text) is None


def test_a_message_two_libraries_raise_alike_names_no_owner() -> None:
    _need("peft")
    _need("transformers")
    # peft/config.py and transformers/configuration_utils.py raise the same AssertionError
    assert _site("peft/config.py", "should be a directory, not a file")
    assert _site("transformers/configuration_utils.py", "should be a directory, not a file")
    assert (
        owner_of(
            "AssertionError", "Provided path (./out/adapter_config.json) should be a directory, not a file"
        )
        is None
    )


def test_lookups_are_fast_and_read_few_patterns() -> None:
    import time

    messages = [p[3] for p in POSITIVES] + [n[1] for n in NEGATIVES]
    owner_of("AssertionError", "warm up")
    t = time.perf_counter()
    for _ in range(50):
        for m in messages:
            owner_of("AssertionError", m)
    per = (time.perf_counter() - t) / (50 * len(messages))
    assert per < 1e-3, f"{per * 1e6:.0f} us per lookup"
    index = lm._index()
    assert max(len(rows) for rows in index.by_word.values()) < 200


_PROBE = (
    "import sys\n"
    "from zerodoctor.diagnose.library_messages import owner_of\n"
    "for line in sys.stdin.read().split('\\x1e'):\n"
    "    print(owner_of(None, line))\n"
)


def test_the_same_answers_under_any_hash_seed() -> None:
    text = "\x1e".join([p[3] for p in POSITIVES] + [n[1] for n in NEGATIVES])
    outs = []
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        p = subprocess.run(
            [sys.executable, "-c", _PROBE], input=text, capture_output=True, text=True, env=env, timeout=120
        )
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1] == outs[2]
    assert outs[0].count("MessageOwner(") == len(POSITIVES) or any(
        _installed(pkg) != RECORDED.get(pkg) for pkg in lm.PACKAGES if RECORDED.get(pkg)
    )


def test_the_data_file_is_read_only_when_a_lookup_needs_it() -> None:
    probe = (
        "import zerodoctor.diagnose.library_messages as lm\n"
        "print(len(lm._LOADED))\n"
        "lm.owner_of('AssertionError', 'Hybrid Optimizer Only Supports DeepSpeedCPUAdam')\n"
        "print(len(lm._LOADED))\n"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["0", "1"], p.stderr


def test_the_committed_index_holds_what_the_generator_reads_from_the_installed_accelerate() -> None:
    """The committed file is the generator's output, checked on one source (the full build reads ~60 archives and
    takes minutes): the installed accelerate is read again, its record (the tree's sha256, the kept statements'
    sha256, the drop counts) must be the committed one, and its messages the committed rows that carry its
    release, each at the file, line and function it reads there."""
    _need("accelerate")
    version = RECORDED["accelerate"]
    found = lm._package_dir("accelerate")
    assert found is not None
    sites, tree_sha = lm._parse_sites("accelerate", lm._installed_files(found[0]), {})
    (record,) = [r for r in DATA["sources"] if r["name"] == "accelerate" and r["archive"] is None]
    assert {**lm._part("accelerate", version, sites), "archive": None, "sha256": tree_sha} == {
        k: v for k, v in record.items() if k != "messages"
    }
    read = DATA["releases"]["accelerate"]
    bit = read.index(version)
    rows = {
        (r[1], tuple(p.lower() for p in r[2])): r
        for r in MESSAGES
        if r[3] == "accelerate" and r[8] >> bit & 1
    }
    assert len(rows) == record["messages"] > 300
    generated: dict[tuple[str, tuple[str, ...]], list[lm._Site]] = {}
    for site, why in sites:
        if site is not None and not why:
            generated.setdefault(lm._site_key(site), []).append(site)
    for key, row in rows.items():
        assert key in generated, row
        if bit == len(read) - 1:  # (the newest release read: the row's place is its own)
            first = min(generated[key], key=lambda s: (s.file, s.line))
            assert row[4:8] == [first.file, first.line, first.function, len(generated[key]) - 1]
    # what the generator read and the index lacks is what it drops: shared with another package or torch, no word
    stats = DATA["stats"]["accelerate"]
    dropped = sum(stats.get(k, 0) for k in ("dropped_shared", "dropped_shared_torch", "dropped_no_word"))
    assert 0 <= len(generated) - len(rows) <= dropped


def test_the_generator_reads_every_message_form_with_its_holes(tmp_path: Path) -> None:
    src = (
        "def f(x, n):\n"
        "    assert x, f'the partition {x} of rank {n} was never gathered by stage three'\n"
        "    raise ValueError('bucket {} overflowed its reduce scatter buffer by {:.1f} elements'.format(x, n))\n"
        "def g(x):\n"
        "    raise RuntimeError('offload device %s cannot hold the swapped optimizer %d state' % (x, 1))\n"
        "def h(x):\n"
        "    assert x, 'not supported'\n"  # too short: dropped
        "    raise AttributeError(f\"'{x}' object has no attribute 'lora_gathered_weight'\")\n"  # Python's words
        "    raise ValueError(x)\n"  # no static message
    )
    v = lm._Visitor("pkg", "pkg/m.py")
    v.visit(ast.parse(src))
    kept = [(s.exc, s.parts, s.line, s.function) for s, why in v.sites if s is not None and not why]
    assert kept == [
        ("AssertionError", ("the partition", "of rank", "was never gathered by stage three"), 2, "f"),
        ("ValueError", ("bucket", "overflowed its reduce scatter buffer by", "elements"), 3, "f"),
        ("RuntimeError", ("offload device", "cannot hold the swapped optimizer", "state"), 5, "g"),
    ]
    assert sorted(why for s, why in v.sites if s is None or why) == [
        "no static message",
        "python type",
        "short",
    ]


def test_the_generator_runs_as_a_module(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    assert lm.main(["--output", str(out)]) == 2  # (no --build: usage, nothing written)
    assert not out.exists()
    assert ROOT.joinpath("src/zerodoctor/diagnose/library_messages.json") == lm.DATA_FILE
