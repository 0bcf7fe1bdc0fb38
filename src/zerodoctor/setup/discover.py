"""Find the files of a training setup: a directory (its config files found and classified, everything else
skipped and listed, never an error) or a list of files.

Beside the training configs a setup directory may hold a `cluster.yaml` (the cluster the run is planned for)
and an environment snapshot (`env.json` from `zerodoctor env --format json`, or a `pip freeze` saved as
`env.txt` / `pip-freeze.txt`) describing the nodes it will run on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerodoctor.errors import InputError, SetupError
from zerodoctor.facts import as_number
from zerodoctor.safeio import read_text
from zerodoctor.setup.document import ConfigDocument
from zerodoctor.setup.load import _referenced_ds_config
from zerodoctor.setup.model import resolve_reference
from zerodoctor.setup.reader import read_document
from zerodoctor.setup.run import ClusterFile, Known, Origin
from zerodoctor.setup.yaml_reader import parse_yaml

CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".py")
CLUSTER_FILE_NAMES = ("cluster.yaml", "cluster.yml")
ENV_FILE_NAMES = ("env.json", "env.txt", "pip-freeze.txt", "pip_freeze.txt", "requirements-freeze.txt")
# Keys of cluster.yaml: name -> what it means. Sizes in GiB (2**30 bytes), as nvidia-smi's "80 GB" cards are
# 79.6 GiB: write what `zerodoctor env` shows, or the marketing size and accept its margin.
CLUSTER_KEYS = {
    "nodes": "number of nodes",
    "gpus_per_node": "GPUs per node",
    "gpu_memory_gib": "memory per GPU in GiB",
    "host_ram_gib": "host RAM per node in GiB",
}
MAX_DIRECTORY_FILES = 200  # a setup directory, not a repository


@dataclass(frozen=True)
class Discovery:
    """The classified files of one setup. `documents` are the configs the run uses; `skipped` are the files
    looked at and not used, each with the reason."""

    documents: tuple[ConfigDocument, ...]
    skipped: tuple[tuple[str, str], ...]
    cluster: ClusterFile | None
    cluster_path: Path | None
    env_path: Path | None


def discover(paths: Sequence[str | Path]) -> Discovery:
    """Classify the given files and the files of the given directories. Raises SetupError / InputError with
    one line when the setup cannot be used: nothing to check, two DeepSpeed configs the run could use, two
    argument files, a file that does not exist."""
    if not paths:
        raise SetupError("no setup given", hint="pass a setup directory or its config files")
    docs: list[ConfigDocument] = []
    skipped: list[tuple[str, str]] = []
    cluster_path: Path | None = None
    env_path: Path | None = None
    from_directory: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
            if len(entries) > MAX_DIRECTORY_FILES:
                raise SetupError(
                    f"{path}: {len(entries)} entries is not a setup directory",
                    hint="pass the folder that holds the run's configs, or the config files themselves",
                )
            for p in entries:
                kind = _classify(p, skipped)
                if kind == "cluster":
                    cluster_path = cluster_path or p
                elif kind == "env":
                    env_path = env_path or p
                elif kind == "config":
                    doc = _read_if_config(p, skipped)
                    if doc is not None:
                        docs.append(doc)
                        from_directory.add(p.resolve())
            continue
        if not path.exists():
            raise InputError(str(path), "no such file or directory", hint="check the path")
        if path.name in CLUSTER_FILE_NAMES:
            cluster_path = path
        elif path.name in ENV_FILE_NAMES:
            env_path = path
        else:
            docs.append(read_document(path))
    docs = _drop_unused_deepspeed(docs, from_directory, skipped)
    args = [d for d in docs if d.kind in ("hf", "llamafactory")]
    if len(args) > 1:
        raise SetupError(
            f"two training argument files: {args[0].display} and {args[1].display}",
            hint="pass the one the run uses",
        )
    if not docs:
        where = ", ".join(str(p) for p in paths)
        raise SetupError(
            f"{where}: no training config found (looked for DeepSpeed JSON, HF / LLaMA-Factory / accelerate YAML, "
            "XTuner .py)",
            hint="pass the directory that holds the run's configs, or the files",
        )
    cluster = read_cluster_file(cluster_path) if cluster_path is not None else None
    return Discovery(tuple(docs), tuple(skipped), cluster, cluster_path, env_path)


def _classify(p: Path, skipped: list[tuple[str, str]]) -> str | None:
    if not p.is_file():
        skipped.append((str(p), "not a regular file"))
        return None
    if p.name in CLUSTER_FILE_NAMES:
        return "cluster"
    if p.name in ENV_FILE_NAMES:
        return "env"
    if p.suffix not in CONFIG_SUFFIXES:
        skipped.append((str(p), f"not a config file ({p.suffix or 'no suffix'})"))
        return None
    return "config"


def _read_if_config(p: Path, skipped: list[tuple[str, str]]) -> ConfigDocument | None:
    """A file in a setup directory: a config if zerodoctor can tell its kind; anything else is skipped (a
    README example, a test's expectations). A config that cannot be parsed is an error, not a skip."""
    try:
        return read_document(p)
    except InputError as exc:
        if "cannot tell what kind of config" in str(exc) or "expected a mapping" in str(exc):
            skipped.append((str(p), "not a training config zerodoctor reads"))
            return None
        raise


def _drop_unused_deepspeed(
    docs: list[ConfigDocument], from_directory: set[Path], skipped: list[tuple[str, str]]
) -> list[ConfigDocument]:
    """A directory often holds several DeepSpeed JSONs (LLaMA-Factory ships ds_z0..ds_z3_offload); the run
    uses the one its framework file names. Without such a file, two candidates are ambiguous."""
    named: set[Path] = set()
    namers: dict[Path, str] = {}
    for d in docs:
        ref = _referenced_ds_config(d)
        if ref is None:
            continue
        found = resolve_reference(d.path, ref[1])
        if found is not None:
            named.add(found.resolve())
            pos = d.position(ref[0])
            namers[found.resolve()] = f"{d.display}:{pos.line}" if pos else d.display
    ds = [d for d in docs if d.kind == "deepspeed"]
    if named:
        out = []
        for d in docs:
            if d.kind == "deepspeed" and d.path.resolve() not in named and d.path.resolve() in from_directory:
                skipped.append(
                    (d.display, f"DeepSpeed config not used: the run uses {', '.join(namers.values())}")
                )
                continue
            out.append(d)
        return out
    if len(ds) > 1:
        raise SetupError(
            f"two DeepSpeed configs and nothing says which the run uses: {ds[0].display}, {ds[1].display}",
            hint="pass the one the run uses (or the training arguments file that names it)",
        )
    return docs


def read_cluster_file(path: Path) -> ClusterFile:
    """`cluster.yaml`: nodes, gpus_per_node, gpu_memory_gib, host_ram_gib; each value keeps its line."""
    text = read_text(path, what="a cluster file")  # bounded; FIFOs and devices refused
    data, positions, _ = parse_yaml(str(path), text)
    if not isinstance(data, dict):
        raise InputError(str(path), "expected a mapping such as `nodes: 2` / `gpus_per_node: 8`")
    values: dict[str, Known[Any]] = {}
    for key, value in data.items():
        pos = positions.get((str(key),))
        line = pos.line if pos else None
        if key not in CLUSTER_KEYS:
            raise InputError(
                str(path),
                f"unknown key {key!r}",
                line=line,
                hint="cluster.yaml knows: " + ", ".join(f"{k} ({v})" for k, v in CLUSTER_KEYS.items()),
            )
        num = as_number(value)
        if num is None or isinstance(value, bool) or num != num or num <= 0 or num == float("inf"):
            raise InputError(
                str(path),
                f"{key}: expected a number above 0, got {value!r}",
                line=line,
                hint=CLUSTER_KEYS[key],
            )
        if key in ("nodes", "gpus_per_node") and num != int(num):
            raise InputError(str(path), f"{key}: expected a whole number, got {value!r}", line=line)
        values[str(key)] = Known(
            int(num) if key in ("nodes", "gpus_per_node") else float(num),
            Origin("cluster-file", str(key), str(path), line, pos.column if pos else None, str(key)),
        )
    return ClusterFile(values)
