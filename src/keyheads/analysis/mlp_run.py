"""The MLP step: MLP inputs and outputs against the unembedding of operands and answer, by layer."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import write_json
from ..log import logger
from ..models.model import HookedModel
from ..plotting import write_csv
from ..results.mlp import MLPCase, MLPResult
from ..runfolder import MLP_JSON
from . import mlp as mlpmod
from .common import answer_token, load_samples
from .settings import MLPSettings

DEFAULT_CASE_PREFIX = "1 + 2 = 3\n4 + 4 = 8\n6 + 1 = 7\n"


def case_prompt(samples) -> str:
    """'4 + 3 = ' with the few-shot prefix of the data's first 'A + B = ' prompt (the paper's case)."""
    for s in samples:
        if s.operands and "A" in s.operands and "B" in s.operands:
            tail = f"{s.operands['A']} + {s.operands['B']} ="
            stripped = s.prompt.rstrip()
            if stripped.endswith(tail):
                return stripped[: len(stripped) - len(tail)] + "4 + 3 = "
    return DEFAULT_CASE_PREFIX + "4 + 3 = "


def run_mlp(model: HookedModel, pairs: str | Path, out: str | Path, settings: MLPSettings, *,
            batch_size: int = 16, progress: bool = True) -> MLPResult:
    """The MLP probes over the pairs file `pairs` and the layer-by-layer case, written into `out`."""
    cfg, data, out = settings, str(pairs), Path(out)
    samples = load_samples(model, data, cfg.limit, cfg.seed)
    mlp_in, write = mlpmod.end_vectors(model, [s.prompt for s in samples], batch_size, progress)
    curves = mlpmod.curves_of(model, samples, mlp_in, write)
    # one row per distinct prompt: a prompt repeated in the pairs file (several counterfactuals of one reference)
    # would count its one value several times and narrow the verdict's bootstrap over prompts
    first: dict[str, int] = {}
    for i, sample in enumerate(samples):
        first.setdefault(sample.prompt, i)
    distinct = list(first.values())
    specific = mlpmod.answer_specific(model, write[distinct], [samples[i].answer_id for i in distinct])
    del mlp_in, write  # [n, L, d] each (a gigabyte at 7B and 1000 prompts): freed before the case and the figures
    means = {k: v.mean(0) for k, v in curves.items()}
    operand, answer = mlpmod.contrasts(means)
    tp = mlpmod.turning_points(operand, answer)
    mlpmod.plot_curves(curves, tp, out / "mlp_input_operands.png", out / "mlp_output_answer.png", model.name)

    prompt = cfg.case or case_prompt(samples)
    prompt, _ = answer_token(model, prompt, cfg.case_answer)
    names, cos = mlpmod.case_numbers(model, prompt)
    tops = mlpmod.top_numbers(names, cos)
    mlpmod.plot_case(names, cos, prompt, cfg.case_answer, out / "mlp_case.png")

    L = model.n_layers
    write_csv(
        out / "mlp_curves.csv",
        ["layer", *[f"{k}_mean" for k in mlpmod.CURVES], *[f"{k}_std" for k in mlpmod.CURVES]],
        [
            [l, *[float(means[k][l]) for k in mlpmod.CURVES], *[float(curves[k][:, l].std()) for k in mlpmod.CURVES]]
            for l in range(L)
        ],
    )
    result = MLPResult(
        model=model.name, data=data, n_samples=len(samples), read_point=mlpmod.mlp_read_point(model),
        curves={k: v.tolist() for k, v in means.items()}, operand_contrast=operand.tolist(),
        answer_contrast=answer.tolist(), turning_points=tp, rule=mlpmod.RULE,
        case=MLPCase(prompt=prompt, answer=cfg.case_answer, numbers=names, top3_per_layer=tops, cosine=cos.tolist()),
        answer_specific=specific.tolist())
    write_json(out / MLP_JSON, result.to_json())
    logger.info("wrote %s/%s, mlp_curves.csv, mlp_input_operands.png, mlp_output_answer.png, mlp_case.png", out,
                MLP_JSON)
    return result


def describe(result: MLPResult) -> str:
    """What the MLP probes found, for people: the curves by layer, the turning layers and the case."""
    c, operand, answer = result.curves, result.operand_contrast, result.answer_contrast
    tp, case = result.turning_points, result.case
    lines = [f"{result.model}: MLP probes at END over {result.n_samples} reference prompts "
             f"({result.read_point} as MLP_in)",
             "layer  cos(in,A)  cos(in,B)  cos(in,other)  operand  cos(write,C)  cos(write,other)  answer  "
             "top numbers in the case's MLP write"]
    for l in range(len(operand)):
        lines.append(f"{l:>5}  {c['in_A'][l]:>9.3f}  {c['in_B'][l]:>9.3f}  {c['in_other'][l]:>13.3f}  "
                     f"{operand[l]:>7.3f}  {c['write_C'][l]:>12.3f}  {c['write_other'][l]:>16.3f}  {answer[l]:>6.3f}  "
                     f"{' '.join(case.top3_per_layer[l])}")
    lines.append(f"start-inflection-end: {tp.text()} (the operand contrast climbs "
                 f"from layer {tp.start} and peaks at {tp.inflection}; the answer contrast peaks at {tp.end})")
    if result.answer_specific:
        d = np.asarray(result.answer_specific)
        later = [l for l in range(d.shape[1]) if 2 * l >= d.shape[1]]
        earlier = [l for l in range(d.shape[1]) if 2 * l < d.shape[1]]
        lines.append(f"answer-specific write (own answer minus the other prompts' answers), mean over "
                     f"{len(d)} prompts: earlier half {d[:, earlier].mean():.4f}, later half {d[:, later].mean():.4f}")
    lines.append(f"case {case.prompt.splitlines()[-1]!r} -> answer {case.answer}")
    return "\n".join(lines)
