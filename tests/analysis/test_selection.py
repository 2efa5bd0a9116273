"""One head-choice type: HeadChoice for the analyses, ComponentChoice (its heads and MLPs) for precise SFT and
the run's variants; both choose through Components, the one rule over effects."""
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from keyheads.components import Components
from keyheads.effects import Effects
from keyheads.heads import Head
from keyheads.selection import ComponentChoice, HeadChoice, choose_heads

from tests.helpers import write_effects

# 2 layers x 3 heads; the most negative first: 1.2, 0.1, 1.0, then 0.0 (-0.04, above the paper's -5%)
HEADS = [[-0.04, -0.09, 0.01], [-0.06, 0.02, -0.2]]
MLPS = [-0.3, -0.1]
MODEL = SimpleNamespace(n_layers=2, n_heads=3)


@pytest.fixture
def effects(tmp_path):
    return str(write_effects(tmp_path / "effects.json", HEADS, MLPS))


def test_explicit_heads_win_and_keep_their_order(effects):
    heads, loaded = choose_heads(MODEL, HeadChoice(effects=effects, heads="1.0,0.1", top_k=1))
    assert heads == [Head(1, 0), Head(0, 1)] and loaded is not None


def test_effects_alone_take_the_papers_five_percent_and_top_k_the_most_negative(effects):
    assert choose_heads(MODEL, HeadChoice(effects=effects))[0] == [Head(1, 2), Head(0, 1), Head(1, 0)]
    assert choose_heads(MODEL, HeadChoice(effects=effects, top_k=2))[0] == [Head(1, 2), Head(0, 1)]


def test_component_choice_ranks_exactly_as_components_select(effects):
    loaded = Effects.load(effects)
    for threshold, top_k in ((-0.07, None), (None, 4), (-0.05, 2)):
        got = ComponentChoice(effects=effects, threshold=threshold, top_k=top_k).components(MODEL)
        assert got == Components.select(loaded, threshold, top_k).check(2, 3)
    with_mlps = ComponentChoice(effects=effects, top_k=1, mlps=1).components(MODEL)
    assert with_mlps.heads == (Head(1, 2),) and with_mlps.mlps == (0,)
    assert ComponentChoice(mlp_layers="1").components(MODEL).mlps == (1,)
    random = ComponentChoice(random_heads=2).components(MODEL, seed=3)
    assert random == Components.random_heads(2, 2, 3, seed=3)


@pytest.mark.parametrize("values, said", [
    ({"heads": "0.1", "random_heads": 2}, "choose heads one way"),
    ({"top_k": 2}, "rank by effect"),
    ({"mlps": 1}, "rank by effect"),
    ({"mlp_layers": "0", "mlps": 1, "effects": None}, "rank by effect"),
    ({"heads": "0.x"}, "LAYER.HEAD"),
])
def test_a_choice_that_cannot_work_is_refused_with_what_to_do(values, said, effects):
    with pytest.raises(ValidationError, match=said):
        ComponentChoice(**values)
