"""What keyheads needs to know about one model family: where its modules live.

A family is a small declarative record, in the spirit of pyvene's per-model mapping
files. Module paths are dotted attribute paths; layer-relative paths start from one
decoder layer. Adding a family means adding one file next to this one; the package finds it.

Each family file defines:
    FAMILY: the Family record below.
    TINY: {tiny model name: callable(**common) -> transformers config}, the configs of the tiny
        random models that keyheads.testing builds for the test-suite (``common`` holds the
        character tokenizer's vocabulary size and special token ids). Usually one entry named
        after the family; a variant worth testing on its own gets a second one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The size of every tiny test model, shared so that the families' tiny models stay comparable.
TINY_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  max_position_embeddings=256, initializer_range=0.2)


def _first_attr(config, names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


@dataclass(frozen=True)
class Family:
    """Module paths and config keys of one transformer family.

    Attributes:
        name: family name shown to users.
        model_types: values of ``config.model_type`` this family covers.
        layers: path from the CausalLM to the list of decoder layers.
        final_norm: path to the final norm applied before the unembedding (the
            unembedding itself is found with ``get_output_embeddings()``).
        attn: layer-relative path to the attention module (its output tuple holds the pattern).
        attn_out_proj: layer-relative path to the attention output projection; its *input*
            is the concatenation of the head outputs, [batch, pos, n_heads * head_dim].
        q_proj, k_proj, v_proj: layer-relative paths of separate projections, or None.
        qkv_proj: layer-relative path of a fused QKV projection, or None.
        qkv_layout: "concat" (q|k|v blocks, GPT-2) or "interleaved" (per head q,k,v, GPT-NeoX).
        post_attn_norm: norm applied to the attention output before it joins the
            residual stream (Gemma 2/3), or None.
        pre_mlp_norm: norm between the residual stream and the MLP.
        mlp: layer-relative path of the MLP module.
        post_mlp_norm: norm applied to the MLP output before it joins the residual (Gemma), or None.
        parallel_residual: callable(config) -> bool; True when attention and MLP both read
            the block input (GPT-NeoX's use_parallel_residual).
        conv1d: True when projections are GPT-2 Conv1D modules (weight is [in, out]).
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    final_norm: str
    attn: str
    attn_out_proj: str
    pre_mlp_norm: str
    mlp: str
    q_proj: str | None = None
    k_proj: str | None = None
    v_proj: str | None = None
    qkv_proj: str | None = None
    qkv_layout: str = "concat"
    post_attn_norm: str | None = None
    post_mlp_norm: str | None = None
    parallel_residual: Callable[[object], bool] = field(default=lambda config: False)
    conv1d: bool = False

    # ---- dimensions, read from the HF config -------------------------------------------
    @staticmethod
    def n_layers(config) -> int:
        return int(_first_attr(config, ["num_hidden_layers", "n_layer", "num_layers"]))

    @staticmethod
    def n_heads(config) -> int:
        return int(_first_attr(config, ["num_attention_heads", "n_head"]))

    @classmethod
    def n_kv_heads(cls, config) -> int:
        return int(_first_attr(config, ["num_key_value_heads"], cls.n_heads(config)))

    @staticmethod
    def d_model(config) -> int:
        return int(_first_attr(config, ["hidden_size", "n_embd", "d_model"]))

    @classmethod
    def head_dim(cls, config) -> int:
        explicit = getattr(config, "head_dim", None)
        if explicit:
            return int(explicit)
        return cls.d_model(config) // cls.n_heads(config)

    # ---- per-head slices, for fine-tuning single heads ------------------------------------
    def kv_head_of(self, config, head: int) -> int:
        """The key/value head that query head `head` reads (grouped-query attention)."""
        return head // (self.n_heads(config) // self.n_kv_heads(config))

    def qkv_rows(self, config, kind: str, head: int) -> tuple[str, range]:
        """(layer-relative module path, output features) of head `head`'s block of W_Q, W_K or W_V.

        `kind` is "q", "k" or "v"; for "k" and "v", `head` is a key/value head. The features are
        rows of a Linear weight, columns of a Conv1D weight, and entries of the bias.
        """
        if kind not in ("q", "k", "v"):
            raise ValueError(f"kind must be q, k or v, got {kind!r}")
        hd = self.head_dim(config)
        if self.qkv_proj is None:
            path = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj}[kind]
            if path is None:  # a family record that names neither layout is a bug in its file
                raise TypeError(f"family {self.name} names neither qkv_proj nor {kind}_proj")
            return path, range(head * hd, (head + 1) * hd)
        block = "qkv".index(kind)
        if self.qkv_layout == "interleaved":  # GPT-NeoX: [head][q|k|v][head_dim]
            start = (3 * head + block) * hd
        else:  # GPT-2: [q heads | k heads | v heads]
            start = block * self.n_heads(config) * hd + head * hd
        return self.qkv_proj, range(start, start + hd)

    def o_cols(self, config, head: int) -> tuple[str, range]:
        """(layer-relative path, input features) of head `head`'s block of W_O."""
        hd = self.head_dim(config)
        return self.attn_out_proj, range(head * hd, (head + 1) * hd)
