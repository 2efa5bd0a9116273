"""The score of a learning-rate grid point: the mean cross-entropy per completion token on validation examples,
the quantity training lowers, measured on examples no variant trains on (lower is better)."""
from __future__ import annotations

import torch

from ..models.model import HookedModel
from .data import Example, collate, tokenize
from .train import completion_loss_sum


def validation_loss(model: HookedModel, examples: list[Example], max_length: int, batch_size: int = 8) -> float:
    """Mean cross-entropy of every completion token of `examples` given the tokens before it."""
    items = tokenize(model.tokenizer, examples, max_length)
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(items), batch_size):
            batch = collate(items[start:start + batch_size], pad, model.device)
            logits = model.hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            total += float(completion_loss_sum(logits, batch["labels"]))
            tokens += int((batch["labels"][:, 1:] != -100).sum())
    return total / tokens
