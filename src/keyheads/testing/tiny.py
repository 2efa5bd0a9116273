"""Tiny models: a character-level tokenizer plus a 3-layer random transformer per family.

The configs live with the families (keyheads.models.families); this module only builds them.
"""
from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from ..errors import UnsupportedArchitecture
from ..models.families import TINY_CONFIGS
from ..models.model import HookedModel

# Every single digit is one token, as in Llama; words are spelt out character by character.
ALPHABET = list(string.digits + string.ascii_letters + " +-*/=<>@#%^.,?:'!\n")
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def char_tokenizer():
    vocab = {tok: i for i, tok in enumerate(SPECIALS + ALPHABET)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern=Regex("."), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>")
    return tok


# Every family file names its tiny models (families/base.py); a new family file adds its own here.
TINY_FAMILIES = tuple(TINY_CONFIGS)


def _config(family: str, vocab: int):
    if family not in TINY_CONFIGS:
        raise UnsupportedArchitecture(f"no tiny model {family!r}; known: {', '.join(TINY_FAMILIES)}")
    return TINY_CONFIGS[family](vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny_model(family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32) -> HookedModel:
    """A random 3-layer model of `family` with a character tokenizer (no download)."""
    tok = char_tokenizer()
    config = _config(family, vocab=len(tok))
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # norms start at exactly one (or zero for Gemma): perturb them so they matter
        for name, p in hf.named_parameters():
            if "norm" in name or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
    return HookedModel(hf, tok, name=f"tiny-{family}")
