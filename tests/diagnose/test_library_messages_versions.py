"""The library-message index across releases (issue 10): published wheels and sdists read member by member.

The generator is run on small wheels and sdists written here (a message kept across releases, one that moved, one
that was dropped and came back, one two packages raise, a test file and a non-Python file that are not read), and
the committed index is held to its promises: each archive named with its version and sha256, a message raised in
several releases one row with its range, messages of old releases that the installed ones no longer raise named
with their range through `main(["diagnose", log])`.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from zerodoctor.diagnose import library_messages as lm

DATA = json.loads(lm.DATA_FILE.read_text(encoding="utf-8"))
MESSAGES = [lm.decode_row(r) for r in DATA["messages"]]

CORE_1 = (
    "def step(x):\n"
    "    assert x, f'the bucket {x} was reduced twice before the optimizer boundary'\n"
    "    raise ValueError('the offload folder for swapped parameters does not exist')\n"
    "def gone(x):\n"
    "    raise RuntimeError(f'pinned staging buffer {x} overlaps the swapped partition region')\n"
)
CORE_2 = (
    "import os\n"
    "\n"
    "def step(x):\n"
    "    assert x, f'the bucket {x} was reduced twice before the optimizer boundary'\n"
    "def added(x):\n"
    "    raise RuntimeError('the quantized flat buffer cannot hold this partition layout')\n"
)
CORE_3 = CORE_2 + (
    "def back(x):\n    raise RuntimeError(f'pinned staging buffer {x} overlaps the swapped partition region')\n"
)
OTHER = "def f():\n    raise ValueError('the offload folder for swapped parameters does not exist')\n"
IN_TESTS = "def t():\n    raise RuntimeError('a message only the package tests raise for their fixtures')\n"


def _wheel(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _sdist(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    path = folder / f"{dist}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            raw = text.encode()
            info = tarfile.TarInfo(f"{dist}-{version}/{name}")
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("archives")
    _wheel(folder, "fakepkg", "1.0", {"fakepkg/core.py": CORE_1, "fakepkg/tests/test_core.py": IN_TESTS})
    _sdist(
        folder,
        "fakepkg",
        "2.0",
        {"fakepkg/core.py": CORE_2, "fakepkg/README.md": IN_TESTS, "tests/test_core.py": IN_TESTS},
    )
    _wheel(folder, "fakepkg", "10.0", {"fakepkg/core.py": CORE_3})
    _wheel(
        folder, "otherpkg", "0.3", {"otherpkg-0.3.data/purelib/otherpkg/util.py": OTHER}
    )  # (a platform wheel)
    (folder / "notes.txt").write_text("not an archive", encoding="utf-8")
    data = lm.build(["fakepkg", "otherpkg"], folder, shadow={})
    return {"folder": folder, "data": data, "index": lm._Index(json.loads(lm.dumps(data)))}


def test_each_archive_is_recorded_with_its_name_version_and_sha256(built: dict[str, Any]) -> None:
    data, folder = built["data"], built["folder"]
    assert data["releases"] == {"fakepkg": ["1.0", "2.0", "10.0"], "otherpkg": ["0.3"]}  # (versions in order)
    for record in data["sources"]:
        path = folder / record["archive"]
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert path.name.startswith(f"{record['name']}-{record['version']}")
    assert [r["messages"] for r in data["sources"]] == [2, 2, 3, 0]


def test_a_message_raised_in_several_releases_is_one_row_at_the_newest(built: dict[str, Any]) -> None:
    index = built["index"]
    got = index.lookup("AssertionError", "the bucket 17 was reduced twice before the optimizer boundary")
    assert got is not None
    assert (got.file, got.line, got.function) == ("fakepkg/core.py", 4, "step")  # (10.0's line, not 1.0's 2)
    assert (got.version, got.versions) == ("10.0", "fakepkg 1.0-10.0")
    rows = [r for r in built["data"]["messages"] if "was reduced twice" in " ".join(r[2])]
    assert len(rows) == 1


def test_a_message_gone_and_back_names_the_releases_that_raise_it(built: dict[str, Any]) -> None:
    got = built["index"].lookup(None, "pinned staging buffer 3 overlaps the swapped partition region")
    assert got is not None and got.versions == "fakepkg 1.0, 10.0" and got.function == "back"
    added = built["index"].lookup(
        "RuntimeError", "the quantized flat buffer cannot hold this partition layout"
    )
    assert added is not None and added.versions == "fakepkg 2.0-10.0"


def test_a_message_two_packages_raise_in_any_release_names_no_owner(built: dict[str, Any]) -> None:
    # fakepkg 1.0 and otherpkg 0.3 raise it; fakepkg dropped it later: still no owner
    assert (
        built["index"].lookup("ValueError", "the offload folder for swapped parameters does not exist")
        is None
    )
    assert built["data"]["stats"]["fakepkg"]["dropped_shared"] == 1
    assert built["data"]["stats"]["otherpkg"]["dropped_shared"] == 1


def test_tests_and_non_python_members_are_not_read(built: dict[str, Any]) -> None:
    assert built["index"].lookup(None, "a message only the package tests raise for their fixtures") is None
    assert not any("tests/" in r[4] for r in built["data"]["messages"])


def test_the_committed_index_records_every_source() -> None:
    assert DATA["format"] == 3
    for record in DATA["sources"]:
        assert record["name"] in lm.PACKAGES and record["version"] in DATA["releases"][record["name"]]
        assert re.fullmatch(r"[0-9a-f]{64}", record["sha256"]) and re.fullmatch(
            r"[0-9a-f]{64}", record["sites_sha256"]
        )
        if record["archive"] is not None:  # (None: the installed copy, hashed over its files)
            assert lm._archive_name(Path(record["archive"])) == (
                lm._norm(lm._DIST.get(record["name"], record["name"])),
                record["version"],
            )
    for pkg, read in DATA["releases"].items():
        assert read == sorted(read, key=lm._version_key)
        assert len([r for r in DATA["sources"] if r["name"] == pkg]) == len(read)
    # (the data file stays small; its messages are one row each, with at least one release)
    assert lm.DATA_FILE.stat().st_size < 4_500_000
    assert all(row[8] > 0 for row in MESSAGES)


def _release_of(versions: str) -> list[str]:
    """The releases a range names ("deepspeed 0.9.5-0.14.4, 0.16.9" -> its ends and singles)."""
    return re.split(r"[-, ]+", versions.split(" ", 1)[1])


# Messages only older releases raise (the installed, newest one no longer does), from the sources read: the
# file:line and range of the committed row. (pasted log, exception, package, file, function, range, read at)
OLD = {
    # DeepSpeed's ZeRO-3 backward hook on a module left in eval mode (commented out after 0.14)
    "deepspeed-zero3-eval-backward": (
        "[rank0]: AssertionError: backward pass is invalid for module in evaluation mode\n",
        "AssertionError",
        "deepspeed",
        "deepspeed/runtime/zero/parameter_offload.py",
        "pre_sub_module_backward_function",
        "deepspeed 0.9.5-0.14.4",
    ),
    # TRL's DPOTrainer given a ref_model and a peft_config (0.8-0.19; TRL 1.x no longer raises it)
    "trl-dpo-ref-and-peft": (
        "ValueError: You passed both a ref_model and a peft_config. For training PEFT adapters with DPO there is no "
        "need to pass a reference model. Please pass `ref_model=None` in case you want to train PEFT adapters, or "
        "pass a ref_model with `force_use_ref_model=True` in DPOTrainer's init. if you want to use a different "
        "ref_model.\n",
        "ValueError",
        "trl",
        "trl/trainer/dpo_trainer.py",
        "_prepare_peft_model",
        "trl 0.8.6-0.19.1",
    ),
    # LLaMA-Factory's argument parser refusing GaLore under DeepSpeed (0.8-0.9.1)
    "llamafactory-galore-deepspeed": (
        "[rank1]: ValueError: GaLore is incompatible with DeepSpeed yet.\n",
        "ValueError",
        "llamafactory",
        "llamafactory/hparams/parser.py",
        "get_train_args",
        "llamafactory 0.8.3-0.9.1",
    ),
}


@pytest.mark.parametrize("name", sorted(OLD))
def test_a_message_only_old_releases_raise_is_named_with_its_range(name: str) -> None:
    log, exc, pkg, file, func, versions = OLD[name]
    message = log.split(f"{exc}: ", 1)[1].strip()
    got = lm.owner_of(exc, message)
    assert got is not None
    assert (got.package, got.file, got.function, got.versions) == (pkg, file, func, versions)
    assert got.version == _release_of(versions)[-1]
    # (the newest release read does not raise it: an index of that release alone would name nobody)
    assert DATA["releases"][pkg][-1] not in _release_of(versions)
    (row,) = [r for r in MESSAGES if r[3] == pkg and r[4] == file and r[5] == got.line]
    assert row[6] == func


@pytest.mark.parametrize("name", sorted(OLD))
def test_diagnose_names_the_old_release_range_that_raises_a_frameless_message(
    tmp_path: Path, run_cli: Any, name: str
) -> None:
    log, exc, pkg, file, func, versions = OLD[name]
    path = tmp_path / "run.log"
    path.write_text(log, encoding="utf-8")
    code, out, err = run_cli("diagnose", str(path), "--format", "json")
    assert code in (0, 1), err
    top = json.loads(out)["findings"][0]
    at = top["data"]["failure_class"]["raised_at"]
    read_at = _release_of(versions)[-1]
    assert (at["package"], at["file"], at["function"], at["versions"], at["version"]) == (
        pkg,
        file,
        func,
        versions,
        read_at,
    )
    if exc == "AssertionError":
        assert top["id"] == "class:library-assertion"
        assert (
            f"raised at {file}:{at['line']} (in {func}) in {versions} (read at {read_at})" in top["message"]
        )


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        # prose sharing the words of an old release's message, without its whole static text
        ("AssertionError", "is the backward pass invalid for a module in evaluation mode? my loss is fine"),
        (None, "GaLore is incompatible with my DeepSpeed config, which optimizer should I use"),
        ("ValueError", "You passed both a ref_model and a peft_config to my own trainer"),
    ],
)
def test_prose_sharing_an_old_message_s_words_is_named_by_nobody(exc: str | None, text: str) -> None:
    assert lm.owner_of(exc, text) is None


def test_a_prose_line_in_a_log_gains_no_raised_at(tmp_path: Path, run_cli: Any) -> None:
    path = tmp_path / "run.log"
    path.write_text(
        "note: is the backward pass invalid for a module in evaluation mode? asking before I file a bug\n"
        "AssertionError: shapes do not match\n",
        encoding="utf-8",
    )
    code, out, err = run_cli("diagnose", str(path), "--format", "json")
    assert code in (0, 1), err
    for finding in json.loads(out)["findings"]:
        assert "raised_at" not in finding["data"].get("failure_class", {})


def test_a_message_cut_short_matches_when_it_holds_most_of_the_static_text() -> None:
    # diagnose's events keep 300 characters of a line; a log viewer or a paste may cut earlier
    message = OLD["trl-dpo-ref-and-peft"][0].split("ValueError: ", 1)[1].strip()
    for cut in (len(message) - 20, 250):
        got = lm.owner_of("ValueError", message[:cut])
        assert got is not None and got.file == "trl/trainer/dpo_trainer.py", cut
    # (too little of it held, or the text goes on with other words: no owner)
    assert lm.owner_of("ValueError", message[:70]) is None
    assert lm.owner_of("ValueError", message[:200] + " in my own wrapper, see my script") is None
