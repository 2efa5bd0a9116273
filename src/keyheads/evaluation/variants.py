"""Model variants: what a row of the table is, and how to turn it into a model plus hooks.

A `Variant` is a small spec (kind, model, options). Each kind in `VARIANT_KINDS` knows
how to build a `Prepared` (a HookedModel, the edit hooks to keep installed, and a stable
fingerprint that keys the result cache). Adding a kind (fine-tuning adapters, say) is
adding one function with `@register_kind("name")`; the evaluator only sees `Prepared`.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.pairs import read_pairs
from ..errors import SettingError
from ..finetune.adapter import load_finetuned, read_info
from ..heads import heads_of
from ..io import file_sha256
from ..knockout import compute_means, end_aligned_length
from ..mean import DEFAULT_MEAN, check_mean
from ..models.fingerprint import short_sha, weights_fingerprint
from ..models.loading import load_tokenizer
from ..models.model import HookedModel
from ..numbers import human


@dataclass(frozen=True)
class Variant:
    """One thing to evaluate.

    Attributes:
        kind: a key of VARIANT_KINDS ("model", "knockout", ...).
        model: bundled name, local model folder, .gguf file or hub id of the underlying model.
        label: the row name in the table (default: derived from kind and model).
        options: kind-specific settings as sorted (key, value) pairs, JSON-serialisable.
    """

    kind: str
    model: str
    label: str = ""
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def make(cls, kind: str, model: str, label: str = "", **options) -> Variant:
        return cls(kind, model, label, tuple(sorted(options.items())))

    def opt(self, key: str, default=None):
        return next((value for name, value in self.options if name == key), default)

    def with_defaults(self, **options) -> Variant:
        """This variant with `options` added where it does not set them itself."""
        return Variant.make(self.kind, self.model, self.label, **{**options, **dict(self.options)})

    def spec(self) -> dict:
        return {"kind": self.kind, "model": self.model, "options": dict(self.options)}

    @property
    def name(self) -> str:
        return self.label or (self.model if self.kind == "model" else f"{self.model} [{self.kind}]")


@dataclass
class Prepared:
    """A variant ready to run: its cache identity now, its model and edits when first needed.

    Building can be the costly part (a copy of the weights, knockout means over hundreds of
    prompts), so it waits until an item is not in the cache: a resumed evaluation whose rows are
    done builds nothing. `release()` drops what was built, so rows evaluated one after another
    hold one fine-tuned copy of the weights at a time.

    Attributes:
        fingerprint: hash of the weights and of everything else that changes outputs.
        label: the row name.
        tokenizer: the model's tokenizer (part of some cache keys, so needed before building).
        info: table extras ("train_speed", "tuned_params") and notes for the report.
        build: makes (model, edits): the HookedModel (possibly shared with other variants) and the
            hook edits to install around every forward pass (empty for a plain model).
        end_window: how many last tokens of a prompt the edits treat position by position from END
            (an aligned knockout's means); a shared few-shot prefix leaves them to each row.
    """

    fingerprint: str
    label: str
    tokenizer: Any
    build: Callable[[], tuple[HookedModel, dict]]
    info: dict = field(default_factory=dict)
    _built: tuple[HookedModel, dict] | None = field(default=None, repr=False)
    end_window: int = 0

    @property
    def model(self) -> HookedModel:
        return self._get()[0]

    @property
    def edits(self) -> dict:
        return self._get()[1]

    def _get(self) -> tuple[HookedModel, dict]:
        if self._built is None:
            self._built = self.build()
        return self._built

    def release(self) -> None:
        """Forget the built model and edits (built again if used again)."""
        self._built = None

    @classmethod
    def of(cls, model: HookedModel, edits: dict, fingerprint: str, label: str, info: dict | None = None) -> Prepared:
        """A variant whose model is already in memory."""
        edits = dict(edits)
        return cls(fingerprint, label, model.tokenizer, lambda: (model, edits), dict(info or {}), (model, edits))


# ---- kinds ---------------------------------------------------------------------------------------

Loader = Callable[[str], HookedModel]
VARIANT_KINDS: dict[str, Callable[[Variant, Loader], Prepared]] = {}


def register_kind(name: str):
    def deco(fn: Callable[[Variant, Loader], Prepared]):
        VARIANT_KINDS[name] = fn
        return fn
    return deco


def prepare(variant: Variant, loader: Loader) -> Prepared:
    if variant.kind not in VARIANT_KINDS:
        raise SettingError(f"unknown variant kind {variant.kind!r}; known: {', '.join(VARIANT_KINDS)}")
    return VARIANT_KINDS[variant.kind](variant, loader)


@register_kind("model")
def _plain(variant: Variant, loader: Loader) -> Prepared:
    """A bundled/base model or any local model folder (fine-tuned or merged)."""
    model = loader(variant.model)
    return Prepared.of(model, {}, weights_fingerprint(model), variant.name)


@register_kind("knockout")
def _knockout(variant: Variant, loader: Loader) -> Prepared:
    """Mean ablation of heads/MLPs; means over the counterfactual prompts of a pairs file.

    Options: heads (list of [layer, head]), mlps (list of layers), data (pairs JSONL path), mean:
    "aligned" (the default: the knockout curves' and the transfer table's mean, per END-aligned
    position, the mean over all positions before those and for generated tokens) or "global" (one
    mean over all positions); keyheads.knockout says why the aligned one is the curves' definition.
    The mean is part of the fingerprint (so of every cache key), the info and a default label.
    """
    model = loader(variant.model)
    heads, mlps = heads_of(variant.opt("heads", [])), [int(m) for m in variant.opt("mlps", [])]
    if not heads and not mlps:
        raise SettingError("a knockout variant needs at least one head or MLP (--knockout L.H,... or "
                           "--knockout-mlps L,...)")
    data = variant.opt("data")
    if not data:
        raise SettingError("knockout needs counterfactual prompts: pass --knockout-data PAIRS.jsonl "
                           "(one JSON object per line with reference, counterfactual, answer)")
    mean = variant.opt("mean", DEFAULT_MEAN)
    check_mean(mean)
    prompts = read_counterfactuals(data)
    window = end_aligned_length(model, prompts) if mean == "aligned" else 0

    def build() -> tuple[HookedModel, dict]:
        ko = compute_means(model, prompts, heads=heads, mlps=mlps, mean=mean, progress=False)
        return model, ko.edits()

    spec = json.dumps({"heads": sorted(heads), "mlps": sorted(mlps), "data": file_sha256(Path(data)),
                       "mean": mean}, sort_keys=True)
    fp = short_sha(weights_fingerprint(model) + spec)
    info = {"knockout": {"heads": [h.to_json() for h in heads], "mlps": mlps, "pairs": str(data),
                         "counterfactual_prompts": len(prompts), "mean": mean, "aligned_positions": window}}
    label = variant.label or f"{variant.model} [knockout{', global mean' if mean == 'global' else ''}]"
    return Prepared(fp, label, model.tokenizer, build, info, end_window=window)


def read_counterfactuals(path: str | Path) -> list[str]:
    """The counterfactual prompts of a pairs file (read and checked by keyheads.data.pairs.read_pairs)."""
    return [pair.counterfactual for pair in read_pairs(path)]


@register_kind("adapter")
def _adapter(variant: Variant, loader: Loader) -> Prepared:
    """A `keyheads finetune` run folder (precise adapter, LoRA or full SFT) on its base model.

    Options: path (the run folder; default: the variant's model). The base model is copied, so the
    shared base row stays untouched; the table's Train speed and Tuned params come from the run.
    """
    folder = Path(variant.opt("path") or variant.model)
    info = read_info(folder)

    def private(name: str) -> HookedModel:
        if name != info["base_model"]:  # full SFT's own weights: no other row changes them
            return loader(name)
        base = loader(name)  # shared with other rows, so copied before the adapter changes it
        return HookedModel(copy.deepcopy(base.hf), base.tokenizer, name=base.name, source=base.source)

    weights = sorted(p for p in folder.rglob("*.safetensors") if "checkpoint" not in p.parts)
    fp = short_sha(info["base_fingerprint"] + "".join(file_sha256(p) for p in weights))
    extras = {"train_speed": f"{info['train']['samples_per_second']:.1f} sam./s",
              "tuned_params": human(info["tuned_params"]), "finetune": {k: info[k] for k in ("method", "components")
                                                                          if k in info}}
    # Full SFT saves its tokenizer beside its weights; the others are built on the base, loaded anyway.
    tokenizer = (load_tokenizer(folder / "model") if info["method"] == "full"
                 else loader(info["base_model"]).tokenizer)
    return Prepared(fp, variant.label or f"{info['base_model']} + {info['method']} SFT", tokenizer,
                    lambda: (load_finetuned(folder, private), {}), extras)
