"""The whole study on one model, stage by stage, into one run folder:

    pairs.jsonl -> identify/ (effects, key heads) -> identify/<set>/ (also_identify: the same on more pairs)
    -> knockout/, attention/, mlp/, finetune/<variant>/ -> eval/ -> report.html

Each stage reads what the previous ones wrote (the key heads only from identify/key_heads.json)
and records what it did in stages/<name>.json; `keyheads.stages` re-runs exactly the stages
whose settings or inputs changed. `keyheads demo` runs it on the bundled model with small sizes,
`keyheads run [CONFIG.yaml]` with any model and sizes.

Started by `torchrun` or `accelerate launch`, every process loads the model onto its own device;
identify, knockout, fine-tuning and eval share their work out over the processes, the other
stages run on the main process while the rest wait, and only the main process writes and prints.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from . import distributed, models
from .analysis.attention_run import describe as describe_attention
from .analysis.attention_run import run_attention
from .analysis.knockout_run import describe as describe_knockout
from .analysis.knockout_run import run_knockout
from .analysis.mlp_run import describe as describe_mlp
from .analysis.mlp_run import run_mlp
from .components import Components
from .config.run import ALSO_IDENTIFY, VARIANT, RunSettings
from .data.benchmarks import data_dir_from
from .data.benchmarks import load as load_benchmark
from .data.generate import pairs_for
from .data.pairs import Pair, write_pairs
from .data.settings import WORD_PROBLEMS
from .data.templates import TASKS
from .data.wordproblems import word_problem_pairs
from .errors import NothingCorrect, SettingError
from .evaluation import Variant, evaluate
from .finetune import describe as describe_training
from .finetune import finetune, load_examples
from .finetune.parallel import check_setup
from .finetune.settings import FinetuneSection, FinetuneSettings
from .io import read_json, write_json
from .log import logger
from .mean import DEFAULT_MEAN, KnockoutMean
from .models.fingerprint import base_fingerprint
from .patching import describe as describe_effects
from .patching import identify, identify_from
from .patching.from_circuit import scoreless
from .report.html import write_html_report
from .results.run import ModelInfo
from .runfolder import RunFolder
from .section import Section
from .selection import ComponentChoice, HeadChoice
from .stages import Runner, Stage

STAGE_GROUPS = ("data", "identify", "knockout", "attention", "mlp", "finetune", "eval", "report")
PAIRS, KEY_HEADS, EFFECTS = RunFolder.PAIRS, RunFolder.KEY_HEADS, RunFolder.EFFECTS


def key_heads(folder: RunFolder | Path) -> Components:
    """The key heads, from the one file that defines them."""
    return Components.read_key_heads(RunFolder.of(folder).key_heads)


def build_stages(cfg: RunSettings, folder: RunFolder | Path, get_model, progress: bool = True,
                 release_model: Callable[[], None] = lambda: None) -> list[Stage]:
    """Every stage of `cfg` in order; `get_model()` loads the analysis model on first use and `release_model()`
    lets it go. A stage's signature is the settings its step is given, whole, and what the whole run shares
    (the model)."""
    run = RunFolder.of(folder)
    model_key = {"model": cfg.model, "dtype": cfg.dtype}
    def section(part: Section) -> dict:  # the YAML's keys
        return part.to_json()

    stages = [
        Stage("data", {**model_key, **section(cfg.data)}, [], [PAIRS], lambda: _data(cfg, run, get_model(), progress)),
        Stage("identify", {**model_key, **section(cfg.identify), **_circuit_key(cfg)}, [PAIRS], [RunFolder.IDENTIFY],
              lambda: _identify(cfg, run, get_model(), progress), spread=True,
              resume=[f"{RunFolder.IDENTIFY}/per_sample*.npz"],  # one checkpoint per process
              keep=[RunFolder.also_identify_rel(name) for name in ALSO_IDENTIFY]),  # the identify/NAME stages' own
        *[_also_identify_stage(cfg, run, name, model_key, section(cfg.data), section(cfg.identify), get_model, progress)
          for name in cfg.also_identify],
        # a step's settings are passed whole, so the signature is exactly what reaches the step
        Stage("knockout", {**model_key, **section(cfg.knockout), "data_dir": cfg.data_dir},
              [PAIRS, KEY_HEADS, EFFECTS], [RunFolder.KNOCKOUT], lambda: _knockout(cfg, run, get_model(), progress),
              spread=True),
    ]
    if cfg.data.arithmetic:  # both read the operands and the operator, which a task beyond arithmetic has not
        stages += [
            Stage("attention", {**model_key, **section(cfg.attention)}, [PAIRS, KEY_HEADS, EFFECTS],
                  [RunFolder.ATTENTION], lambda: _attention(cfg, run, get_model(), progress)),
            Stage("mlp", {**model_key, **section(cfg.mlp)}, [PAIRS], [RunFolder.MLP],
                  lambda: _mlp(cfg, run, get_model(), progress)),
        ]
    train = train_settings(cfg)
    grids = {family: rates for family in dict.fromkeys(map(rate_family, cfg.variants))
             if (rates := rate_grid(cfg, family))}
    for family, rates in grids.items():  # each rate of a family's grid, before the variants that choose from it
        for lr in rates:
            def grid(family: str = family, lr: float = lr) -> str:
                release_model()
                return grid_point(cfg, run, family, lr, run.root / grid_rel(family, lr), progress)

            stages.append(Stage(f"finetune/grid/{family}/{lr:g}", {**train, "variant": family, "lr": lr,
                                                                    "grid_fraction": cfg.finetune.grid_fraction},
                                [KEY_HEADS, EFFECTS] if family.startswith("precise") else [],
                                [grid_rel(family, lr)], grid, spread=True))
    for variant in cfg.variants:
        extra: dict[str, object] = {"mlps": cfg.finetune.mlps} if variant.endswith("+mlp") else {}
        inputs = [KEY_HEADS, EFFECTS] if variant.startswith(("precise", "random")) else []
        chosen_from = rate_grid(cfg, rate_family(variant))
        if chosen_from:  # its rate is the grid's choice: the grid's results are its inputs
            extra["lr_grid"] = chosen_from
            inputs += [f"{grid_rel(rate_family(variant), lr)}/{GRID_JSON}" for lr in chosen_from]
        elif (given := given_lr(cfg, rate_family(variant))) is not None:  # a rate chosen elsewhere
            extra["lr"] = given
        elif (elsewhere := rate_elsewhere(cfg, variant)) is not None:  # its choice and the losses it chose by
            extra.update(elsewhere.settings())

        def train_variant(v: str = variant) -> str:
            release_model()  # training loads its own copy: the analysis model is not held beside it
            return _finetune(cfg, run, v, progress)

        stages.append(Stage(f"finetune/{variant}", {**train, "variant": variant, **extra}, inputs,
                            [RunFolder.finetune_rel(variant)], train_variant, spread=True))
    if cfg.eval.benchmarks:
        # the knockout row takes the run's one mean, the knockout section's
        stages.append(Stage("eval", {**model_key, **section(cfg.eval), "mean": cfg.knockout.mean,
                                     "data_dir": cfg.data_dir},
                            [PAIRS, KEY_HEADS] + [RunFolder.finetune_rel(v) for v in cfg.variants], [RunFolder.EVAL],
                            lambda: _eval(cfg, run, get_model(), progress), keep=[RunFolder.EVAL_CACHE], spread=True))
    # the eval folder's per-item cache is not a result; its table is
    upstream = [o if o != RunFolder.EVAL else RunFolder.EVAL_RESULTS for s in stages for o in s.owns]
    stages.append(Stage("report", {}, [RunFolder.CONFIG] + upstream, [RunFolder.REPORT], lambda: _report(run),
                        partial=True, resume=[r for s in stages for r in s.resume]))
    return stages


def train_settings(cfg: RunSettings) -> dict:
    """What every fine-tuning stage's results depend on, before its variant, rate and MLPs."""
    train = {"model": cfg.model, "dtype": cfg.dtype, "seed": cfg.seed, **cfg.finetune.to_json(),
             "data_dir": cfg.data_dir}
    # only +mlp variants read mlps; the others change no result; a variant's stage takes its own rate
    for key in ("mlps", *FinetuneSettings.RESUMABLE_CHANGES, *FinetuneSection.RATE_CHOICE):
        train.pop(key, None)
    if cfg.finetune.lr_grid:  # the validation examples are set aside from every variant's training data
        train["validation"] = cfg.finetune.validation
    return train


def check_selection(names: list[str] | None, start: str | None, stages: list[Stage]) -> set[str] | None:
    """The stage names that may run, from --stages and --from; errors name what is unknown."""
    known = [s.name for s in stages]
    groups = list(dict.fromkeys(s.group for s in stages))
    for name in (names or []) + ([start] if start else []):
        if name not in known and name not in groups:
            raise SettingError(f"unknown stage {name!r}; this config's stages: {', '.join(groups)} "
                             f"(or one of {', '.join(k for k in known if '/' in k) or 'no finetune variants'})")
    if names and start:
        raise SettingError("give either --stages or --from, not both")
    if start:
        first = next(i for i, s in enumerate(stages) if start in (s.name, s.group))
        return {s.name for s in stages[first:]}
    return set(names) if names else None


def run_pipeline(cfg: RunSettings, stages: list[str] | None = None, start: str | None = None,
                 force: bool = False, progress: bool = True, say: Callable[[str], None] = logger.info) -> Path:
    """Run the stale stages of `cfg` (all, or those chosen by `stages` / `start`); returns report.html.

    Under a launcher every process calls it with the same `cfg` and gets the same answer."""
    run = RunFolder(cfg.out)
    progress = progress and distributed.is_main()  # one set of progress bars

    @cache
    def get_model():
        model = load_run_model(cfg)
        if distributed.is_main():
            say(str(model))
            write_model_info(run, model)
        return model

    def release_model() -> None:
        get_model.cache_clear()
        gc.collect()

    plan = build_stages(cfg, run, get_model, progress, release_model)
    selected = check_selection(stages, start, plan)
    _check_processes(cfg, plan, selected)

    def begin() -> None:
        run.root.mkdir(parents=True, exist_ok=True)
        write_json(run.config, cfg.to_json())  # the effective config, flags and defaults included

    runner = Runner(run.root, selected, force, say=say)
    with _main_prints():
        distributed.on_main(begin, "writing config.json")
        for stage in plan:
            runner(stage)
        report = run.report
        if distributed.is_main():
            say(f"done; ran {', '.join(runner.ran) or 'nothing (every stage up to date)'}; report: {report}")
    return report


def load_run_model(cfg: RunSettings, name: str | None = None):
    """The run's model (or an adapter's base), loaded and placed as every command places it."""
    model, _ = models.load_placed(name or cfg.model, cfg.device, cfg.dtype, max_memory=cfg.max_memory,
                                  offload_folder=cfg.offload_folder)
    return model


def _check_processes(cfg: RunSettings, plan: list[Stage], selected: set[str] | None) -> None:
    """Refuse up front what cannot run on this many processes, before any stage spends time."""
    world = distributed.world()
    training = [s.name for s in plan if s.group == "finetune" and (selected is None or s.name in selected
                                                                     or s.group in selected)]
    if training:  # the batch split; --device auto with FSDP or several processes; offload without FSDP or a GPU
        check_setup(cfg.finetune.recipe("precise", cfg.seed), cfg.device, world, section="finetune")


@contextlib.contextmanager
def _main_prints():
    """The main process prints the run; the others' standard output is dropped (errors still show)."""
    if distributed.is_main():
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def write_model_info(run: RunFolder, model) -> None:
    info = ModelInfo(name=model.name, source=str(model.source), fingerprint=base_fingerprint(model),
                     n_layers=model.n_layers, n_heads=model.n_heads, dtype=str(model.dtype), device=str(model.device))
    write_json(run.model_info, info.to_json())


# ---- the stages ------------------------------------------------------------------------------

def _data(cfg: RunSettings, run: RunFolder, model, progress: bool = True) -> None:
    write_pairs(run.pairs, pairs_for(model, cfg.data, batch_size=cfg.batch_size, progress=progress))


def _circuit_key(cfg: RunSettings) -> dict:
    """What identify depends on besides its settings: a circuit file's path and bytes (nothing without one, so
    that a run without a circuit keeps its signature)."""
    if cfg.circuit is None:
        return {}
    return {"circuit": cfg.circuit, "circuit_sha256": hashlib.sha256(Path(cfg.circuit).read_bytes()).hexdigest()}


def _identify(cfg: RunSettings, run: RunFolder, model, progress: bool = True) -> str:
    if cfg.circuit is not None and scoreless(cfg.circuit):  # its heads; its effects from the run's own pairs
        patched = identify(model, run.pairs, cfg.identify, run.identify, batch_size=cfg.batch_size,
                           progress=progress)
        found = identify_from(cfg.circuit, model, cfg.identify, run.identify, effects=patched.effects)
        return (f"key heads from the circuit {cfg.circuit}, which has no scores: the effects are keyheads' own "
                f"path patching of this run's pairs\n" + describe_effects(found))
    if cfg.circuit is not None:  # a circuit found elsewhere: its heads, not patched ones
        found = identify_from(cfg.circuit, model, cfg.identify, run.identify)
        return f"key heads from the circuit {cfg.circuit}\n" + describe_effects(found)
    return describe_effects(identify(model, run.pairs, cfg.identify, run.identify, batch_size=cfg.batch_size,
                                     progress=progress))


def _also_identify_stage(cfg: RunSettings, run: RunFolder, name: str, model_key: dict, data: dict,
                         identify_settings: dict, get_model, progress: bool) -> Stage:
    """identify/NAME: the pairs of one more set, patched as the identify stage patches the run's pairs."""
    if name in TASKS:
        made_of = {**data, "task": name}
    else:  # the word problems use these of the data settings, and the benchmark folder's questions
        made_of = {**{k: data[k] for k in ("n", "seed", "single_token_answer", "keep_correct")},
                   "data_dir": cfg.data_dir}
    rel = RunFolder.also_identify_rel(name)
    return Stage(rel, {**model_key, "data": made_of, "identify": identify_settings}, [], [rel],
                 lambda: _also_identify(cfg, run, name, get_model(), progress), spread=True,
                 resume=[f"{rel}/per_sample*.npz"])


def _also_identify(cfg: RunSettings, run: RunFolder, name: str, model, progress: bool = True) -> str:
    pairs = run.also_identify_pairs(name)

    def make() -> None:
        if not pairs.is_file():  # a resumed stage keeps the pairs its patching checkpoint was made on
            write_pairs(pairs, _pairs_of(cfg, name, model, progress))

    distributed.on_main(make, f"stage identify/{name}: making its pairs")
    return describe_effects(identify(model, pairs, cfg.identify, run.also_identify(name), batch_size=cfg.batch_size,
                                     progress=progress))


def _pairs_of(cfg: RunSettings, name: str, model, progress: bool) -> list[Pair]:
    """The pairs of also_identify's `name`, with the run's data settings; one line when keep_correct keeps none."""
    try:
        if name in TASKS:
            return pairs_for(model, cfg.data.model_copy(update={"task": name}), batch_size=cfg.batch_size,
                             progress=progress)
        questions = load_benchmark(WORD_PROBLEMS, "test", data_dir=_data_dir(cfg))
        return word_problem_pairs(model, questions, cfg.data, name, batch_size=cfg.batch_size, progress=progress)
    except NothingCorrect:
        examples = ", or give solved examples first (data.few_shot: 3)" if name in TASKS else ""
        raise NothingCorrect(f"identify/{name}: the model answers none of its {name} prompts correctly, so "
                             f"data.keep_correct keeps no pair: take {name} out of also_identify, or set "
                             f"data.keep_correct: false{examples}") from None


def _key_heads(run: RunFolder) -> HeadChoice:
    """The run's key heads, with its effects for the rankings."""
    return HeadChoice.of(key_heads(run).heads, run.effects)


def _knockout(cfg: RunSettings, run: RunFolder, model, progress: bool = True) -> str:
    result = run_knockout(model, run.pairs, run.knockout, _key_heads(run), cfg.knockout, data_dir=_data_dir(cfg),
                          batch_size=cfg.batch_size, progress=progress)
    return describe_knockout(result)


def _attention(cfg: RunSettings, run: RunFolder, model, progress: bool = True) -> str:
    result = run_attention(model, run.pairs, run.attention, _key_heads(run), cfg.attention,
                           batch_size=cfg.batch_size, progress=progress)
    return describe_attention(result)


def _mlp(cfg: RunSettings, run: RunFolder, model, progress: bool = True) -> str:
    result = run_mlp(model, run.pairs, run.mlp, cfg.mlp, batch_size=cfg.batch_size, progress=progress)
    return describe_mlp(result)


def _data_dir(cfg: RunSettings) -> str | None:
    folder = data_dir_from(cfg.data_dir or None)
    return str(folder) if folder else None


def variant_components(variant: str, folder: RunFolder | Path, model, cfg: RunSettings) -> Components:
    """What a precise or random variant trains (see RunSettings.variants for the names)."""
    run = RunFolder.of(folder)
    m = VARIANT.fullmatch(variant)
    if m is None or not m["kind"]:
        raise ValueError(f"{variant!r} is not a precise or random variant")
    keys = key_heads(run)
    mlps = (int(m["m"]) if m["m"] else cfg.finetune.mlps) if m["mlp"] else None
    if m["kind"] == "random":  # as many as the key heads unless @K says
        choice = ComponentChoice(random_heads=int(m["k"]) if m["k"] else len(keys.heads))
    elif m["k"]:
        choice = ComponentChoice(effects=str(run.effects), top_k=int(m["k"]), mlps=mlps)
    else:  # the key heads, as identify chose them
        choice = ComponentChoice(effects=str(run.effects), heads=",".join(map(str, keys.heads)), mlps=mlps)
    chosen = choice.components(model, int(m["seed"]) if m["seed"] is not None else cfg.seed)
    if m["kind"] == "precise" and not m["k"]:
        chosen = Components(chosen.heads, chosen.mlps, keys.source + (f" + top-{mlps} MLPs" if mlps else ""))
    return chosen


def rate_family(variant: str) -> str:
    """The variant whose rate `variant` trains at: itself without its seed, random heads at the rate of as many
    chosen heads (random@32-seed1 -> precise@32), since they tune as many weights."""
    plain = re.sub(r"-seed\d+$", "", variant)
    return "precise" + plain[len("random"):] if plain.startswith("random") else plain


GRID_JSON = "grid.json"


def rate_grid(cfg: RunSettings, family: str) -> list[float]:
    """The rates `family` is tried at: its own entry of finetune.lr_grid, else its method's ('precise', 'full',
    'lora'), else none (it trains at finetune.lr)."""
    return list(_own_else_method(cfg.finetune.lr_grid, family) or [])


def grid_rel(family: str, lr: float) -> str:
    """The run-relative folder of one grid point."""
    return f"grid/{family}/{lr:g}"


def chosen_lr(run: RunFolder, family: str, rates: list[float]) -> tuple[float, dict[float, float]]:
    """(the rate of lowest validation loss, every rate's loss) from the grid's results in the run folder."""
    losses = {lr: float(read_json(run.root / grid_rel(family, lr) / GRID_JSON)["validation_loss"]) for lr in rates}
    return min(losses, key=lambda lr: (losses[lr], lr)), losses


def given_lr(cfg: RunSettings, family: str) -> float | None:
    """The rate finetune.lr_chosen gives `family` (its own entry, else its method's), or None."""
    return _own_else_method(cfg.finetune.lr_chosen, family)


def _own_else_method(setting: dict, family: str):
    """A per-family setting's entry for `family`: its own, else its method's, else None (empty: none)."""
    return next((setting[k] for k in (family, _method(family)) if k in setting and setting[k]), None)


@dataclass(frozen=True)
class RateFrom:
    """The rate another study's grid chose for a family (finetune.lr_from): None while that grid is not complete."""
    config: str
    family: str  # the other study's family whose grid gives the rate
    losses: dict[float, float]  # the finished grid points' validation losses
    missing: list[str]  # that study's grid cells not recorded yet

    @property
    def lr(self) -> float | None:
        if self.missing or not self.losses:
            return None
        return min(self.losses, key=lambda lr: (self.losses[lr], lr))

    def settings(self) -> dict:
        """What a variant trained at this rate depends on (its stage settings): a changed grid makes it stale."""
        return {"lr": self.lr, "lr_from": {"config": self.config, "family": self.family,
                                           "losses": {f"{lr:g}": loss for lr, loss in self.losses.items()}}}


def rate_from(config: str, family: str) -> RateFrom:
    """The rate the study `config` chose for `family` (else for its method) from its committed grid cells."""
    other = RunSettings.from_yaml(config)
    grids = {f: rate_grid(other, f) for f in dict.fromkeys(map(rate_family, other.variants)) if rate_grid(other, f)}
    mine = family if family in grids else _method(family)
    if mine not in grids:
        raise SettingError("finetune.lr_from", config, f"that study has no learning-rate grid for {family} or "
                           f"{_method(family)} (its grids: {', '.join(grids) or 'none'}): give its rate in lr_chosen")
    records = Path("records") / Path(config).stem / "cells"
    losses, missing = {}, []
    for lr in grids[mine]:
        point = f"finetune/grid/{mine}/{lr:g}"
        path = records / point.replace("/", "--") / "run" / grid_rel(mine, lr) / GRID_JSON
        if path.is_file():
            losses[lr] = float(read_json(path)["validation_loss"])
        else:
            missing.append(point)
    return RateFrom(config, mine, losses, missing)


def rate_elsewhere(cfg: RunSettings, variant: str) -> RateFrom | None:
    """The rate another study's grid chose that `variant` trains at (finetune.lr_from); None when its rate is this
    study's: its own grid's choice, finetune.lr_chosen or finetune.lr."""
    family = rate_family(variant)
    if rate_grid(cfg, family) or given_lr(cfg, family) is not None or not cfg.finetune.lr_from:
        return None
    return rate_from(cfg.finetune.lr_from, family)


def variant_lr(cfg: RunSettings, run: RunFolder, variant: str) -> float:
    """The learning rate `variant` trains at: its rate family's grid choice, else its rate in finetune.lr_chosen,
    else the rate finetune.lr_from's study chose, else finetune.lr."""
    family = rate_family(variant)
    rates = rate_grid(cfg, family)
    if rates:
        return chosen_lr(run, family, rates)[0]
    given = given_lr(cfg, family)
    if given is not None:
        return given
    chosen = rate_elsewhere(cfg, variant)
    if chosen is not None:
        if chosen.lr is None:
            raise SettingError(f"variant {variant} trains at the rate {cfg.finetune.lr_from} chooses for "
                               f"{chosen.family}, whose grid is not complete: run its cells first "
                               f"({', '.join(chosen.missing)})")
        return chosen.lr
    return cfg.finetune.lr


def training_examples(cfg: RunSettings) -> tuple[list, list]:
    """(training, validation) examples: with an lr_grid, `finetune.validation` of the training data set aside by a
    seeded draw, to choose the rates on; without one, all of it and none."""
    examples = load_examples(cfg.finetune.train, data_dir=_data_dir(cfg), seed=cfg.seed)
    if not cfg.finetune.lr_grid:
        return examples, []
    n = cfg.finetune.validation
    if n >= len(examples):
        raise SettingError(f"finetune.validation {n} leaves no training example of the {len(examples)} that "
                           f"finetune.train {cfg.finetune.train!r} gives: lower it")
    held = set(random.Random(cfg.seed).sample(range(len(examples)), n))
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def _method(variant: str) -> Literal["precise", "full", "lora"]:
    return "precise" if variant.startswith(("precise", "random")) else "full" if variant == "full" else "lora"


def _finetune(cfg: RunSettings, run: RunFolder, variant: str, progress: bool = True) -> str:
    method = _method(variant)
    examples, _ = training_examples(cfg)
    ft = cfg.finetune.recipe(method, cfg.seed).model_copy(update={"lr": variant_lr(cfg, run, variant)})
    # training changes weights in place, so it gets its own copy of the model, loaded and placed as
    # `keyheads finetune` places it (under FSDP2: no weights until sharded, then each process reads its own)
    model, where = models.load_placed(cfg.model, cfg.device, cfg.dtype, sharded=ft.parallel == "fsdp")
    components = variant_components(variant, run, model, cfg) if method == "precise" else None
    info = finetune(model, examples, ft, run.finetune(variant), components, data_name=cfg.finetune.train,
                    progress=progress, device=where.run_on)
    return describe_training(info)


def grid_point(cfg: RunSettings, run: RunFolder, family: str, lr: float, out: Path, progress: bool = True) -> str:
    """One point of the learning-rate grid: `family` trained at `lr` for finetune.grid_fraction of its schedule's
    optimizer steps, then scored by its validation loss; writes out/grid.json (and the short run in out/train)."""
    from .finetune.adapter import load_finetuned  # noqa: PLC0415 -- peft, for LoRA, only where a grid runs
    from .finetune.train import total_steps  # noqa: PLC0415
    from .finetune.validation import validation_loss  # noqa: PLC0415

    examples, validation = training_examples(cfg)
    ft = cfg.finetune.recipe(_method(family), cfg.seed)
    steps = max(1, round(total_steps(ft, len(examples)) * cfg.finetune.grid_fraction))
    ft = ft.model_copy(update={"lr": lr, "max_steps": steps})
    model, where = models.load_placed(cfg.model, cfg.device, cfg.dtype, sharded=ft.parallel == "fsdp")
    components = variant_components(family, run, model, cfg) if ft.method == "precise" else None
    finetune(model, examples, ft, out / "train", components, data_name=cfg.finetune.train, progress=progress,
             device=where.run_on)
    del model
    trained = load_finetuned(out / "train", lambda name: load_run_model(cfg, name))
    loss = validation_loss(trained, validation, ft.max_length, batch_size=cfg.finetune.micro_batch_size)
    write_json(out / GRID_JSON, {"family": family, "lr": lr, "validation_loss": loss, "validation": len(validation),
                                   "steps": steps, "samples": steps * ft.optimizer_batch_size})
    return f"grid {family} at lr {lr:g}: validation loss {loss:.4f} after {steps} steps"


def eval_labels(model: str, n_heads: int, finetune: list[str], mean: KnockoutMean = DEFAULT_MEAN) -> list[str]:
    """The eval stage's row labels: base, key-head knockout (the global mean says so: the aligned one is
    the knockout curves' own), then one per fine-tuning variant."""
    return ([f"{model} (base)", f"{model} - {n_heads} key heads knocked out"
             + (" (global mean)" if mean == "global" else "")]
            + [f"{model} + {v} SFT" for v in finetune])


ROWS = ("base", "knockout")  # the eval table's rows before the fine-tuning variants


def _eval(cfg: RunSettings, run: RunFolder, model, progress: bool = True) -> None:
    evaluate_rows(cfg, run, model, [*ROWS, *cfg.variants], run.eval, run.eval_cache, progress)


def evaluate_rows(cfg: RunSettings, run: RunFolder, model, rows: list[str], out: Path, cache: Path,
                  progress: bool = True, drift_from_base: bool = False) -> None:
    """The eval table of `rows` ("base", "knockout" or a fine-tuning variant, in the table's order) into `out`: the
    eval stage's whole table, or one row (a study's cell: keyheads.study). `drift_from_base`: generic-kl measures
    the rows against the base model without evaluating the base row (another cell does), as the whole table
    measures them against its first row, the base."""
    heads = key_heads(run).heads
    labels = dict(zip([*ROWS, *cfg.variants], eval_labels(cfg.model, len(heads), cfg.variants, cfg.knockout.mean)))
    made = {"base": lambda: Variant.make("model", cfg.model, label=labels["base"]),  # the run's one mean
            "knockout": lambda: Variant.make("knockout", cfg.model, label=labels["knockout"],
                                             heads=[h.to_json() for h in heads], data=str(run.pairs),
                                             mean=cfg.knockout.mean)}
    variants = [made[r]() if r in made else Variant.make("adapter", str(run.finetune(r)), label=labels[r])
                for r in rows]

    def loader(name: str):
        if name in (cfg.model, model.name):
            return model
        return load_run_model(cfg, name)

    evaluate(variants, cfg.eval, out, loader=loader, reference=made["base"]() if drift_from_base else None,
             data_dir=_data_dir(cfg), batch_size=cfg.batch_size, cache_dir=str(cache), progress=progress)


def _report(run: RunFolder) -> None:
    write_html_report(run.root)
