"""A model's shape from its config alone: the config is read (no weights), the model is built on
the meta device (accelerate.init_empty_weights) and its parameters are counted per module."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import ModelNotFound
from ..models.bundled import BUNDLED
from ..models.families import Family, family_for
from ..models.loading import _resolve, cache_root, cached_folder


def load_config(name_or_path: str):
    """The transformers config of a bundled name, a .gguf file, a local folder or a hub id.

    A bundled model's config comes from its converted cache folder when there is one, else from its
    GGUF header (no de-quantisation); a GGUF file's from its header; anything else as load_model finds it.
    """
    if name_or_path in BUNDLED:
        folder = cached_folder(name_or_path)
        if (folder / "config.json").is_file():
            return AutoConfig.from_pretrained(folder)
        bundled = BUNDLED[name_or_path]
        config = _gguf_config(bundled.locate(cache_root()))
        if bundled.tied:  # conversion ties it back (loading.tie_embeddings)
            config.tie_word_embeddings = True
        return config
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file {path} does not exist")
        return _gguf_config(path)
    kind, location = _resolve(name_or_path)  # a folder or a hub id: nothing is converted
    try:
        return AutoConfig.from_pretrained(location)
    except (OSError, ValueError) as err:
        raise ModelNotFound(f"could not read the config of {name_or_path!r} ({err}). Offline? Use a bundled "
                            f"name ({', '.join(BUNDLED)}), a local folder or a .gguf file.") from None


def _gguf_config(path: Path):
    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts and sizes of a model (a tied unembedding counts once).

    Attributes:
        params: all parameters.
        layer_params: the largest decoder layer's parameters (the unit FSDP2 gathers).
        root_params: everything outside the decoder layers (embedding, unembedding, final norm).
        mlp_params: the largest MLP's parameters (precise + MLPs trains whole MLPs).
        q_o_params: one query head's rows of W_Q and columns of W_O (with its bias entries).
        kv_params: one key/value head's rows of W_K and W_V (with their bias entries).
        lora_params: LoRA parameters per unit of rank over all Q/K/V/O projections of all layers.
    """

    name: str
    model_type: str
    params: int
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    layer_params: int
    root_params: int
    mlp_params: int
    q_o_params: int
    kv_params: int
    lora_params: int

    @property
    def n_kv_groups(self) -> int:
        return self.n_layers * self.n_kv_heads

    def precise_params(self, heads: int) -> int:
        """Trained by precise SFT of `heads` heads (kv=group): an upper bound, every head in a K/V group of
        its own; exact when they are."""
        return heads * self.q_o_params + min(heads, self.n_kv_groups) * self.kv_params


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _in_out(module) -> tuple[int, int]:
    w = module.weight
    return (w.shape[0], w.shape[1]) if type(module).__name__ == "Conv1D" else (w.shape[1], w.shape[0])


def _bias_features(module) -> int:
    return 1 if getattr(module, "bias", None) is not None else 0


def shape_of(config, name: str = "") -> ModelShape:
    """Count the parameters of `config`'s model, built on the meta device (no memory, no weights)."""
    fam: Family = family_for(config.model_type)
    with init_empty_weights():
        hf = AutoModelForCausalLM.from_config(config)
    # init_empty_weights re-registers every parameter it sees set, which unties a tied unembedding; tie again
    hf.tie_weights()
    layers = list(hf.get_submodule(fam.layers))
    first = layers[0]
    hd, n_heads, n_kv = fam.head_dim(config), fam.n_heads(config), fam.n_kv_heads(config)
    if fam.qkv_proj is None:
        q, k, v = (first.get_submodule(p) for p in (fam.q_proj, fam.k_proj, fam.v_proj))
    else:
        q = k = v = first.get_submodule(fam.qkv_proj)
    o = first.get_submodule(fam.attn_out_proj)
    d_in = _in_out(q)[0]
    q_o = hd * (d_in + _bias_features(q)) + _in_out(o)[1] * hd
    kv = hd * (_in_out(k)[0] + _bias_features(k)) + hd * (_in_out(v)[0] + _bias_features(v))
    lora = sum(sum(_in_out(layer.get_submodule(p))) for layer in layers
               for p in ([fam.q_proj, fam.k_proj, fam.v_proj] if fam.qkv_proj is None else [fam.qkv_proj])
               + [fam.attn_out_proj])
    mlps = [_count(layer.get_submodule(fam.mlp)) for layer in layers]
    d_ff = max(_in_out(m)[1] for m in first.get_submodule(fam.mlp).modules() if hasattr(m, "weight")
               and getattr(m.weight, "ndim", 0) == 2)
    params = _count(hf)
    layer_params = [_count(layer) for layer in layers]
    return ModelShape(
        name=name, model_type=config.model_type, params=params, n_layers=len(layers), d_model=fam.d_model(config),
        d_ff=d_ff, n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd, vocab=hf.get_input_embeddings().weight.shape[0],
        tied=hf.get_output_embeddings().weight is hf.get_input_embeddings().weight,
        layer_params=max(layer_params), root_params=params - sum(layer_params), mlp_params=max(mlps),
        q_o_params=q_o, kv_params=kv, lora_params=lora)
