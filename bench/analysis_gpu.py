"""Knockout curves at 7B scale on one GPU (`python -m bench.analysis --gpu`): time and peak memory
against the FLOP floor.

A randomly initialised model of LLaMA-2-7B's shape in bf16 (timing needs no weights) with a
character tokenizer. 256 prompts shaped like the study's data: four templates, each behind its
own three-example prefix ("12+34=46\\n..."), 64 prompts per template whose own tokens are a
two-operand sum; as many counterfactual prompts for the means. The curves go to k = 32 with 5
random orders (1 + 32 + 160 knockout sets), heads ranked at random (a ranking changes which
heads, not how much work). The floor is the work the batched passes must do (bench/floors.py's
count, as bench/analysis.py takes it) at the GPU's measured bf16 matrix-multiply rate.
"""
from __future__ import annotations

import datetime
import random
import time

import torch

DEVICE = "cuda"
TEMPLATES = ["{a}+{b}=", "{a} plus {b} is ", "sum {a} {b}: ", "{a} and {b} make "]


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for t, template in enumerate(TEMPLATES):
        shots = "".join(template.format(a=x, b=y) + f"{x + y}\n"
                        for x, y in ((12 + t, 34), (51, 7 + t), (23, 45 + t)))
        out += [shots + template.format(a=rng.randint(10, 99), b=rng.randint(10, 99)) for _ in range(n // 4)]
    return out


def main(args) -> list[str]:
    import transformers as tf

    from bench.finetune import SHAPES
    from bench.floors import gpu_matmul_rate, knockout_flops
    from keyheads.analysis.common import all_heads
    from keyheads.analysis.knockout_curves import CurveSettings, curve_sets, knockout_curves
    from keyheads.analysis.passes import EndPasses
    from keyheads.knockout import compute_means
    from keyheads.models.model import HookedModel
    from keyheads.models.prompt_set import PromptSet
    from keyheads.testing import char_tokenizer

    torch.manual_seed(0)
    config = tf.LlamaConfig(max_position_embeddings=4096, **SHAPES["llama2-7b"])
    with torch.device(DEVICE):
        hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = HookedModel(hf, char_tokenizer(), name="random llama2-7b")
    refs, cfs = prompts(args.prompts, 0), prompts(args.prompts, 1)
    answers = [model.tokens(str(random.Random(i).randint(0, 9)))[0] for i in range(len(refs))]
    heads = all_heads(model)
    ranked = random.Random(2).sample(heads, len(heads))
    cfg = CurveSettings(k=args.k, seeds=args.seeds, seed=0)
    rate = gpu_matmul_rate(model.d_model, config.intermediate_size, torch.bfloat16)
    with torch.inference_mode():
        full = compute_means(model, cfs, heads=heads, batch_size=args.batch_size, progress=False)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        set_ = PromptSet(model, refs, args.batch_size)
        knockout_curves(model, set_, answers, full, ranked, heads, cfg, progress=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated()
        engine = EndPasses(model, set_, full)  # the same passes, counting their work
        engine.logits(curve_sets(ranked, heads, cfg)[0], lambda *_: None)
    need = knockout_flops(model, engine.work)
    floor = need / rate
    sizes = sorted(len(g.index) for g in set_.groups)
    return [
        f"- date: {datetime.date.today()}; command: `python -m bench.analysis --gpu --prompts {args.prompts} "
        f"--k {args.k} --seeds {args.seeds}`; {torch.cuda.get_device_name()}; torch {torch.__version__}",
        f"- model: randomly initialised llama2-7b shape, bf16, character tokenizer; {len(refs)} prompts of "
        f"{len(TEMPLATES)} templates in {len(set_.groups)} groups (members {sizes}); "
        f"{len(curve_sets(ranked, heads, cfg)[0])} knockout sets (none, k = 1..{args.k}, {args.seeds} random "
        f"orders)",
        f"- knockout curves (batched END-only passes): **{seconds:.2f} s**; work {need / 1e12:.2f} TFLOP at the "
        f"measured {rate / 1e12:.0f} TFLOP/s: floor {floor:.2f} s; **time / floor = {seconds / floor:.2f}** "
        "(target <= 1.5)",
        f"- peak GPU memory during the curves: {peak / 2**30:.1f} GiB, of which {base / 2**30:.1f} GiB were the "
        "weights and the means before they began",
    ]
