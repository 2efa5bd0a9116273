"""The compiled circuits of tests/fixtures/compiled (written by studies/compile_circuits.py with tracr): their
folders, ground truth and tracr's outputs, read without jax."""
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from keyheads.heads import Head
from keyheads.models import load_model
from keyheads.models.model import HookedModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "compiled"
PROGRAMS = sorted(p.name for p in FIXTURES.iterdir() if (p / "ground_truth.json").is_file())


@dataclass(frozen=True)
class Circuit:
    name: str
    folder: Path
    truth: dict
    outputs: list[dict]  # tracr's forward on every input: prompt, logits [T, n_out], and at full length answer

    @property
    def on_path(self) -> list[Head]:
        return [Head(h["layer"], h["head"]) for h in self.truth["heads"] if h["on_path"]]

    @property
    def direct(self) -> list[Head]:
        """On-path heads that reach the logits through MLPs alone, not through another head."""
        return [Head(h["layer"], h["head"]) for h in self.truth["heads"] if h["direct"]]

    @property
    def compiled(self) -> list[Head]:
        return [Head(h["layer"], h["head"]) for h in self.truth["heads"]]

    def others(self) -> list[Head]:
        """Every head not on the output's path: compiled ones the output ignores, and empty ones."""
        on = set(self.on_path)
        return [Head(layer, head) for layer in range(self.truth["n_layers"]) for head in range(self.truth["n_heads"])
                if Head(layer, head) not in on]

    @property
    def domain(self) -> list[dict]:
        """The inputs the program is meant for (full length), with their answers."""
        return [row for row in self.outputs if "answer" in row]

    @property
    def pairs(self) -> Path:
        return self.folder / "pairs.jsonl"

    def model(self) -> HookedModel:
        return load_model(str(self.folder), device="cpu", dtype="float32")


@cache
def circuit(name: str) -> Circuit:
    folder = FIXTURES / name
    return Circuit(name, folder, json.loads((folder / "ground_truth.json").read_text()),
                   json.loads((folder / "tracr_outputs.json").read_text()))


def answer_ids(model: HookedModel, answers: list[str]) -> torch.Tensor:
    return torch.tensor([model.tokenizer.convert_tokens_to_ids(a) for a in answers])


@torch.no_grad()
def end_logits(model: HookedModel, prompts: list[str], **run) -> torch.Tensor:
    """Logits at END of each prompt, [n, vocab] (one batch: the prompts of a program have one length)."""
    logits, _ = model.run(model.encode(prompts), **run)
    return logits[:, -1]


def accuracy(model: HookedModel, rows: list[dict], **run) -> float:
    logits = end_logits(model, [r["prompt"] for r in rows], **run)
    return (logits.argmax(-1) == answer_ids(model, [r["answer"] for r in rows])).float().mean().item()
