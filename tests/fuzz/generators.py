"""Generated bad and odd inputs for every command, shared by the hypothesis suite (tests/fuzz/) and the longer
campaign (benchmarks/fuzz_campaign.py).

A case is built from a `Draw` (two methods: `choice` and `integer`), backed by hypothesis in the tests (so a
failure shrinks) and by `random.Random(seed)` in the campaign (so 10,000 cases cost no hypothesis overhead).
Each case is a command line, the files it reads (written into a fresh directory) and the strings an error
about it may name. The classes are those of issue 11: huge, non-finite and ill-typed numbers; deep nesting,
alias bombs, recursive aliases, control bytes, duplicate keys; XTuner expressions that explode; special files
(FIFOs, /dev/zero, directories, overlong paths), non-UTF-8 text, truncated gzip, CR progress lines, output
paths that name directories.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Draw(Protocol):
    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, lo: int, hi: int) -> int: ...


class RandomDraw:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


@dataclass
class Case:
    """`argv` may contain `{d}` (the case directory). `files`: name -> bytes; `special`: name -> 'fifo',
    'dir', 'devzero' (a symlink to /dev/zero), 'devnull'. `mentions`: an exit-2 error must name one of them."""

    label: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    special: dict[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    mentions: list[str] = field(default_factory=list)
    slow: bool = False  # a big input: the campaign and the suite give it the full time budget
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables of the command
    no_launch: bool = False  # selftest: stop where the real run would start (runner: LAUNCH_REACHED)

    def describe(self) -> str:
        sizes = {k: len(v) for k, v in self.files.items()}
        return f"{self.label}: argv={self.argv} files={sizes} special={self.special}"


# ---- hostile values ---------------------------------------------------------------------------------------

BIG_DIGITS = "9" * 5000
HUGE = "1" + "0" * 200

# JSON spellings of values a count, a size or a flag may be given as.
JSON_VALUES = [
    "0",
    "-1",
    "1",
    "3",
    "1.5",
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    '"inf"',
    '"-inf"',
    '"nan"',
    '"NaN"',
    '"1e999"',
    HUGE,
    BIG_DIGITS,
    "-" + BIG_DIGITS,
    "1" + "0" * 400 + ".5",
    '"auto"',
    "true",
    "false",
    "null",
    '"5"',
    '" 7 "',
    "[]",
    "{}",
    "[1, 2]",
    '{"a": 1}',
    '"x"',
    '"\\u0000"',
    '""',
    "1e-320",
    "5e8",
    '"' + BIG_DIGITS + '"',
]
YAML_VALUES = [
    "0",
    "-1",
    "1",
    "1.5",
    "1e999",
    ".inf",
    "-.inf",
    ".nan",
    "inf",
    "'-inf'",
    "NaN",
    HUGE,
    BIG_DIGITS,
    "0x" + "f" * 300,
    "0o777",
    "1_000",
    "auto",
    "true",
    "yes",
    "off",
    "null",
    "~",
    "[]",
    "{}",
    "[1, 2]",
    "{a: 1}",
    "x",
    "'5'",
    "2001-12-14",
    "!!binary aGVsbG8=",
    "!!float 1e999",
    "'" + BIG_DIGITS + "'",
    "5",
    "5e8",
]
FLAG_VALUES = [
    "0",
    "-1",
    "1",
    "2",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "1e999",
    "1e308",
    HUGE,
    BIG_DIGITS,
    "1.5",
    "0x10",
    "",
    " ",
    "abc",
    "1_000",
    "٣",
    "-0",
    "+5",
    "8",
]

DS_COUNT_KEYS = [
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
]
ZERO_KEYS = [
    "stage",
    "sub_group_size",
    "reduce_bucket_size",
    "stage3_max_live_parameters",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "allgather_bucket_size",
]
HF_KEYS = [
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "save_steps",
    "learning_rate",
    "bf16",
    "fp16",
    "max_grad_norm",
    "cutoff_len",
    "lora_rank",
    "save_only_model",
    "gradient_checkpointing",
    "deepspeed",
    "model_name_or_path",
    "quantization_bit",
]
ACC_KEYS = [
    "num_processes",
    "num_machines",
    "mixed_precision",
    "machine_rank",
    "gradient_accumulation_steps",
    "offload_optimizer_device",
    "zero_stage",
    "gradient_clipping",
]
XT_KEYS = [
    "batch_size",
    "accumulative_counts",
    "max_epochs",
    "max_iters",
    "sequence_parallel_size",
    "max_length",
    "lr",
    "max_norm",
]
MODEL_KEYS = [
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "n_routed_experts",
    "moe_intermediate_size",
    "tie_word_embeddings",
    "head_dim",
    "hub_ids",
]


def ds_config(overrides: dict[str, str] | None = None, zero: dict[str, str] | None = None) -> str:
    base = {
        "train_micro_batch_size_per_gpu": "1",
        "gradient_accumulation_steps": "4",
        "gradient_clipping": "1.0",
        "bf16": '{"enabled": true}',
    }
    z = {"stage": "3", "offload_optimizer": '{"device": "cpu", "pin_memory": true}', "sub_group_size": "1e9"}
    base.update(overrides or {})
    z.update(zero or {})
    zero_text = ", ".join(f'"{k}": {v}' for k, v in z.items())
    body = ",\n  ".join(f'"{k}": {v}' for k, v in base.items())
    return "{\n  " + body + ',\n  "zero_optimization": {' + zero_text + "}\n}\n"


def hf_yaml(overrides: dict[str, str] | None = None, ds: str | None = "ds.json") -> str:
    base = {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
        "output_dir": "out",
        "per_device_train_batch_size": "2",
        "gradient_accumulation_steps": "4",
        "bf16": "true",
        "num_train_epochs": "3",
    }
    if ds:
        base["deepspeed"] = ds
    base.update(overrides or {})
    return "".join(f"{k}: {v}\n" for k, v in base.items())


def llamafactory_yaml(overrides: dict[str, str] | None = None) -> str:
    base = {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
        "stage": "sft",
        "finetuning_type": "lora",
        "lora_rank": "8",
        "template": "llama3",
        "cutoff_len": "2048",
        "per_device_train_batch_size": "1",
        "gradient_accumulation_steps": "8",
        "bf16": "true",
        "output_dir": "saves",
    }
    base.update(overrides or {})
    return "".join(f"{k}: {v}\n" for k, v in base.items())


def accelerate_yaml(overrides: dict[str, str] | None = None) -> str:
    dsc = {"zero_stage": "3", "offload_optimizer_device": "cpu", "gradient_accumulation_steps": "2"}
    top = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "num_processes": "8",
        "num_machines": "1",
    }
    for k, v in (overrides or {}).items():
        (dsc if k in dsc or k == "gradient_clipping" else top)[k] = v
    return (
        "deepspeed_config:\n"
        + "".join(f"  {k}: {v}\n" for k, v in dsc.items())
        + "".join(f"{k}: {v}\n" for k, v in top.items())
    )


def xtuner_py(overrides: dict[str, str] | None = None) -> str:
    base = {
        "pretrained_model_name_or_path": "'01-ai/Yi-34B-200K'",
        "sequence_parallel_size": "8",
        "max_length": "4096",
        "batch_size": "1",
        "accumulative_counts": "8",
        "max_epochs": "3",
        "lr": "2e-5",
        "max_norm": "1",
    }
    base.update(overrides or {})
    head = "from mmengine.optim import AmpOptimWrapper\nfrom xtuner.engine.runner import TrainLoop\n"
    body = "".join(f"{k} = {v}\n" for k, v in base.items())
    tail = (
        "train_cfg = dict(type=TrainLoop, max_epochs=max_epochs)\n"
        "optim_wrapper = dict(type=AmpOptimWrapper, accumulative_counts=accumulative_counts,"
        " clip_grad=dict(max_norm=max_norm))\n"
    )
    return head + body + tail


def model_json(overrides: dict[str, str] | None = None) -> str:
    base = {
        "architectures": '["LlamaForCausalLM"]',
        "model_type": '"llama"',
        "hidden_size": "4096",
        "intermediate_size": "14336",
        "num_attention_heads": "32",
        "num_hidden_layers": "32",
        "num_key_value_heads": "8",
        "vocab_size": "128256",
        "max_position_embeddings": "8192",
        "tie_word_embeddings": "false",
        "torch_dtype": '"bfloat16"',
    }
    base.update(overrides or {})
    return "{\n" + ",\n".join(f'  "{k}": {v}' for k, v in base.items()) + "\n}\n"


# ---- structural bombs -------------------------------------------------------------------------------------


def nested_json(draw: Draw) -> str:
    depth = draw.choice([60, 500, 3000, 100_000])
    kind = draw.choice(["array", "object"])
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


def nested_yaml(draw: Draw) -> str:
    depth = draw.choice([60, 500, 3000, 100_000])
    if draw.choice([True, False]):
        return "[" * depth + "1" + "]" * depth
    return "".join("  " * i + "a:\n" for i in range(min(depth, 1500))) + "  " * min(depth, 1500) + "b: 1\n"


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for i in range(levels):
        name = chr(ord("b") + i)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "\n".join(lines) + "\n"


RECURSIVE_YAML = [
    "a: &x [*x]\n",
    "a: &x {b: *x}\n",
    "per_device_train_batch_size: &r [1, *r]\ndeepspeed: ds.json\n",
    "a: *undefined\n",
    "a: &x 1\nb: &x 2\nc: *x\n",
]


def big_int_expr(draw: Draw) -> str:
    return draw.choice(
        [
            "10**10**10",
            "2**2**2**2**2",
            "9**9**9",
            "(10**100)**(10**100)",
            "10**4400",
            "-(10**10**10)",
            "'a' * 10**10",
            "[0] * 10**10",
            "1 << 10**10",
            "10**300 * 10**300",
            "1/0",
            "10**-400",
            "float('inf')",
            "1e999",
            "-1e999",
            "1e999 - 1e999",
            str(BIG_DIGITS),
            "0x" + "f" * 5000,
            "'x' * 1000 * 1000 * 1000",
            "2 ** 0.5 ** -10000",
            "(-8) ** (1/3)",
            "10**308 * 10.0",
        ]
    )


def long_expression(draw: Draw) -> str:
    n = draw.choice([1000, 10_000, 50_000])
    op = draw.choice(["+", "*", "-", "**"])
    if draw.choice([True, False]):
        return op.join(["1"] * n)
    return "(" * min(n, 5000) + "1" + ")" * min(n, 5000)


def wide_line_expression() -> str:
    # about 600 KB on one line: unknown calls and names (each becomes a Symbol with its source text; with
    # ast.get_source_segment that was O(file) per symbol, minutes in all) inside dicts and lists
    return "[" + ", ".join(f"Hook(a={i}, b=[{i}, x{i}], c=dict(d={i}))" for i in range(12_800)) + "]"


# ---- text damage ------------------------------------------------------------------------------------------


def damage(draw: Draw, data: bytes) -> bytes:
    how = draw.choice(
        ["latin1", "cut", "ctrl", "nul", "bom", "crlf", "utf16", "lone-cr", "surrogate", "none"]
    )
    if how == "latin1":
        at = draw.integer(0, max(0, len(data) - 1))
        return data[:at] + b"\xe9\xff" + data[at:]
    if how == "cut":
        return data[: draw.integer(0, len(data))]
    if how == "ctrl":
        at = draw.integer(0, max(0, len(data) - 1))
        return data[:at] + draw.choice([b"\x01", b"\x07", b"\x1b[31m", b"\x7f", b"\x0c", b"\x85"]) + data[at:]
    if how == "nul":
        return data + b"\x00"
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "crlf":
        return data.replace(b"\n", b"\r\n")
    if how == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if how == "lone-cr":
        return data.replace(b"\n", b"\r")
    if how == "surrogate":
        return data + b"\xed\xa0\x80"
    return data


def duplicate_key(kind: str, text: str) -> str:
    if kind == "json":
        return text.replace("{\n", '{\n  "gradient_accumulation_steps": 2,\n', 1)
    if kind == "yaml":
        return text + "gradient_accumulation_steps: 16\n"
    return text


# ---- logs (the diagnose reader is another module's; the suite still feeds it) -----------------------------

OOM_LINE = (
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {a} GiB. GPU {g} has a total "
    "capacity of {t} GiB of which 1.25 GiB is free. Of the allocated memory {u} GiB is allocated by PyTorch\n"
)


def log_text(draw: Draw) -> bytes:
    v = lambda: draw.choice(["0", "1", "7", HUGE, BIG_DIGITS, "inf", "nan", "-1", ".", "x", "1e999"])  # noqa: E731
    parts = [
        "[2024-05-01 10:00:00,000] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator\n",
        f"{{'loss': 1.2, 'learning_rate': 1e-05, 'epoch': {draw.choice(['0.5', '.', 'nan', BIG_DIGITS])}}}\n",
        "Traceback (most recent call last):\n",
        f'  File "/opt/deepspeed/runtime/zero/stage3.py", line {v()}, in unscale_and_clip_grads\n',
        "    self.fp32_partitioned_groups_flat[sub_group_id].grad.mul_(1. / combined_scale)\n",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
        "cuda:0 and cpu!\n",
        OOM_LINE.format(r=v(), a=v(), g=v(), t=v(), u=v()),
        f"[E ProcessGroupNCCL.cpp:475] [Rank {v()}] Watchdog caught collective operation timeout\n",
        f"torch.distributed.elastic.multiprocessing.api:failed (exitcode: {v()}) local_rank: {v()} "
        f"(pid: {v()}) of binary: /usr/bin/python\n",
        f"[launch.py:315:sigkill_handler] Killing subprocess {v()}\n",
        f'  File "train.py", line {v()}, in <module>\n',
    ]
    picked = [draw.choice(parts) for _ in range(draw.integer(1, 12))]
    text = "".join(picked)
    style = draw.choice(["plain", "cr", "cr-long", "ansi", "two-hits"])
    if style == "cr":
        text = text.replace("\n", "\r")
    elif style == "cr-long":
        text = "\r".join(f"{i}%|##########| {i}/100 [00:01<00:00]" for i in range(40_000)) + "\r" + text
    elif style == "ansi":
        text = "\x1b[31m" + text.replace("\n", "\x1b[0m\n")
    elif style == "two-hits":
        text = parts[5].rstrip("\n") + "\r" + OOM_LINE.format(r=0, a=3.39, g=0, t=79.32, u=73.29)
    return text.encode("utf-8", "surrogateescape")


def gz(data: bytes, truncate: bool) -> bytes:
    out = gzip.compress(data)
    return out[: max(10, len(out) * 2 // 3)] if truncate else out


# ---- env snapshots ----------------------------------------------------------------------------------------


def env_snapshot(draw: Draw) -> bytes:
    form = draw.choice(["freeze", "table", "pipjson", "snapshot", "nested", "junk"])
    if form == "freeze":
        lines = [
            "torch==2.1.0+cu121",
            "deepspeed==" + draw.choice(["0.14.1", BIG_DIGITS, "1e999", "", "x"]),
            draw.choice(
                [
                    "peft @ file:///w/peft-0.10.0-py3-none-any.whl",
                    "-e git+https://x#egg=",
                    "transformers==4.40.0",
                    "a" * 5000 + "==1",
                    "==",
                    "x @ ",
                    "# c",
                ]
            ),
        ]
        return damage(draw, "\n".join(lines).encode())
    if form == "table":
        return damage(
            draw,
            b"Package    Version\n---------- -------\ntorch 2.1.0\ndeepspeed "
            + draw.choice([b"0.14.1", BIG_DIGITS.encode(), b"", b"1 2 3 4"])
            + b"\n",
        )
    if form == "pipjson":
        item = draw.choice(
            [
                '{"name": "torch", "version": "2.1.0"}',
                '{"name": 5, "version": []}',
                "5",
                '{"name": "deepspeed", "version": ' + draw.choice(JSON_VALUES) + "}",
            ]
        )
        return f"[{item}]".encode()
    if form == "snapshot":
        inner = draw.choice(
            [
                '{"schema_version": 1}',
                '{"schema_version": ' + draw.choice(JSON_VALUES) + "}",
                '{"schema_version": 1, "packages": ' + draw.choice(JSON_VALUES) + "}",
                '{"schema_version": 1, "packages": {"torch": {"name": "torch", "version": '
                + draw.choice(JSON_VALUES)
                + '}}, "gpus": '
                + draw.choice(JSON_VALUES)
                + "}",
                '{"schema_version": 1, "host_ram_bytes": ' + draw.choice(JSON_VALUES) + "}",
            ]
        )
        return ('{"environment": ' + inner + "}").encode()
    if form == "nested":
        return nested_json(draw).encode()
    return draw.choice([b"\xff\xfe\x00", b"{", b"   ", b"[", b"\x00" * 100, b"Package Version\n"])


# ---- the case builder -------------------------------------------------------------------------------------

COMMANDS = ["lint", "plan", "env", "kb", "diagnose", "files", "check"]


def _mutated_value(draw: Draw, kind: str) -> str:
    if kind == "json":
        if draw.integer(0, 9) == 0:
            return nested_json(draw)
        return draw.choice(JSON_VALUES)
    if kind == "py":
        if draw.integer(0, 4) == 0:
            return big_int_expr(draw)
        return draw.choice(
            [
                "0",
                "-1",
                "1.5",
                HUGE,
                "float('nan')",
                "'auto'",
                "None",
                "True",
                "[]",
                "{}",
                "dict()",
                "inf",
                "1e999",
                "-1e999",
                "10**200",
                "max_epochs * 0",
            ]
        )
    return draw.choice(YAML_VALUES)


def lint_case(draw: Draw) -> Case:
    form = draw.choice(["ds", "hf", "llamafactory", "accelerate", "xtuner", "model", "bomb", "bytes"])
    files: dict[str, bytes] = {}
    argv = ["lint"]
    slow = False
    if form == "ds":
        key = draw.choice(DS_COUNT_KEYS + ZERO_KEYS)
        value = _mutated_value(draw, "json")
        text = ds_config(zero={key: value}) if key in ZERO_KEYS else ds_config({key: value})
        if draw.integer(0, 3) == 0:
            text = duplicate_key("json", text)
        files["ds.json"] = text.encode()
        argv.append("ds.json")
    elif form in ("hf", "llamafactory"):
        key = draw.choice(HF_KEYS)
        value = _mutated_value(draw, "yaml")
        text = hf_yaml({key: value}) if form == "hf" else llamafactory_yaml({key: value})
        if draw.integer(0, 3) == 0:
            text = duplicate_key("yaml", text)
        files["args.yaml"] = text.encode()
        files["ds.json"] = ds_config(
            {"gradient_accumulation_steps": draw.choice(['"auto"', "4", "1e999"])}
        ).encode()
        argv.append("args.yaml")
    elif form == "accelerate":
        files["acc.yaml"] = accelerate_yaml({draw.choice(ACC_KEYS): _mutated_value(draw, "yaml")}).encode()
        argv.append("acc.yaml")
    elif form == "xtuner":
        key = draw.choice(XT_KEYS)
        style = draw.choice(["value", "value", "long", "wide", "bigint"])
        if style == "long":
            value = long_expression(draw)
            slow = True
        elif style == "wide":
            value = wide_line_expression()
            slow = True
        elif style == "bigint":
            value = big_int_expr(draw)
        else:
            value = _mutated_value(draw, "py")
        files["cfg.py"] = xtuner_py({key: value}).encode()
        argv.append("cfg.py")
    elif form == "model":
        files["config.json"] = model_json({draw.choice(MODEL_KEYS): _mutated_value(draw, "json")}).encode()
        argv += ["config.json"]
    elif form == "bomb":
        which = draw.choice(["laughs", "recursive", "nested-json", "nested-yaml", "big-yaml", "big-json"])
        if which == "laughs":
            text = billion_laughs(draw.choice([4, 9, 12]))
            name = "bomb.yaml"
        elif which == "recursive":
            text = draw.choice(RECURSIVE_YAML)
            name = "rec.yaml"
        elif which == "nested-json":
            text = '{"zero_optimization": ' + nested_json(draw) + "}"
            name = "deep.json"
        elif which == "nested-yaml":
            text = nested_yaml(draw)
            name = "deep.yaml"
        elif which == "big-yaml":
            rows = draw.choice([1000, 400_000])
            text = "per_device_train_batch_size: 1\nitems:\n" + "".join(
                f"  - {{k: {i}, v: x{i}}}\n" for i in range(rows)
            )
            name = "big.yaml"
            slow = True
        else:
            rows = draw.choice([1000, 300_000])
            text = '{"train_batch_size": 8, "x": [' + ", ".join(str(i) for i in range(rows)) + "]}"
            name = "big.json"
            slow = True
        files[name] = text.encode()
        argv.append(name)
    else:
        name = draw.choice(["a.json", "a.yaml", "a.py", "a.txt", "noext"])
        base = {"a.json": ds_config(), "a.yaml": hf_yaml(ds=None), "a.py": xtuner_py()}.get(name, ds_config())
        files[name] = damage(draw, base.encode())
        argv.append(name)
    if draw.integer(0, 3) == 0:
        argv += [
            draw.choice(["--world-size", "--nodes", "--gpus-per-node", "--samples"]),
            draw.choice(FLAG_VALUES),
        ]
    if draw.integer(0, 2) == 0:
        argv.append("--fix")
        if draw.choice([True, False]):
            argv.append("--in-place")
        if draw.choice([True, False]):
            argv.append("--unsafe-fixes")
    if draw.integer(0, 3) == 0:
        argv += ["--format", draw.choice(["json", "markdown"])]
    return Case("lint/" + form, argv, files, mentions=list(files), slow=slow)


def plan_case(draw: Draw) -> Case:
    files: dict[str, bytes] = {}
    special: dict[str, str] = {}
    argv = ["plan"]
    model = draw.choice(["catalog", "file", "file", "dir"])
    if model == "catalog":
        argv += [
            "--model",
            draw.choice(["llama-3-8b", "gemma-2-27b", "nope", "", "../../etc/passwd", "x" * 5000]),
        ]
    else:
        override = {draw.choice(MODEL_KEYS): _mutated_value(draw, "json")}
        text = model_json(override)
        if draw.integer(0, 4) == 0:
            text = nested_json(draw)
        data = damage(draw, text.encode()) if draw.integer(0, 4) == 0 else text.encode()
        if model == "dir":
            files["m/config.json"] = data
            argv += ["--model", "m"]
        else:
            files["model.json"] = data
            argv += ["--model", "model.json"]
    extra = draw.choice(["none", "ds", "hf", "xtuner", "llamafactory"])
    if extra == "ds":
        files["ds.json"] = ds_config({draw.choice(DS_COUNT_KEYS): _mutated_value(draw, "json")}).encode()
        argv += ["--deepspeed", "ds.json"]
    elif extra == "hf":
        files["args.yaml"] = hf_yaml({draw.choice(HF_KEYS): _mutated_value(draw, "yaml")}, ds=None).encode()
        argv.append("args.yaml")
    elif extra == "llamafactory":
        files["lf.yaml"] = llamafactory_yaml({draw.choice(HF_KEYS): _mutated_value(draw, "yaml")}).encode()
        argv.append("lf.yaml")
    elif extra == "xtuner":
        files["cfg.py"] = xtuner_py({draw.choice(XT_KEYS): _mutated_value(draw, "py")}).encode()
        argv.append("cfg.py")
    for _ in range(draw.integer(0, 3)):
        flag = draw.choice(
            [
                "--host-ram",
                "--gpu-memory",
                "--micro-batch",
                "--grad-accum",
                "--lora-rank",
                "--seq-len",
                "--nodes",
                "--gpus-per-node",
                "--margin",
                "--samples",
                "--sequence-parallel",
            ]
        )
        argv += [flag, draw.choice(FLAG_VALUES)]
    if draw.integer(0, 2) == 0:
        argv += ["--method", draw.choice(["full", "lora", "qlora"])]
    if draw.integer(0, 2) == 0:
        target = draw.choice(
            [
                "out.json",
                "newout/",
                "existing.json",
                "adir",
                "adir/",
                "missing/x.json",
                "x" * 300 + ".json",
                "/".join(["d" * 200] * 30) + "/o.json",
                "ds.json",
            ]
        )
        if target == "existing.json":
            files["existing.json"] = b'{"keep": true}\n'
        if target.startswith("adir"):
            special["adir"] = "dir"
        argv += ["--emit-ds-config", target]
    if draw.integer(0, 3) == 0:
        argv += ["--format", "json"]
    return Case("plan/" + model + "+" + extra, argv, files, special, mentions=list(files) + ["--"])


def env_case(draw: Draw) -> Case:
    data = env_snapshot(draw)
    return Case(
        "env/snapshot", ["env", "--env", "snap.txt", "--no-deep"], {"snap.txt": data}, mentions=["snap.txt"]
    )


def kb_case(draw: Draw) -> Case:
    ident = draw.choice(
        [
            "",
            "DS002",
            "ds002",
            "nope",
            "x" * 5000,
            "../etc",
            "\x1b[31m",
            "DS",
            "*",
            "-1",
            "zero3-offload-clip-device-mismatch",
            "KB001",
            BIG_DIGITS,
        ]
    )
    argv = ["kb"] + ([ident] if ident else [])
    if draw.integer(0, 2) == 0:
        argv += ["--format", draw.choice(["json", "markdown"])]
    return Case("kb", argv, mentions=["kb", ident[:20] or "kb"])


def diagnose_case(draw: Draw) -> Case:
    data = log_text(draw)
    form = draw.choice(["plain", "gz", "gz-cut", "stdin", "damaged"])
    files: dict[str, bytes] = {}
    stdin = None
    argv = ["diagnose"]
    if form == "plain":
        files["run.log"] = data
        argv.append("run.log")
    elif form in ("gz", "gz-cut"):
        files["run.log.gz"] = gz(data, form == "gz-cut")
        argv.append("run.log.gz")
    elif form == "stdin":
        stdin = data
        argv.append("-")
    else:
        files["run.log"] = damage(draw, data)
        argv.append("run.log")
    if draw.integer(0, 3) == 0:
        argv += ["--format", "json"]
    return Case(
        "diagnose/" + form,
        argv,
        files,
        stdin=stdin,
        mentions=list(files) + ["stdin", "-"],
        slow=b"%|" in data,
    )


def files_case(draw: Draw) -> Case:
    """Paths that are not regular files, for every command that reads one."""
    what = draw.choice(["fifo", "devzero", "dir", "missing", "longname", "longpath", "devnull", "loop"])
    special: dict[str, str] = {}
    name = "thing.json" if what != "longname" else "n" * 300 + ".json"
    if what == "longpath":
        name = "/".join(["d" * 200] * 30) + "/x.json"
    if what in ("fifo", "devzero", "dir", "devnull"):
        special[name] = what
    if what == "loop":
        special[name] = "loop"
    cmd = draw.choice(["lint", "plan-model", "plan-cfg", "env", "diagnose", "plan-ds"])
    argv = {
        "lint": ["lint", name],
        "plan-model": ["plan", "--model", name],
        "plan-cfg": ["plan", "--model", "llama-3-8b", name],
        "plan-ds": ["plan", "--model", "llama-3-8b", "--deepspeed", name],
        "env": ["env", "--no-deep", "--env", name],
        "diagnose": ["diagnose", name],
    }[cmd]
    return Case(
        f"files/{what}/{cmd}", argv, special=special, mentions=[name[:40], "thing", "n" * 40, "d" * 40]
    )


def check_case(draw: Draw) -> Case:
    """`zerodoctor check SETUP`: a setup directory (configs, cluster.yaml, env.txt) with one damaged part."""
    files = {
        "setup/ds.json": ds_config(
            {
                draw.choice(["train_micro_batch_size_per_gpu", "gradient_accumulation_steps"]): draw.choice(
                    JSON_VALUES
                )
            }
        ).encode(),
        "setup/train_args.yaml": hf_yaml(
            {
                draw.choice(
                    ["per_device_train_batch_size", "num_train_epochs", "bf16", "save_only_model"]
                ): draw.choice(YAML_VALUES)
            }
        ).encode(),
    }
    part = draw.choice(["none", "args", "cluster", "env", "xtuner"])
    if part == "args":
        files["setup/train_args.yaml"] = damage(draw, files["setup/train_args.yaml"])
    elif part == "cluster":
        files["setup/cluster.yaml"] = (
            f"nodes: {draw.choice(YAML_VALUES)}\ngpus_per_node: 8\ngpu_memory_gib: {draw.choice(YAML_VALUES)}\n"
            f"host_ram_gib: {draw.choice(YAML_VALUES)}\n"
        ).encode()
    elif part == "env":
        files["setup/env.txt"] = env_snapshot(draw)
    elif part == "xtuner":
        files = {"setup/cfg.py": xtuner_py({draw.choice(XT_KEYS): _mutated_value(draw, "py")}).encode()}
    target = draw.choice(["setup", "setup/", "setup/train_args.yaml"])
    argv = ["check", target]
    if draw.integer(0, 2) == 0:
        argv += [
            draw.choice(["--gpu-memory", "--host-ram", "--nodes", "--world-size"]),
            draw.choice(FLAG_VALUES),
        ]
    if draw.integer(0, 3) == 0:
        argv += ["--format", draw.choice(["json", "markdown", "sarif"])]
    if draw.integer(0, 4) == 0:
        argv += ["--fix", draw.choice(["fixed", "fixed/", "setup"])]
    return Case("check/" + part, argv, files, mentions=[*files, "setup"])


BUILDERS: dict[str, Callable[[Draw], Case]] = {
    "lint": lint_case,
    "plan": plan_case,
    "env": env_case,
    "kb": kb_case,
    "diagnose": diagnose_case,
    "files": files_case,
    "check": check_case,
}


def build_case(draw: Draw, command: str | None = None, pool: Sequence[str] | None = None) -> Case:
    """One case of `command`, or of a command drawn from `pool` (default: issue 11's COMMANDS, so that a
    seed of the first campaign still builds the same case; NEW_COMMANDS are the inputs added after it)."""
    return BUILDERS[command or draw.choice(list(pool or COMMANDS))](draw)


def to_json(case: Case) -> dict[str, Any]:
    return {
        "label": case.label,
        "argv": case.argv,
        "files": {k: len(v) for k, v in case.files.items()},
        "special": case.special,
    }


def named_cases() -> dict[str, Case]:
    """The cases issue 11 names, one each (the suite runs them all; the campaign times them with --named)."""
    return {
        "5000-digit int in DeepSpeed JSON": Case(
            "n",
            ["lint", "ds.json"],
            {"ds.json": ds_config({"train_batch_size": BIG_DIGITS}).encode()},
            mentions=["ds.json"],
        ),
        "1e999 count in DeepSpeed JSON": Case(
            "n",
            ["lint", "ds.json"],
            {"ds.json": ds_config({"gradient_accumulation_steps": "1e999"}).encode()},
            mentions=["ds.json"],
        ),
        "NaN in DeepSpeed JSON": Case(
            "n",
            ["lint", "ds.json"],
            {"ds.json": ds_config({"train_micro_batch_size_per_gpu": "NaN"}).encode()},
            mentions=["ds.json"],
        ),
        "5000-digit int in YAML": Case(
            "n",
            ["lint", "a.yaml"],
            {"a.yaml": hf_yaml({"per_device_train_batch_size": BIG_DIGITS}, ds=None).encode()},
            mentions=["a.yaml"],
        ),
        "5000-digit int in model config": Case(
            "n",
            ["plan", "--model", "m.json"],
            {"m.json": model_json({"hidden_size": BIG_DIGITS}).encode()},
            mentions=["m.json"],
        ),
        "100,000 nested arrays in JSON": Case(
            "n", ["lint", "d.json"], {"d.json": ("[" * 100_000 + "]" * 100_000).encode()}, mentions=["d.json"]
        ),
        "100,000 nested arrays in YAML": Case(
            "n", ["lint", "d.yaml"], {"d.yaml": ("[" * 100_000 + "]" * 100_000).encode()}, mentions=["d.yaml"]
        ),
        "100,000 nested arrays in an env snapshot": Case(
            "n",
            ["env", "--no-deep", "--env", "e.json"],
            {"e.json": ("[" * 100_000 + "]" * 100_000).encode()},
            mentions=["e.json"],
        ),
        "100,000 nested arrays in a model config": Case(
            "n",
            ["plan", "--model", "m.json"],
            {"m.json": ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()},
            mentions=["m.json"],
        ),
        "500 nested objects (position scanner)": Case(
            "n",
            ["lint", "d.json"],
            {"d.json": ('{"zero_optimization": ' + '{"a": ' * 500 + "1" + "}" * 501).encode()},
            mentions=["d.json"],
        ),
        "recursive YAML alias": Case(
            "n",
            ["lint", "r.yaml"],
            {"r.yaml": b"per_device_train_batch_size: &r [1, *r]\noutput_dir: o\n"},
            mentions=["r.yaml"],
        ),
        "billion laughs": Case(
            "n", ["lint", "b.yaml"], {"b.yaml": billion_laughs(9).encode()}, mentions=["b.yaml"]
        ),
        "YAML control byte": Case(
            "n", ["lint", "c.yaml"], {"c.yaml": b"output_dir: o\x01\nbf16: true\n"}, mentions=["c.yaml"]
        ),
        "duplicate key in a file --fix edits": Case(
            "n",
            ["lint", "--fix", "--in-place", "a.yaml"],
            {
                "a.yaml": hf_yaml(ds="ds.json").encode(),
                "ds.json": duplicate_key("json", ds_config()).encode(),
            },
            mentions=["a.yaml", "ds.json"],
        ),
        "XTuner 10,000 terms": Case(
            "n",
            ["lint", "x.py"],
            {"x.py": xtuner_py({"max_epochs": "+".join(["1"] * 10_000)}).encode()},
            mentions=["x.py"],
        ),
        "XTuner 10**10**10": Case(
            "n",
            ["lint", "x.py"],
            {"x.py": xtuner_py({"max_epochs": "10**10**10"}).encode()},
            mentions=["x.py"],
        ),
        "XTuner 600 KB one-line expression": Case(
            "n",
            ["lint", "x.py"],
            {"x.py": xtuner_py({"custom_hooks": wide_line_expression()}).encode()},
            mentions=["x.py"],
        ),
        "path longer than the file system allows": Case(
            "n", ["lint", "/".join(["d" * 200] * 30) + "/x.json"], mentions=["d" * 40]
        ),
        "FIFO with no writer": Case(
            "n", ["lint", "fifo.json"], special={"fifo.json": "fifo"}, mentions=["fifo.json"]
        ),
        "/dev/zero": Case(
            "n", ["lint", "zero.json"], special={"zero.json": "devzero"}, mentions=["zero.json"]
        ),
        "config.json that is not UTF-8": Case(
            "n",
            ["plan", "--model", "m/config.json"],
            {"m/config.json": model_json().encode().replace(b'"llama"', b'"ll\xe9ama"')},
            mentions=["config.json"],
        ),
        "13 MB config read as YAML": Case(
            "n",
            ["lint", "big.yaml"],
            {
                "big.yaml": (
                    "per_device_train_batch_size: 1\nitems:\n"
                    + "".join(f"  - {{k: {i}, v: x{i}}}\n" for i in range(500_000))
                ).encode()
            },
            mentions=["big.yaml"],
        ),
        "--emit-ds-config newout/": Case(
            "n",
            [
                "plan",
                "--model",
                "llama-3-8b",
                "--gpus-per-node",
                "8",
                "--gpu-memory",
                "80",
                "--host-ram",
                "1024",
                "--emit-ds-config",
                "newout/",
            ],
            mentions=["newout"],
        ),
        "--host-ram inf": Case(
            "n", ["plan", "--model", "llama-3-8b", "--host-ram", "inf"], mentions=["--host-ram"]
        ),
        "--micro-batch 10**200": Case(
            "n",
            ["plan", "--model", "llama-3-8b", "--micro-batch", "1" + "0" * 200],
            mentions=["--micro-batch"],
        ),
        "env snapshot from stdin": Case(
            "n",
            ["env", "--no-deep", "--env", "-"],
            stdin=b"torch==2.1.0+cu121\ndeepspeed==0.14.1\n",
            mentions=["stdin"],
        ),
    }


# ---- what was added after the first campaign: report, guard, selftest, --fix, run directories, plan inputs --

# values a guard record may carry where a number is expected (the guard writes json.dumps, which spells
# non-finite floats NaN / Infinity)
RECORD_VALUES = [
    "NaN",
    "Infinity",
    "-Infinity",
    "-1",
    "0",
    HUGE,
    BIG_DIGITS,
    "1e308",
    '"x"',
    '"12"',
    "null",
    "true",
    "[]",
    "{}",
    "[1, 2]",
    '{"a": 1}',
    "1.5",
]
SAMPLE_KEYS = [
    "step",
    "t",
    "gpu_allocated",
    "gpu_reserved_peak",
    "gpu_alloc_retries",
    "gpu_total",
    "rss",
    "rss_hwm",
    "node_used",
    "node_total",
    "cgroup_usage",
    "cgroup_limit",
    "phase",
]
META_KEYS = ["world_size", "local_rank", "host", "rank", "versions"]


def _record_lines(rank: int, world: str = "2", steps: int = 8) -> list[str]:
    gib = 1 << 30
    lines = [
        f'{{"kind": "meta", "t": 1800000000.0, "rank": {rank}, "host": "node-a", "local_rank": {rank}, '
        f'"world_size": {world}, "versions": {{"torch": "2.4.0"}}, "not_available": []}}',
        f'{{"kind": "event", "t": 1800000000.0, "rank": {rank}, "event": "train_begin", "step": 0}}',
    ]
    for step in range(1, steps + 1):
        phase = "first_optimizer_step" if step == 1 else "save" if step == steps else "train"
        used = 150 * gib + step * gib
        lines.append(
            f'{{"kind": "sample", "t": {1800000000 + 10 * step}, "rank": {rank}, "step": {step}, '
            f'"optimizer_step": {step}, "phase": "{phase}", "gpu_allocated": {28 * gib}, '
            f'"gpu_allocated_peak": {29 * gib}, "gpu_reserved": {31 * gib}, "gpu_reserved_peak": {32 * gib}, '
            f'"gpu_alloc_retries": 0, "gpu_ooms": 0, "gpu_free": {40 * gib}, "gpu_total": {80 * gib}, '
            f'"rss": {40 * gib + step * (50 << 20)}, "rss_hwm": {41 * gib}, "node_used": {used}, '
            f'"node_total": {1024 * gib}, "cgroup_usage": {used}, "cgroup_limit": {250 * gib}}}'
        )
    lines.append(
        f'{{"kind": "finding", "t": 1800000000.0, "rank": {rank}, "step": 1, "finding": {{"id": '
        '"guard.max-steps-below-epoch", "severity": "warning", "title": "stops early", "message": "m", '
        '"fixes": ["remove max_steps"], "evidence": [], "references": []}}'
    )
    return lines


def _set_json_value(line: str, key: str, value: str) -> str:
    """The record line with `key`'s value replaced (or the key added)."""
    import re

    pat = re.compile(r'("' + re.escape(key) + r'": )("[^"]*"|\{[^{}]*\}|[^,}]+)')
    if pat.search(line):
        return pat.sub(lambda m: m.group(1) + value, line, count=1)
    return line[:-1] + f', "{key}": {value}}}'


def report_case(draw: Draw) -> Case:
    """`zerodoctor report RUN_DIR` on odd guard record folders: empty, truncated, NaN/inf/huge/ill-typed
    values, a directory or FIFO or /dev/zero where a rank file should be, odd error and stack files."""
    files: dict[str, bytes] = {}
    special: dict[str, str] = {}
    world = draw.choice(["2", "2", "1", "0", "-3", HUGE, "1e999", '"2"', "1000000000", "null", "2.5"])
    ranks = {r: _record_lines(r, world if r == 0 else "2") for r in (0, 1)}
    form = draw.choice(
        ["value", "value", "value", "empty", "truncate", "binary", "special", "extra", "finding"]
    )
    if form == "value":
        for _ in range(draw.integer(1, 3)):
            r = draw.choice([0, 1])
            i = draw.integer(0, len(ranks[r]) - 2)
            key = draw.choice(SAMPLE_KEYS + META_KEYS if i == 0 else SAMPLE_KEYS)
            ranks[r][i] = _set_json_value(ranks[r][i], key, draw.choice(RECORD_VALUES))
    elif form == "finding":
        key = draw.choice(["fixes", "evidence", "references", "data", "severity", "id", "message"])
        ranks[0][-1] = _set_json_value(ranks[0][-1], key, draw.choice(RECORD_VALUES + ['[{"line": "x"}]']))
    texts = {r: ("\n".join(lines) + "\n").encode() for r, lines in ranks.items()}
    if form == "empty":
        texts[draw.choice([0, 1])] = draw.choice([b"", b"\n\n", b"   "])
    elif form == "truncate":
        r = draw.choice([0, 1])
        texts[r] = texts[r][: draw.integer(0, len(texts[r]))]
    elif form == "binary":
        texts[draw.choice([0, 1])] = draw.choice(
            [b"\x00" * 4096, b"\xff\xfe" + "{}".encode("utf-16-le"), gzip.compress(texts[0]), b"\x1f\x8b\x08"]
        )
    folder = draw.choice(["run/zerodoctor", "run/zerodoctor", "zerodoctor"])
    for r, data in texts.items():
        files[f"{folder}/rank{r}.jsonl"] = data
    if form == "special":
        name = f"{folder}/rank{draw.choice([0, 1, 2])}.jsonl"
        files.pop(name, None)
        special[name] = draw.choice(["dir", "fifo", "devzero", "devnull", "loop"])
    elif form == "extra":
        what = draw.choice(["error", "stacks", "error-dir", "stacks-fifo", "many"])
        if what == "error":
            files[f"{folder}/error-rank1.json"] = draw.choice(
                [b"", b"[]", b"{", b'{"rank": "x", "step": NaN, "message": 5}', b"\x00\xff", b"null"]
            )
        elif what == "stacks":
            files[f"{folder}/stacks-rank1.txt"] = draw.choice(
                [
                    b'Timeout (0:10:00)!\nThread 0x1 (most recent call first):\n  File "x.py", line '
                    + BIG_DIGITS.encode()
                    + b" in f\n",
                    b"Timeout (0:10:00)!\n" * 20_000,
                    b"\xff" * 1000,
                    b"",
                ]
            )
        elif what == "error-dir":
            special[f"{folder}/error-rank0.json"] = "dir"
        elif what == "stacks-fifo":
            special[f"{folder}/stacks-rank0.txt"] = "fifo"
        else:
            for r in range(2, 402):
                files[f"{folder}/rank{r}.jsonl"] = texts[1]
    argv = ["report", "run" if folder.startswith("run") else "zerodoctor", "--format", "json"]
    if draw.integer(0, 4) == 0:
        argv = [
            "report",
            argv[1],
            "--out",
            draw.choice(["out", "run", "x" * 300, "run/zerodoctor/rank0.jsonl"]),
        ]
    if draw.integer(0, 9) == 0:
        argv[1] = draw.choice(["nope", "", "run/zerodoctor/rank0.jsonl", "/dev/null"])
    return Case(
        "report/" + form,
        argv,
        files,
        special,
        mentions=["run", "zerodoctor", "rank", "--out", "nope", "'"],
        slow="--format" not in argv,  # the HTML page imports matplotlib and draws its charts: seconds
    )


GUARD_FLAGS = {
    "--every": ["0", "-1", "1", "inf", "nan", BIG_DIGITS, "1.5", "x", ""],
    "--host-limit-gib": ["inf", "-inf", "nan", "-1", "0", "1e308", "1e-300", BIG_DIGITS, "x", "64"],
    "--hang-factor": ["inf", "nan", "-1", "0", "1e308", "x", "10"],
    "--hang-first-s": ["inf", "nan", "-5", "0", "1e308", "x", "60"],
    "--host-measure": ["auto", "bogus", ""],
}
GUARD_ENV = [
    "EVERY",
    "HOST_LIMIT_BYTES",
    "HANG_FACTOR",
    "HANG_FIRST_S",
    "HANG_MIN_S",
    "TREND_WINDOW",
    "WATCHDOG",
    "HOST_MEASURE",
    "RUN_DIR",
    "FAULT",
]


def guard_case(draw: Draw) -> Case:
    """`zerodoctor guard [OPTIONS] -- CMD` with odd options and ZERODOCTOR_GUARD_* variables; the command is
    `true` (or an odd one): a bad option must be refused before anything runs."""
    argv = ["guard"]
    for _ in range(draw.integer(0, 3)):
        flag = draw.choice(sorted(GUARD_FLAGS))
        argv += [flag, draw.choice(GUARD_FLAGS[flag])]
    env: dict[str, str] = {}
    if draw.integer(0, 2) == 0:
        env["ZERODOCTOR_GUARD_" + draw.choice(GUARD_ENV)] = draw.choice(
            ["inf", "nan", "-1", "0", "1e999", BIG_DIGITS, "x", "maybe", "1", "nodir/sub"]
        )
    special: dict[str, str] = {}
    if draw.integer(0, 1) == 0:
        where = draw.choice(["g", "g", "afile", "x" * 300])
        if where == "afile":
            special["afile"] = "devnull"
        argv += ["--run-dir", where]
    else:
        argv += ["--run-dir", "g"]  # the guard writes its start-up file under RUN_DIR/zerodoctor/
    cmd = draw.choice([["--", "true"], ["--", "true"], ["--"], [], ["--", ""], ["--", "./nope"], ["--", "."]])
    return Case(
        "guard",
        argv + cmd,
        special=special,
        env=env,
        mentions=["--", "ZERODOCTOR_GUARD_", "afile", "x" * 40, "command"],
    )


def selftest_case(draw: Draw) -> Case:
    """`zerodoctor selftest` argument and config validation: the case stops where the run would be
    launched (runner: `no_launch`), so a config that is not refused costs no real run."""
    files: dict[str, bytes] = {}
    argv = ["selftest"]
    form = draw.choice(["ds", "hf", "llamafactory", "accelerate", "model", "flags", "dir"])
    if form == "ds":
        key = draw.choice(DS_COUNT_KEYS + ZERO_KEYS)
        value = _mutated_value(draw, "json")
        files["ds.json"] = (
            ds_config(zero={key: value}) if key in ZERO_KEYS else ds_config({key: value})
        ).encode()
        argv += ["ds.json", "--model", draw.choice(["llama-3-8b", "nope", "", "x" * 5000])]
    elif form in ("hf", "llamafactory"):
        key = draw.choice(HF_KEYS + NEW_LF_KEYS)
        value = draw.choice(NEW_LF_VALUES.get(key, YAML_VALUES))
        text = (
            hf_yaml({key: value}) if form == "hf" else llamafactory_yaml({key: value, "deepspeed": "ds.json"})
        )
        files["args.yaml"] = text.encode()
        files["ds.json"] = ds_config().encode()
        argv.append("args.yaml")
    elif form == "accelerate":
        files["acc.yaml"] = accelerate_yaml({draw.choice(ACC_KEYS): _mutated_value(draw, "yaml")}).encode()
        argv += ["acc.yaml", "--model", "llama-3-8b"]
    elif form == "model":
        files["ds.json"] = ds_config().encode()
        files["config.json"] = odd_model_json(draw).encode()
        argv += ["ds.json", "--model", "config.json"]
    elif form == "dir":
        files["setup/notes.md"] = b"# notes\n"
        argv.append(draw.choice(["setup", "setup/", "nothere"]))
    for _ in range(draw.integer(0 if form != "flags" else 1, 3)):
        flag = draw.choice(["--ranks", "--steps", "--timeout", "--world-size", "--nodes", "--gpus-per-node"])
        argv += [flag, draw.choice(FLAG_VALUES + ["100000", "9999"])]
    if draw.integer(0, 3) == 0:
        argv += ["--workdir", draw.choice(["wd", "x" * 300, "ds.json", "/dev/null"])]
    if draw.integer(0, 4) == 0:
        argv += ["--kind", draw.choice(["deepspeed", "model", "xtuner", "hf"])]
    return Case(
        "selftest/" + form, argv, files, mentions=[*files, "setup", "nothere", "--", "model"], no_launch=True
    )


def fix_case(draw: Draw) -> Case:
    """`check --fix DIR` and `lint --fix [--in-place]` on odd files: the user's files keep their bytes (the
    runner hashes every file before and after), copies go where asked."""
    files: dict[str, bytes] = {}
    special: dict[str, str] = {}
    ds = ds_config(
        {draw.choice(DS_COUNT_KEYS): draw.choice(JSON_VALUES)}, zero={"stage": draw.choice(["3", "2", '"3"'])}
    ).encode()
    args = hf_yaml({draw.choice(HF_KEYS): draw.choice(YAML_VALUES)}).encode()
    how = draw.choice(["plain", "damaged", "dupe", "crlf-bom", "symlink", "readonly-dir", "fixed-exists"])
    if how == "damaged":
        args = damage(draw, args)
    elif how == "dupe":
        ds = duplicate_key("json", ds.decode()).encode()
    elif how == "crlf-bom":
        ds = b"\xef\xbb\xbf" + ds.replace(b"\n", b"\r\n")
    files["setup/ds.json"] = ds
    files["setup/train_args.yaml"] = args
    if how == "symlink":
        special["setup/ds.json"] = "loop"
        files.pop("setup/ds.json")
    if how == "fixed-exists":
        files["fixed/ds.json"] = b'{"mine": true}\n'
        files["fixed/train_args.yaml"] = b"mine: true\n"
    if draw.choice([True, False]):
        target = draw.choice(["fixed", "fixed/", "setup", "setup/", ".", "setup/ds.json", "x" * 300])
        argv = ["check", "setup", "--fix", target, "--env", "none"]
    else:
        argv = ["lint", draw.choice(["setup/train_args.yaml", "setup/ds.json", "setup"]), "--fix"]
        if draw.choice([True, False]):
            argv.append("--in-place")
        if draw.choice([True, False]):
            argv.append("--unsafe-fixes")
    return Case("fix/" + how, argv, files, special, mentions=[*files, "setup", "fixed", "x" * 40, "--fix"])


def rundir_case(draw: Draw) -> Case:
    """`diagnose RUN_DIR` with odd members: symlink loops, FIFOs, binary files, thousands of tiny files,
    deep trees, odd error.json files and guard folders."""
    files: dict[str, bytes] = {"run/rank0.log": log_text(draw)}
    special: dict[str, str] = {}
    slow = False
    for _ in range(draw.integer(1, 3)):
        what = draw.choice(["loop", "fifo", "binary", "many", "deep", "error", "devzero", "dirlog", "guard"])
        if what == "loop":
            special["run/loop.log"] = "loop"
            special["run/sub/self"] = "dirloop"
        elif what == "fifo":
            special["run/rank1.log"] = "fifo"
        elif what == "binary":
            files["run/rank2.log"] = bytes(range(256)) * draw.choice([1, 400])
        elif what == "many":
            for i in range(draw.choice([500, 10_000])):
                files[f"run/many/r{i}.log"] = b"x\n"
            slow = True
        elif what == "deep":
            files["run/" + "/".join(["d"] * 40) + "/rank3.log"] = log_text(draw)
        elif what == "error":
            files["run/error.json"] = draw.choice(
                [
                    b"",
                    b"{",
                    b"[]",
                    b'{"message": 5}',
                    b'{"message": {"message": NaN, "extraInfo": {"py_callstack": 7}}}',
                    b'{"message": {"message": "' + b"x" * 200_000 + b'"}}',
                    ("[" * 100_000).encode(),
                ]
            )
        elif what == "devzero":
            special["run/rank4.log"] = "devzero"
        elif what == "dirlog":
            special["run/rank5.log"] = "dir"
        else:
            files["run/zerodoctor/rank0.jsonl"] = draw.choice(
                [b"", b"{", b'{"world_size": ' + HUGE.encode() + b"}\n"]
            )
            files["run/zerodoctor/stacks-rank0.txt"] = draw.choice(
                [b"Timeout (0:10:00)!\n" * 5000, b"\xff\xfe", b'  File "x", line 99999999999999999999 in f\n']
            )
    argv = ["diagnose", draw.choice(["run", "run/"])]
    if draw.integer(0, 3) == 0:
        argv += ["--format", "json"]
    return Case("rundir", argv, files, special, mentions=["run", "rank"], slow=slow)


MOE_MODEL = {
    "architectures": '["MixtralForCausalLM"]',
    "model_type": '"mixtral"',
    "hidden_size": "4096",
    "intermediate_size": "14336",
    "num_attention_heads": "32",
    "num_hidden_layers": "32",
    "num_key_value_heads": "8",
    "vocab_size": "32000",
    "num_local_experts": "8",
    "num_experts_per_tok": "2",
}
ODD_MODEL_VALUES = {
    "num_local_experts": ["0", "-8", "1", HUGE, "1e999", '"8"', "null", "100000"],
    "num_experts_per_tok": ["0", "9", "-1", "100", "null"],
    "num_key_value_heads": ["64", "0", "-8", "3", "null", '"8"'],
    "num_attention_heads": ["0", "-32", "7", HUGE],
    "hidden_size": ["-4096", "0", "1", "4095", "1e999", HUGE],
    "vocab_size": ["10000000000", "1000000000000000", "0", "-1", HUGE],
    "num_hidden_layers": ["0", "-2", "100000", "1.5"],
    "intermediate_size": ["0", "-1", "null", HUGE],
    "head_dim": ["0", "-1", "100000", "null"],
    "moe_intermediate_size": ["0", "-1", HUGE],
}


def odd_model_json(draw: Draw) -> str:
    base = dict(MOE_MODEL) if draw.choice([True, False]) else None
    text_base: dict[str, str] = base or {}
    key = draw.choice(sorted(ODD_MODEL_VALUES))
    value = draw.choice(ODD_MODEL_VALUES[key])
    if base is None:
        return model_json({key: value}) if draw.integer(0, 4) else model_json({"num_key_value_heads": "64"})
    text_base[key] = value
    if draw.integer(0, 3) == 0:
        text_base.pop(draw.choice(sorted(text_base)))  # a missing key
    return "{\n" + ",\n".join(f'  "{k}": {v}' for k, v in text_base.items()) + "\n}\n"


NEW_LF_KEYS = [
    "finetuning_type",
    "pref_loss",
    "stage",
    "eval_strategy",
    "eval_steps",
    "per_device_eval_batch_size",
    "do_eval",
    "val_size",
    "pref_beta",
    "fsdp",
    "fsdp_config",
]
NEW_LF_VALUES = {
    "finetuning_type": ["lora", "full", "freeze", "oft", "LORA", "5", "null", "[]", "{}", "''"],
    "pref_loss": ["sigmoid", "orpo", "simpo", "bogus", "5", "null", "[]"],
    "stage": ["sft", "dpo", "kto", "rm", "ppo", "pt", "bogus", "5", "null"],
    "eval_strategy": ["steps", "epoch", "no", "bogus", "5", "true", "null", "[]"],
    "eval_steps": ["0", "-1", "1e999", ".nan", HUGE, "x", "0.5", "null"],
    "per_device_eval_batch_size": ["0", "-1", "1e999", HUGE, BIG_DIGITS, "x", "null", "[]"],
    "do_eval": ["true", "5", "x", "null", "[]"],
    "val_size": ["0.1", "-1", "2", "1e999", ".nan", "x", "1000"],
    "pref_beta": ["0.1", ".nan", "-1", "x"],
    "fsdp": ["full_shard auto_wrap", "true", "false", "5", "[]", "{}", "bogus", "[full_shard, offload]"],
    "fsdp_config": ["{}", "5", "x.json", "{fsdp_offload_params: .nan}", "{version: 5}", "{version: x}", "[]"],
}
ACC_NEW = {
    "distributed_type": ["FSDP", "DEEPSPEED", "MULTI_GPU", "bogus", "5", "null"],
    "fsdp_config": [
        "{fsdp_sharding_strategy: FULL_SHARD, fsdp_offload_params: true}",
        "{fsdp_sharding_strategy: 5}",
        "{fsdp_version: 7}",
        "{fsdp_version: .nan}",
        "{fsdp_offload_params: maybe}",
        "5",
        "[]",
        "{fsdp_sharding_strategy: bogus}",
        "{fsdp_state_dict_type: 5}",
    ],
    "mixed_precision": ["bf16", "fp8", "no", "bogus", "5", "true"],
}


def plan_new_case(draw: Draw) -> Case:
    """`plan` (and `lint` / `check`) with odd model configs (MoE with 0 experts, negative sizes, missing keys,
    more KV heads than heads, a huge vocabulary) and odd values of the newer keys (finetuning_type,
    pref_loss, evaluation, FSDP) in LLaMA-Factory / HF / accelerate configs."""
    files: dict[str, bytes] = {}
    cmd = draw.choice(["plan", "plan", "lint", "check"])
    argv = [cmd]
    form = draw.choice(["model", "lf", "acc"])
    if form == "model":
        files["m/config.json"] = odd_model_json(draw).encode()
        if cmd == "plan":
            argv += ["--model", "m"]
        else:
            files["lf.yaml"] = llamafactory_yaml({"model_name_or_path": "m", "deepspeed": "ds.json"}).encode()
            files["ds.json"] = ds_config().encode()
            argv += ["lf.yaml"]
    elif form == "lf":
        over = {}
        for _ in range(draw.integer(1, 3)):
            key = draw.choice(NEW_LF_KEYS)
            over[key] = draw.choice(NEW_LF_VALUES[key])
        if draw.choice([True, False]):
            over["deepspeed"] = "ds.json"
            files["ds.json"] = ds_config().encode()
        files["lf.yaml"] = llamafactory_yaml(over).encode()
        argv += (
            ["lf.yaml"]
            if cmd != "plan"
            else ["lf.yaml", "--model", draw.choice(["llama-3-8b", "mixtral-8x7b"])]
        )
    else:
        acc = accelerate_yaml({})
        key = draw.choice(sorted(ACC_NEW))
        acc = (
            acc.replace(f"{key}: bf16\n", "").replace(f"{key}: DEEPSPEED\n", "")
            + f"{key}: {draw.choice(ACC_NEW[key])}\n"
        )
        files["acc.yaml"] = acc.encode()
        argv += ["acc.yaml"] + (["--model", "llama-3-8b"] if cmd != "lint" else [])
    if cmd in ("plan", "check"):
        argv += ["--gpus-per-node", "8", "--gpu-memory", "80", "--host-ram", "512"]
    if cmd == "check":
        argv += ["--env", "none"]
    if draw.integer(0, 3) == 0:
        argv += ["--format", "json"]
    return Case("new/" + cmd + "/" + form, argv, files, mentions=[*files, "m", "config.json", "--", "model"])


NEW_BUILDERS: dict[str, Callable[[Draw], Case]] = {
    "report": report_case,
    "guard": guard_case,
    "selftest": selftest_case,
    "fix": fix_case,
    "rundir": rundir_case,
    "plan-new": plan_new_case,
}
BUILDERS.update(NEW_BUILDERS)
NEW_COMMANDS = list(NEW_BUILDERS)
