"""Tiny random-initialised models of every supported family, built offline from local configs.

Used by the test-suite and by users who want to try keyheads without a real model.
"""
from .tiny import TINY_FAMILIES, char_tokenizer, tiny_model

__all__ = ["TINY_FAMILIES", "char_tokenizer", "tiny_model"]
