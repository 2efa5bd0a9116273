"""A real run folder, made once per session by calling each stage on a tiny model (seconds), and
helpers to read the rendered page back.

The stages are called directly rather than through the pipeline, so these tests depend only on
what each stage writes, which is all the report reads. Reading the page back is in page.py.
"""
import platform
import time
from pathlib import Path

import pytest
import torch

from keyheads.io import file_sha256, write_json
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows

FINETUNES = {  # variant folder -> (method, top-k heads, MLP layers)
    "precise-top3": ("precise", 3, 0),
    "precise-top1-mlp": ("precise", 1, 1),
    "full": ("full", 0, 0),
}


def _loader(base):
    """Base models by name (shared), full-SFT model folders by path, as the evaluator's loader does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from keyheads.models.model import HookedModel

    def load(name: str):
        if name == base.name:
            return base
        return HookedModel(AutoModelForCausalLM.from_pretrained(name), AutoTokenizer.from_pretrained(name),
                           name=name, source=name)
    return load


def _record(out: Path, stage: str, seconds: float, outputs: list[str], settings: dict) -> None:
    """stages/<stage>.json as the pipeline writes it."""
    import transformers

    import keyheads

    files = {rel: file_sha256(out / rel) for rel in outputs if (out / rel).is_file()}
    write_json(out / "stages" / f"{stage.replace('/', '--')}.json", {
        "stage": stage, "signature": f"{abs(hash(stage)):016x}", "settings": settings,
        "inputs": {"pairs.jsonl": file_sha256(out / "pairs.jsonl")} if stage != "data" else {},
        "outputs": files, "seconds": round(seconds, 3), "finished": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
        "versions": {"keyheads": keyheads.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
        "machine": {"platform": platform.platform(), "cpus": 2}})


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory, tiny_data):
    from keyheads.analysis.attention_run import run_attention
    from keyheads.analysis.knockout_run import run_knockout
    from keyheads.analysis.mlp_run import run_mlp
    from keyheads.analysis.settings import AttentionSettings, KnockoutSettings, MLPSettings
    from keyheads.components import Components
    from keyheads.effects import Effects
    from keyheads.evaluation import EvalSettings, Variant, evaluate
    from keyheads.finetune import Example, FinetuneSettings, finetune
    from keyheads.models.fingerprint import base_fingerprint
    from keyheads.patching import IdentifySettings, identify
    from keyheads.selection import HeadChoice

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models are fastest on one thread
    try:
        out = tmp_path_factory.mktemp("run")
        model = tiny_model("llama")
        fingerprint = base_fingerprint(model)
        write_json(out / "model.json", {"name": model.name, "source": model.source, "fingerprint": fingerprint,
                                        "n_layers": model.n_layers, "n_heads": model.n_heads, "dtype": "torch.float32",
                                        "device": "cpu"})
        config = {"model": model.name, "out": str(out), "task": "addition", "n": 16, "method": "path",
                  "metric": "relative-logit", "top_k": 3, "knockout_k": 4, "seeds": 2, "seed": 0, "batch_size": 8}
        write_json(out / "config.json", config)
        t = time.perf_counter()
        pairs = write_rows(out / "pairs.jsonl", make_rows(16))
        _record(out, "data", time.perf_counter() - t, ["pairs.jsonl"],
                {"model": model.name, "fingerprint": fingerprint})

        t = time.perf_counter()
        found = identify(model, pairs, IdentifySettings(top_k=3), out / "identify", batch_size=8, progress=False)
        _record(out, "identify", time.perf_counter() - t, ["identify/effects.json", "identify/key_heads.json"], config)
        heads, effects = tuple(found.key_heads.heads_ranked), str(out / "identify" / "effects.json")
        sel = HeadChoice.of(heads, effects)
        for stage, call in (
                ("knockout", lambda: run_knockout(
                    model, pairs, out / "knockout", sel, KnockoutSettings(k=4, seeds=2, limit=None, transfer_n=4),
                    data_dir=str(tiny_data), batch_size=8, progress=False)),
                ("attention", lambda: run_attention(model, pairs, out / "attention", sel,
                                                    AttentionSettings(limit=None), batch_size=8, progress=False)),
                ("mlp", lambda: run_mlp(model, pairs, out / "mlp", MLPSettings(limit=None), batch_size=8,
                                        progress=False))):
            t = time.perf_counter()
            call()
            assert not list((out / stage).glob("*.partial.*")), "a finished stage leaves no partial results"
            _record(out, stage, time.perf_counter() - t, [f"{stage}/{stage}.json"], config)

        examples = [Example(r["reference"], r["answer"]) for r in make_rows(4)]
        for name, (method, k, mlps) in FINETUNES.items():
            t = time.perf_counter()
            comps = Components.select(Effects.load(effects), top_k=k, n_mlps=mlps) if method == "precise" else None
            cfg = FinetuneSettings(method=method, max_steps=2, optimizer_batch_size=2, micro_batch_size=2,
                                   save_every=0, lr=1e-2)
            finetune(tiny_model("llama"), examples, cfg, out / "finetune" / name, comps, data_name="tiny",
                     progress=False)
            _record(out, f"finetune/{name}", time.perf_counter() - t, [f"finetune/{name}/finetune.json"],
                    cfg.to_json())

        t = time.perf_counter()
        variants = [Variant.make("model", model.name),
                    Variant.make("knockout", model.name, label=f"{model.name} - 3 key heads", heads=heads,
                                 data=str(pairs))]
        variants += [Variant.make("adapter", str(out / "finetune" / name), label=f"{model.name} + {name}")
                     for name in FINETUNES]
        evaluate(variants, EvalSettings(benchmarks=("addsub", "mmlu"), limit=2, few_shot=1, max_new_tokens=3),
                 out / "eval", loader=_loader(model), data_dir=str(tiny_data), batch_size=4,
                 cache_dir=str(out.parent / "eval-cache"), progress=False)
        _record(out, "eval", time.perf_counter() - t, ["eval/results.json"], {"benchmarks": ["addsub", "mmlu"]})
        return out
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def report(run_folder):
    from keyheads.report.html import write_html_report

    return write_html_report(run_folder)
