"""Tiny models: a character-level tokenizer plus a 3-layer random transformer per family."""
from __future__ import annotations

import string

import torch

from ..models.model import HookedModel

# Every single digit is one token, as in Llama; words are spelt out character by character.
ALPHABET = list(string.digits + string.ascii_letters + " +-*/=<>@#%^.,?:'!\n")
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def char_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + ALPHABET)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern=Regex("."), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>")
    return tok


def _config(family: str, vocab: int):
    import transformers as tf

    common = dict(vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    llama_like = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      initializer_range=0.2, **common)
    if family == "llama":
        return tf.LlamaConfig(**llama_like)
    if family == "mistral":
        return tf.MistralConfig(sliding_window=None, **llama_like)
    if family == "qwen2":
        return tf.Qwen2Config(**llama_like)
    if family == "gemma3":
        return tf.Gemma3TextConfig(query_pre_attn_scalar=16, sliding_window=8,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   **llama_like)
    if family == "gpt2":
        return tf.GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=256, initializer_range=0.2,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    if family in ("gpt_neox", "gpt_neox_serial"):
        return tf.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                rotary_pct=0.5, max_position_embeddings=256, initializer_range=0.2,
                                use_parallel_residual=(family == "gpt_neox"), attention_dropout=0.0,
                                hidden_dropout=0.0, **common)
    raise ValueError(f"no tiny config for {family!r}; known: {', '.join(TINY_FAMILIES)}")


TINY_FAMILIES = ("llama", "mistral", "qwen2", "gemma3", "gpt2", "gpt_neox", "gpt_neox_serial")


def tiny_model(family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32) -> HookedModel:
    """A random 3-layer model of `family` with a character tokenizer (no download)."""
    from transformers import AutoModelForCausalLM

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
