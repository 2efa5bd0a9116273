"""A tiny LLaMA GGUF file, quantised as llama.cpp writes one, for tests of the GGUF conversion (and the witness's).

Its weights are seeded random numbers, its Q/K/V/O and MLP matrices quantised to Q8_0 (de-quantised by blocks of
32 along each row) and its norms kept in float32, beside a byte-level BPE tokenizer of 64 tokens. `unembedding`:
the file carries `output.weight` beside `token_embd.weight`, as llama.cpp writes a tied model whose unembedding it
quantises apart (keyheads.models.loading.tie_embeddings).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

LAYERS, WIDTH, HEADS, KV_HEADS, MLP, VOCAB = 2, 64, 4, 2, 96, 64


def write_tiny_gguf(path: Path, unembedding: bool = True, seed: int = 0) -> Path:
    import gguf  # noqa: PLC0415 -- optional: only GGUF conversion needs it

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(WIDTH)
    writer.add_feed_forward_length(MLP)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    tokens = [chr(ord("!") + i) for i in range(VOCAB - 4)] + ["!\"", "#$", "<s>", "</s>"]  # two merged pairs
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (VOCAB - 2) + [3, 3])
    writer.add_token_merges(["! \"", "# $"])
    writer.add_bos_token_id(VOCAB - 2)
    writer.add_eos_token_id(VOCAB - 1)

    def matrix(name: str, rows: int, cols: int) -> None:
        values = rng.standard_normal((rows, cols), dtype=np.float32) * 0.1
        writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32))

    head = WIDTH // HEADS
    matrix("token_embd.weight", VOCAB, WIDTH)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", WIDTH, WIDTH)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * head, WIDTH)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * head, WIDTH)
        matrix(f"blk.{i}.attn_output.weight", WIDTH, WIDTH)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", MLP, WIDTH)
        matrix(f"blk.{i}.ffn_up.weight", MLP, WIDTH)
        matrix(f"blk.{i}.ffn_down.weight", WIDTH, MLP)
    norm("output_norm.weight")
    if unembedding:
        matrix("output.weight", VOCAB, WIDTH)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
