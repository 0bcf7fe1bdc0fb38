"""zerodoctor.safeio: the one input/output layer (issue 11). Real files, FIFOs and devices; nothing mocked."""

from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path

import pytest

from zerodoctor import safeio
from zerodoctor.errors import InputError
from zerodoctor.facts import as_number, truthy
from zerodoctor.setup.json_reader import parse_json
from zerodoctor.setup.python_reader import parse_python_config
from zerodoctor.setup.yaml_reader import parse_yaml

BIG = "9" * 5000


# ---- reads ---------------------------------------------------------------------------------------------


def test_regular_file_and_size_cap(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_bytes(b"{}")
    assert safeio.read_bytes(p) == b"{}"
    p.write_bytes(b" " * 101)
    with pytest.raises(InputError, match=r"a\.json: larger than the .* MiB"):
        safeio.read_bytes(p, limit=100)


def test_fifo_without_writer_reads_as_empty_instead_of_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    start = time.monotonic()
    assert safeio.read_bytes(fifo) == b""
    assert time.monotonic() - start < 1


def test_pipe_with_a_writer_is_streamed(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.write(w, b'{"a": 1}')
    os.close(w)
    assert safeio.read_bytes(f"/proc/self/fd/{r}") == b'{"a": 1}'
    os.close(r)


@pytest.mark.parametrize(
    ("target", "message"),
    [("/dev/zero", "is a device"), ("/dev/null", "is a device"), (".", "is a directory")],
)
def test_special_files_are_refused(tmp_path: Path, target: str, message: str) -> None:
    link = tmp_path / "cfg.json"
    link.symlink_to(target if target != "." else tmp_path)
    with pytest.raises(InputError, match=message):
        safeio.read_bytes(link)


def test_path_too_long_and_link_loop(tmp_path: Path) -> None:
    long = tmp_path / ("d" * 300) / "x.json"
    with pytest.raises(InputError, match="longer than the file system allows") as err:
        safeio.read_bytes(long)
    assert len(str(err.value)) < 300  # the path is shortened in the message
    loop = tmp_path / "loop.json"
    loop.symlink_to("loop.json")
    with pytest.raises(InputError, match="points to itself"):
        safeio.read_bytes(loop)


def test_utf8_error_names_offset_and_line(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_bytes(b'{\n  "a": "caf\xe9"\n}')
    with pytest.raises(InputError, match=r"c\.json:2: not valid UTF-8: byte 0xe9 at offset 13"):
        safeio.read_text(p)
    p.write_bytes(b"\xef\xbb\xbf{}")
    assert safeio.read_text(p) == "{}"


# ---- JSON ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (BIG, "5000-digit integer"),
        ("1e999", "is infinite"),
        ("-Infinity", "is infinite"),
        ("NaN", "is NaN"),
        ("1" + "0" * 40, "41-digit number"),
    ],
)
def test_json_numbers_are_checked_with_key_and_line(value: str, message: str) -> None:
    text = '{\n  "zero_optimization": {\n    "stage": 3,\n    "sub_group_size": ' + value + "\n  }\n}"
    with pytest.raises(InputError, match=rf"ds\.json:4:\d+: zero_optimization\.sub_group_size: .*{message}"):
        parse_json("ds.json", text)


def test_json_keeps_realistic_numbers() -> None:
    data, _, _ = parse_json("m.json", '{"model_max_length": 1000000000000000019884624838656, "eps": 1e-320}')
    assert data["model_max_length"] == int(1e30)


@pytest.mark.parametrize("depth", [66, 500, 100_000])
def test_json_depth_limit(depth: int) -> None:
    with pytest.raises(InputError, match="nested more than 64 levels"):
        parse_json("d.json", "[" * depth + "]" * depth)


# ---- YAML ----------------------------------------------------------------------------------------------


def _bomb(levels: int) -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(levels):
        prev, name = chr(ord("a") + i), chr(ord("b") + i)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_stops_at_the_limit_fast() -> None:
    start = time.process_time()
    with pytest.raises(InputError, match="aliases expand to more than 200,000 values"):
        parse_yaml("b.yaml", _bomb(9))
    assert time.process_time() - start < 0.5
    data, _, _ = parse_yaml("ok.yaml", _bomb(2))  # small aliases are fine
    assert len(data["c"]) == 9


@pytest.mark.parametrize("text", ["a: &x [*x]\n", "a: &x {b: *x}\n"])
def test_yaml_recursive_alias_is_an_error(text: str) -> None:
    with pytest.raises(InputError, match="recursive alias"):
        parse_yaml("r.yaml", text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested more than 64"),
        ("a: 1\x01\n", r"r\.yaml:1:5: invalid YAML: character 0x01"),
        (f"lora_rank: {BIG}\n", r"r\.yaml:1:12: lora_rank: .*5000-digit integer"),
        ("x:\n  y: .nan\n", r"r\.yaml:2:6: x\.y: .nan is NaN"),
        ("a: 0x" + "f" * 400 + "\n", "larger than any count"),
        ("a: *nothing\n", "names no anchor"),
    ],
)
def test_yaml_errors_are_one_line_with_position(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        parse_yaml("r.yaml", text)
    assert "\n" not in str(err.value)


def test_yaml_keeps_merge_keys_positions_and_duplicates() -> None:
    data, positions, duplicates = parse_yaml("a.yaml", "base: &b {k: 1}\nx:\n  <<: *b\n  c: 2\nc: 1\nc: 2\n")
    assert data == {"base": {"k": 1}, "x": {"k": 1, "c": 2}, "c": 2}
    assert positions[("x", "c")].line == 4
    assert duplicates and duplicates[0][0] == ("c",)


# ---- Python (XTuner) -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("10**10**10", "larger than any count"),
        ("'a' * 10**10", "10,000,000,000 items"),
        ("1e999", "is infinite"),
        ("+".join(["1"] * 10_000), "nested too deeply|nested more than 64"),
        ("+".join(["1"] * 300), "nested more than 64"),
        (BIG, "longer than 4300 digits"),
    ],
)
def test_python_config_limits(expr: str, message: str) -> None:
    start = time.process_time()
    with pytest.raises(InputError, match=message) as err:
        parse_python_config("x.py", f"max_epochs = {expr}\n")
    assert time.process_time() - start < 1
    assert "\n" not in str(err.value)


def test_python_config_still_evaluates_what_is_reasonable() -> None:
    env, _, symbols = parse_python_config(
        "x.py", "from a import B\nn = 2**10\nlr = 2e-5 * 8\ncfg = dict(type=B, n=n, fmt='%d' % n)\n"
    )
    assert env["n"] == 1024 and env["cfg"]["n"] == 1024
    assert str(env["cfg"]["fmt"]) == "'%d' % n"  # string formatting is never evaluated
    assert symbols[("cfg", "type")] == "a.B"


def test_python_wide_expression_is_fast() -> None:
    expr = "[" + ", ".join(f"dict(a={i}, b=[{i}, {i + 1}])" for i in range(22_000)) + "]"
    start = time.process_time()
    env, _, _ = parse_python_config("x.py", f"hooks = {expr}\n")
    assert len(env["hooks"]) == 22_000
    assert time.process_time() - start < 4


# ---- numbers and options -------------------------------------------------------------------------------


def test_as_number_and_truthy_refuse_non_finite() -> None:
    assert as_number("5e8") == 5e8 and as_number(3) == 3.0
    for bad in ("inf", "-inf", "NaN", "1e999", float("nan"), 10**400, BIG):
        assert as_number(bad) is None
    assert truthy(float("nan")) is None and truthy(0.0) is False


@pytest.mark.parametrize("text", ["0", "-1", "inf", "nan", "1e999", BIG, "1" + "0" * 200, "abc", ""])
def test_count_arg_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        safeio.count_arg(text)
    assert len(str(err.value)) < 120


def test_count_and_gib_args_accept() -> None:
    assert safeio.count_arg("8") == 8 and safeio.count_arg(" +16 ") == 16
    assert safeio.gib_arg("79.3") == 79.3
    for bad in ("inf", "nan", "-1", "0", "1e999", "1e300"):
        with pytest.raises(argparse.ArgumentTypeError):
            safeio.gib_arg(bad)


# ---- writes --------------------------------------------------------------------------------------------


def test_output_path_directory_semantics(tmp_path: Path) -> None:
    assert safeio.output_path(f"{tmp_path}/new/", "ds.json") == tmp_path / "new" / "ds.json"
    assert (tmp_path / "new").is_dir()
    assert safeio.output_path(tmp_path, "ds.json") == tmp_path / "ds.json"
    assert safeio.output_path(tmp_path / "f.json", "ds.json") == tmp_path / "f.json"
    with pytest.raises(InputError, match="no such directory"):
        safeio.output_path(f"{tmp_path}/a/b/", "ds.json")


def test_write_new_never_overwrites(tmp_path: Path) -> None:
    p = tmp_path / "out.json"
    p.write_text("keep")
    with pytest.raises(InputError, match="already exists"):
        safeio.write_new(p, "new")
    assert p.read_text() == "keep"
    assert safeio.write_free(p, "new") == tmp_path / "out.2.json"
    with pytest.raises(InputError, match="longer than the file system allows"):
        safeio.write_new(tmp_path / ("x" * 300), "new")


def test_replace_with_backup_keeps_original_mode_and_link(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text("a: 1\n")
    real.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(real.name)
    (tmp_path / "real.yaml.bak").write_text("older backup")
    backup = safeio.replace_with_backup(link, "a: 2\n")
    assert backup == tmp_path / "real.yaml.bak.2" and backup.read_text() == "a: 1\n"
    assert (tmp_path / "real.yaml.bak").read_text() == "older backup"
    assert link.is_symlink() and real.read_text() == "a: 2\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "link.yaml",
        "real.yaml",
        "real.yaml.bak",
        "real.yaml.bak.2",
    ]
