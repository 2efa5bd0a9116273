"""Effects: what path patching measured for every head and MLP, as stored in effects.json.

The data type lives below the patching code that computes it, so that choosing heads
(keyheads.components), the analyses and the report read it without importing the patching machinery; it sits
below the run folder too, whose `effects_record` reads identify/effects.json as one.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from . import circuits
from .errors import BadFile, MissingFile
from .heads import Head
from .io import atomic_write_text, read_json, write_json

PAPER_THRESHOLD = -0.05  # the paper's key heads: "logit change exceeding -5%"


@dataclass
class Effects:
    """Mean effect of patching each head and MLP, over the samples that count.

    heads: [layers][heads] mean effects; mlps: [layers]; *_sem: standard errors.
    """

    metric: str
    method: str
    model: str
    n_samples: int
    n_excluded: int
    data_sha256: str | None  # of the pairs file (None in files that did not record it)
    heads: list[list[float]]
    mlps: list[float]
    heads_sem: list[list[float]] = field(default_factory=list)  # empty in files that did not record them
    mlps_sem: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Any) -> Effects:
        """An effects.json's content; a field missing or of the wrong type is a ValueError naming it (pydantic's
        ValidationError). Files from before the standard errors were saved read with none."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        for key in ("heads", "mlps", "metric"):
            if key not in data:
                raise ValueError(f"no {key!r} field (expected the effects.json written by `keyheads identify`)")
        shape = np.shape(data["heads"])
        if len(shape) != 2:
            raise ValueError(f"'heads' must be a list of per-layer lists of numbers, got shape {shape}")
        return _ADAPTER.validate_python({"data_sha256": None, **data})

    @classmethod
    def load(cls, path, model=None) -> Effects:
        """Read an effects.json, or the node scores of a circuit graph file (keyheads.circuits); with `model`,
        check that its layers x heads match the model's."""
        path = Path(path)
        if not path.is_file():
            raise MissingFile(f"{path} does not exist (it is written by `keyheads identify`)")
        try:
            data = circuits.load_graph_file(path) if path.suffix.lower() == ".pt" else read_json(path)
            if circuits.is_graph(data):  # a MIB / EAP-IG circuit with node (or edge) scores
                data = circuits.effects_fields(circuits.read_graph(data))
            effects = cls.from_json(data)
        except ValidationError as err:
            raise BadFile(f"{path}: {err.error_count()} field(s) of the wrong type or missing, the first "
                          f"{'.'.join(map(str, err.errors()[0]['loc']))}: {err.errors()[0]['msg']} (expected the "
                          "effects.json written by `keyheads identify`)") from None
        except ValueError as err:
            raise BadFile(f"{path}: {err}") from None
        shape = np.shape(effects.heads)
        if model is not None and shape != (model.n_layers, model.n_heads):
            raise BadFile(f"{path}: effects are for {shape[0]} layers x {shape[1]} heads but {model.name} has "
                             f"{model.n_layers} x {model.n_heads}; was it made with another model "
                             f"(its 'model' field says {effects.model!r})?")
        return effects

    def effect(self, head: Head) -> float:
        return float(self.heads[head[0]][head[1]])

    def ranked(self) -> list[Head]:
        """Every (layer, head), most negative effect first; unmeasured (NaN) last; ties by position."""
        def key(lh):
            v = self.effect(lh)
            return (math.isnan(v), 0.0 if math.isnan(v) else v, lh)
        return sorted((Head(l, h) for l, row in enumerate(self.heads) for h in range(len(row))), key=key)

    def write(self, path: Path) -> None:
        """effects.json at `path` (keyheads.runfolder names it) and effects.csv beside it."""
        write_json(path, self.to_json())
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["component", "layer", "head", "label", "effect", "sem", "metric", "method"])
        def sem(values: list, *at: int) -> str:  # blank where the file recorded none (a circuit's node scores)
            for i in at:
                if i >= len(values):
                    return ""
                values = values[i]
            return f"{values:.8g}"

        for layer, row in enumerate(self.heads):
            for head, value in enumerate(row):
                w.writerow(["head", layer, head, f"{layer}.{head}", f"{value:.8g}", sem(self.heads_sem, layer, head),
                            self.metric, self.method])
        for layer, value in enumerate(self.mlps):
            w.writerow(["mlp", layer, "", f"mlp{layer}", f"{value:.8g}", sem(self.mlps_sem, layer),
                        self.metric, self.method])
        atomic_write_text(path.with_name("effects.csv"), buf.getvalue())


_ADAPTER = TypeAdapter(Effects)
