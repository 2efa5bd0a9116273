"""The findings table's verdicts on circuits known in advance, and on random weights.

Row 3 (knockout beyond random): the knockout stage's own code (`run_knockout`) runs on each compiled program with
the on-path heads as the key heads, ranked first, and `knockout_beyond_random` judges the knockout.json it writes.
The ground truth says what each random draw of n heads (n = the key heads; the random-rank orders permute every
head of the model, the key heads included) must do: a draw that misses the circuit changes nothing (accuracy 1.0,
test_ground_truth), so against the key heads' knockout to chance it must be significant; a draw that is the key set
itself gives the key heads' own accuracy, so it is no control, and rule 3 leaves it out. That decides the verdict
in every case below:
- add and count (one head) and countfirst (two heads, both on the path) have no head outside the circuit: every
  draw is the key set, nothing can be beyond random, and the verdict must be "not testable";
- offpath and sum3, as the stage runs by default (seed 0, five orders), have a draw that is the key set (left out)
  and others that miss the circuit or share a head with it: "holds";
- with a seed whose orders all miss the circuit, "holds" as well.
The domain is never what limits the test: the smallest (add, 16 inputs) already gives a one-sided Fisher p of
8e-6 for 4 right (chance) against 16 of 16.

The same knockouts on random weights (each program's config, freshly initialised with a fixed seed) must not hold.

Row 6 (later MLPs) on random weights: the MLP analysis needs operands, which the compiled pairs do not have, so it
runs on the tests' tiny random Llama and GPT-NeoX over 40 distinct prompts (enough for the rule to decide), and
`later_mlps` must say "does not hold".
"""
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from keyheads.analysis.common import all_heads
from keyheads.analysis.knockout_curves import random_order
from keyheads.analysis.knockout_run import run_knockout
from keyheads.analysis.mlp_run import run_mlp
from keyheads.analysis.settings import KnockoutSettings, MLPSettings
from keyheads.models.model import HookedModel
from keyheads.report.findings import knockout_beyond_random, later_mlps
from keyheads.runfolder import RunFolder
from keyheads.selection import HeadChoice
from keyheads.testing import tiny_model

from .circuits import PROGRAMS, circuit
from .test_ground_truth import chance
from tests.helpers import make_rows, write_effects, write_rows

DRAWS = 3  # the fewest random orders a "holds" may rest on (findings.MIN_DRAWS)
RANDOM_SEED = 1  # the random-weight copies' seed: each answers some inputs right (seed 0 none of sum3's), so its
                 # knockout has something to break and the row is decided on it, not "not testable"


def knockout(model: HookedModel, name: str, folder, seed: int = 0, seeds: int = 5) -> RunFolder:
    """The knockout stage on program `name`: its on-path heads as the key heads, ranked first by effect, the
    curves up to k = their number; knockout.json in a run folder."""
    c = circuit(name)
    folder.mkdir(parents=True, exist_ok=True)
    ranking = [[-1.0 if (layer, head) in c.on_path else 0.0 for head in range(model.n_heads)]
               for layer in range(model.n_layers)]
    effects = write_effects(folder / "effects.json", ranking)
    run = RunFolder(folder / "run")
    run_knockout(model, c.pairs, run.knockout, HeadChoice.of(c.on_path, effects),
                 KnockoutSettings(k=len(c.on_path), seeds=seeds, seed=seed, limit=None, transfer=False),
                 batch_size=128, progress=False)
    return run


def draws_at_n(run: RunFolder) -> list[set]:
    """Each random order's first n heads, n = the key heads: the draws row 3 compares with."""
    ko = run.knockout_record
    return [set(order[:len(ko.key_heads.heads)]) for order in ko.curves.random_orders]


def random_weights(model: HookedModel, seed: int = RANDOM_SEED) -> HookedModel:
    """The same architecture and shape, freshly initialised. tracr's layer-norm epsilon (about 1e15) is sized for
    its compiled weights; with initial weights of scale 0.02 it would flatten every activation to zero and give a
    model in which no head matters, so the copy takes GPT-2's own 1e-5."""
    config = copy.deepcopy(model.hf.config)
    config.layer_norm_epsilon = 1e-5
    torch.manual_seed(seed)
    return HookedModel(AutoModelForCausalLM.from_config(config), model.tokenizer, name=f"random-{model.name}")


def missing_seed(name: str) -> int:
    """The first seed whose DRAWS random orders all start with n heads off the circuit."""
    c = circuit(name)
    heads, on = all_heads(c.model()), set(c.on_path)
    return next(s for s in range(10_000)
                if all(not on & set(random_order(heads, s + i)[:len(on)]) for i in range(DRAWS)))


@pytest.mark.parametrize("name", PROGRAMS)
def test_row3_as_the_stage_runs(name, tmp_path):
    c = circuit(name)
    run = knockout(c.model(), name, tmp_path)
    key = run.knockout_record.key_heads
    assert key.accuracy_before == 1.0 and key.accuracy_after <= chance(c.domain) + 1e-6  # the ground truth
    draws, on = draws_at_n(run), set(c.on_path)
    verdict = knockout_beyond_random(run).verdict
    if all(d == on for d in draws):  # no head outside the circuit: every draw is the key set, no control
        assert verdict == "not testable", verdict
    else:  # the stage's default orders: the draw that is the key set is left out, the others must lose to it
        assert any(d == on for d in draws) and any(not d & on for d in draws)
        assert verdict == "holds", knockout_beyond_random(run)


@pytest.mark.parametrize("name", [n for n in PROGRAMS if len(circuit(n).others()) >= len(circuit(n).on_path)])
def test_row3_holds_when_the_random_heads_miss_the_circuit(name, tmp_path):
    seed = missing_seed(name)
    run = knockout(circuit(name).model(), name, tmp_path, seed=seed, seeds=DRAWS)
    assert all(not d & set(circuit(name).on_path) for d in draws_at_n(run))
    assert knockout_beyond_random(run).verdict == "holds", knockout_beyond_random(run)


@pytest.mark.parametrize("name", PROGRAMS)
def test_row3_does_not_hold_on_random_weights(name, tmp_path):
    model = random_weights(circuit(name).model())
    verdicts = [knockout_beyond_random(knockout(model, name, tmp_path / "default")).verdict]
    if len(circuit(name).others()) >= len(circuit(name).on_path):  # also with the orders that hold above
        verdicts.append(knockout_beyond_random(knockout(model, name, tmp_path / "missing", seed=missing_seed(name),
                                                        seeds=DRAWS)).verdict)
    assert "holds" not in verdicts, verdicts


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_row6_does_not_hold_on_random_weights(family, tmp_path):
    model = tiny_model(family)
    run = RunFolder(tmp_path / "run")
    rows = make_rows(400)  # every A in 5..9, B in 1..4 and operation, each prompt many times over
    result = run_mlp(model, write_rows(tmp_path / "pairs.jsonl", rows), run.mlp, MLPSettings(limit=None),
                     progress=False)
    # one row per distinct prompt: a prompt repeated would narrow the bootstrap for nothing (before the stage kept
    # one row per prompt, make_rows(60)'s 40-odd distinct of 60 gave the tiny Llama a lower bound above 0)
    assert len(result.answer_specific) == len({r["reference"] for r in rows}) == 40
    finding = later_mlps(run)
    assert finding.verdict == "does not hold", finding
