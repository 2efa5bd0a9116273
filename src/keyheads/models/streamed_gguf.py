"""De-quantise a GGUF file into a float32 safetensors folder one tensor at a time.

transformers' GGUF loading builds the whole float32 model in memory, de-quantising every tensor at once, before
save_pretrained writes it: about 1.5x the float32 model at its peak (8.7 GiB for Qwen2.5-1.5B), in the one
process of a launch that converts. Here the file's layout is known before any weight is read (every tensor is
float32, its shape is in the GGUF header), so the safetensors header is written first and each tensor after it,
de-quantised a few rows at a time straight into the file: the peak is the runtime, the tokenizer and a block of
rows. The files are the ones save_pretrained writes, byte for byte (tests/models/test_loading.py compares them):
the same header (safetensors orders tensors by name when they share a dtype), the same values (the rows are
de-quantised by gguf's own code and re-arranged by transformers' own tensor processor), the same config, generation
config and tokenizer files. So every fingerprint of a converted model stays what it was.

Only the tensor processors that act on each tensor alone and row by row are streamed (STREAMED: the plain one,
LLaMA's, which re-orders the rows of Q and K within each head and so gets those two whole, and Gemma's, which
shifts the norms); a family whose processor splits or merges tensors (GPT-2, Bloom, the mixtures of experts) is
converted by transformers whole, as before (keyheads.models.loading).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    Gemma2TensorProcessor,
    LlamaTensorProcessor,
    TensorProcessor,
    get_gguf_hf_weights_map,
    read_field,
)

STREAMED = (TensorProcessor, LlamaTensorProcessor, Gemma2TensorProcessor)
WHOLE = (".attn_q.", ".attn_k.")  # LLaMA's processor re-orders these rows within each head: never split them
BLOCK_BYTES = 32 << 20  # de-quantised rows written at a time


class StreamedModel:
    """A GGUF file's model as keyheads.models.loading saves it (`config`, `save_pretrained`), its weights
    de-quantised only as they are written."""

    def __init__(self, config, sources: dict, processor: TensorProcessor):
        self.config, self.sources, self.processor = config, sources, processor

    @classmethod
    def of(cls, gguf: Path, tied: bool) -> StreamedModel | None:
        """The file's model, or None where it cannot be streamed (its architecture's tensor processor splits or
        merges tensors, or the file lacks a tensor the model has): transformers then converts it whole. `tied`:
        the embedding takes the unembedding's values and is the one matrix saved (loading.tie_embeddings)."""
        from gguf import GGUFReader  # noqa: PLC0415 -- optional: only GGUF conversion needs it

        reader = GGUFReader(str(gguf))  # parsed once for transformers' calls too (loading._one_gguf_reader)
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config.tie_word_embeddings = config.tie_word_embeddings or tied
        architecture = read_field(reader, "general.architecture")[0]
        processing = TENSOR_PROCESSORS[architecture] if architecture in TENSOR_PROCESSORS else TensorProcessor
        processor = processing(config=config.to_dict())  # the streamed ones read the head counts, named as HF's
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        sources = _sources(skeleton, reader, processor, tied) if type(processor) in STREAMED else None
        # what save_pretrained changes in the config it writes: the model's class and dtype
        config.architectures, config.dtype = [type(skeleton).__name__], torch.float32
        return cls(config, sources, processor) if sources is not None else None

    def save_pretrained(self, folder: Path, safe_serialization: bool = True) -> None:
        """model.safetensors, config.json and generation_config.json, as transformers' save_pretrained writes them."""
        _write_weights(Path(folder) / "model.safetensors", self.sources, self.processor)
        self.config.save_pretrained(folder)
        GenerationConfig.from_model_config(self.config).save_pretrained(folder)


def _sources(skeleton, reader, processor: TensorProcessor, tied: bool) -> dict | None:
    """{name save_pretrained gives a tensor: the GGUF tensor it is read from}, by name (the file's order); None
    when the file lacks one. A tensor shared by two names (tied embeddings) is saved under the first; tied, that one
    is read from the unembedding's GGUF tensor where the file has one (quantised more finely)."""
    params = skeleton.state_dict(keep_vars=True)
    first: dict[int, str] = {}
    for name, tensor in params.items():
        first.setdefault(id(tensor), name)
    saved = set(first.values())
    to_name = get_gguf_hf_weights_map(skeleton, processor)
    embedding = first[id(skeleton.get_input_embeddings().weight)]
    # by its module: tied, the unembedding's tensor is the embedding's, and its first name the embedding's
    unembedding = next(n for n, m in skeleton.named_modules() if m is skeleton.get_output_embeddings()) + ".weight"
    tensors = {to_name[t.name]: t for t in reader.tensors if t.name in to_name}
    read_from = {name: name for name in saved} | ({embedding: unembedding} if tied and unembedding in tensors else {})
    out = {name: tensors[read_from[name]] for name in sorted(saved) if read_from[name] in tensors}
    return out if len(out) == len(saved) else None


def _shape(tensor) -> list[int]:
    return [int(n) for n in reversed(tensor.shape)]  # GGUF lists dimensions fastest first


def _write_weights(path: Path, sources: dict, processor: TensorProcessor) -> None:
    """safetensors' own layout: the header's length, the JSON header (the metadata, then each tensor by name with
    its offsets in turn) padded with spaces to 8 bytes, then the data in the header's order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in sources.items():
        size = 4 * int(np.prod(_shape(tensor)))
        header[name] = {"dtype": "F32", "shape": _shape(tensor), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for tensor in sources.values():
            for block in _blocks(tensor, processor):
                f.write(np.ascontiguousarray(block, dtype="<f4").data)


def _blocks(tensor, processor: TensorProcessor):
    """The GGUF tensor de-quantised and processed as transformers does, a block of rows at a time."""
    from gguf import dequantize  # noqa: PLC0415 -- optional: only GGUF conversion needs it

    shape = _shape(tensor)
    whole = len(shape) < 2 or any(w in tensor.name for w in WHOLE)
    step = shape[0] if whole else max(1, BLOCK_BYTES // (4 * int(np.prod(shape[1:]))))
    for start in range(0, shape[0], step):
        weights = dequantize(tensor.data[start:start + step], tensor.tensor_type).reshape(-1, *shape[1:])
        yield processor.process(weights=weights, name=tensor.name).weights
