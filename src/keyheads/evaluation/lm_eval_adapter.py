"""Evaluate a keyheads variant with lm-evaluation-harness (optional; `pip install lm_eval[hf]`).

Importing this module registers the model type "keyheads" with lm-eval. It is an HFLM
whose model is the variant's transformers model with the variant's hooks (a knockout)
installed for the adapter's lifetime, so every lm-eval task sees the edited model.

    import lm_eval
    import keyheads.evaluation.lm_eval_adapter  # registers "keyheads"
    lm_eval.simple_evaluate(model="keyheads",
                            model_args="model=smollm2-135m,knockout=12.3;14.2,knockout_data=pairs.jsonl",
                            tasks=["gsm8k"])
    # a `keyheads finetune` run folder (precise adapter, LoRA or full SFT) on its base model:
    lm_eval.simple_evaluate(model="keyheads", model_args="adapter=runs/ft", tasks=["gsm8k"])

or pass ``--plugins keyheads.evaluation.lm_eval_adapter`` (lm-eval versions with plugins) and
``--model keyheads``. Heads are separated by ";" because lm-eval splits model_args at commas.
A knockout here uses the global mean (one mean over all positions; its label and info say so): lm-eval
scores a context and its continuation in one pass and generates through transformers, so the
position of END, from which the aligned mean of `keyheads eval` is placed, is not known to the hooks.
Nothing here is imported by keyheads itself, so lm-eval stays optional.
"""
from __future__ import annotations

from ..models.loading import MissingPackage

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError as err:  # keep the message actionable
    raise MissingPackage("the lm-eval adapter needs lm-evaluation-harness: `pip install lm_eval[hf]`") from err

from .. import models
from ..errors import SettingError
from ..heads import read_heads
from .variants import Variant, prepare


def variant_from_args(model: str, knockout: str | None = None, knockout_mlps: str | None = None,
                      knockout_data: str | None = None, kind: str | None = None, adapter: str | None = None,
                      **options) -> Variant:
    """lm-eval model_args -> a Variant: a fine-tuning run folder, a knockout, or the plain model."""
    if adapter:
        if knockout or knockout_mlps:
            raise SettingError("adapter= evaluates a fine-tuned run as it is; a knockout on top of it is not "
                               "supported: drop knockout= and knockout_mlps=")
        return Variant.make("adapter", adapter)
    if knockout or knockout_mlps:
        heads = read_heads(knockout.replace(";", ",")) if knockout else []
        mlps = [int(m) for m in str(knockout_mlps or "").replace(";", ",").split(",") if m.strip()]
        mean = options.pop("mean", "global")
        if mean != "global":
            raise SettingError("lm-eval knockouts use the global mean (the position of END is not known here): "
                               "drop mean=, or use `keyheads eval --knockout` for the aligned one")
        return Variant.make(kind or "knockout", model, heads=[list(h) for h in heads], mlps=mlps,
                            data=knockout_data, mean="global", **options)
    return Variant.make(kind or "model", model, **options)


@register_model("keyheads")
class KeyheadsLM(HFLM):
    """HFLM over a keyheads variant; extra keyword arguments go to HFLM (batch_size, max_length, ...)."""

    def __init__(self, model: str = "smollm2-135m", knockout: str | None = None, knockout_mlps: str | None = None,
                 knockout_data: str | None = None, kind: str | None = None, adapter: str | None = None,
                 device: str | None = None, dtype: str | None = None, **kwargs):
        variant = variant_from_args(model, knockout, knockout_mlps, knockout_data, kind, adapter)
        self.prepared = prepare(variant, lambda name: models.load_placed(name, device, dtype)[0])
        hooked = self.prepared.model
        super().__init__(pretrained=hooked.hf, tokenizer=hooked.tokenizer, **kwargs)
        # The hooks stay installed while this object lives; lm-eval calls the model many times.
        self._hooks = hooked.hooks(edit=self.prepared.edits)
        self._hooks.__enter__()

    def close(self) -> None:
        if getattr(self, "_hooks", None) is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None

    def __del__(self):
        self.close()
