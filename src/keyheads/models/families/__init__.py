"""The registry of supported model families: one module per family."""
from __future__ import annotations

from . import gemma3, gpt2, gpt_neox, llama, mistral, qwen2
from ...errors import UnsupportedArchitecture
from .base import Family

FAMILIES: tuple[Family, ...] = tuple(
    m.FAMILY for m in (llama, mistral, qwen2, gemma3, gpt2, gpt_neox)
)




def family_for(model_type: str) -> Family:
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    supported = ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES)
    raise UnsupportedArchitecture(
        f"model_type {model_type!r} is not supported. Supported families: {supported}. "
        "A new family is one file in keyheads/models/families/."
    )


__all__ = ["FAMILIES", "Family", "family_for", "UnsupportedArchitecture"]
