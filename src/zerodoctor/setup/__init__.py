"""Read user files into one TrainingSetup: DeepSpeed JSON, HF args, LLaMA-Factory YAML, accelerate YAML and
XTuner Python configs (ast only), with line numbers for every key."""

from __future__ import annotations

from zerodoctor.setup.document import KINDS, ConfigDocument
from zerodoctor.setup.load import load_setup
from zerodoctor.setup.model import TrainingSetup, build_setup
from zerodoctor.setup.reader import read_document

__all__ = ["KINDS", "ConfigDocument", "TrainingSetup", "build_setup", "load_setup", "read_document"]
