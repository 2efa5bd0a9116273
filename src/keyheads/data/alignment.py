"""Tokenizer alignment: counterfactual words that tokenize like the reference's, and whether a
counterfactual's tokens line up with the reference's."""
from __future__ import annotations

from .pairs import span_tokens


class SameLength:
    """Pool values that tokenize like a given value in a given left context (cached per tokenizer)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, pool: str, values: list[str], reference: str, left: str) -> list[str]:
        key = (pool, reference, left)
        if key not in self.cache:
            n = lambda v: len(self.tokenizer(left + v, add_special_tokens=False)["input_ids"])  # noqa: E731
            target = n(reference)
            self.cache[key] = [v for v in values if v != reference and n(v) == target]
        return self.cache[key]


def aligned(ids, offsets, changed, cf_ids, cf_offsets, cf_changed) -> bool:
    """Same token count, replaced spans on the same tokens, every other token identical."""
    if len(ids) != len(cf_ids):
        return False
    free = set(range(len(ids)))
    for span, cf_span in zip(changed, cf_changed):
        toks = span_tokens(offsets, *span)
        if toks != span_tokens(cf_offsets, *cf_span):
            return False
        free -= set(toks)
    return all(ids[i] == cf_ids[i] for i in free)
