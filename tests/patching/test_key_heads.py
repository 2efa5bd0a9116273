"""Reading effects.json and choosing key heads from it."""
import json

import pytest

from keyheads.components import Components
from keyheads.effects import Effects
from keyheads.results.identify import KeyHeads
from keyheads.testing import tiny_model

from tests.helpers import write_effects


def test_ranking_is_most_negative_first_with_nan_last(tmp_path):
    heads = [[0.01, -0.2, float("nan")], [-0.06, 0.0, -0.5]]
    eff = Effects.load(write_effects(tmp_path / "e.json", heads))
    assert eff.ranked() == [(1, 2), (0, 1), (1, 0), (1, 1), (0, 0), (0, 2)]
    assert list(Components.select(eff).heads) == [(1, 2), (0, 1), (1, 0)]
    assert list(Components.select(eff, threshold=-0.1).heads) == [(1, 2), (0, 1)]
    assert list(Components.select(eff, threshold=None, top_k=4).heads) == [(1, 2), (0, 1), (1, 0), (1, 1)]
    assert list(Components.select(eff, threshold=-0.05, top_k=2).heads) == [(1, 2), (0, 1)]
    # the key_heads.json record makes the same choice, and never lists an unmeasured head
    record = KeyHeads.chosen(eff, threshold=None, top_k=10)
    assert record.heads_ranked == [(1, 2), (0, 1), (1, 0), (1, 1), (0, 0)]


def test_empty_selection_names_the_threshold_and_suggests_top_k(tmp_path):
    eff = Effects.load(write_effects(tmp_path / "e.json", [[-0.01, 0.02], [0.0, -0.03]]))
    with pytest.raises(ValueError) as err:
        list(Components.select(eff, threshold=-0.05).heads)
    assert "-0.05" in str(err.value) and "--top-k" in str(err.value) and "1.1" in str(err.value)
    assert KeyHeads.chosen(eff).heads == []  # the record may be empty; it carries the threshold that gave nothing
    with pytest.raises(ValueError, match="positive"):
        list(Components.select(eff, top_k=0).heads)


def test_shape_must_match_the_model(tmp_path):
    model = tiny_model("llama")
    L, H = model.n_layers, model.n_heads
    path = write_effects(tmp_path / "e.json", [[0.0] * H for _ in range(L + 1)])
    with pytest.raises(ValueError, match=f"{L + 1} layers x {H} heads"):
        Effects.load(path, model)
    ok = write_effects(tmp_path / "ok.json", [[0.0] * H for _ in range(L)])
    assert Effects.load(ok, model).ranked()[0] == (0, 0)


def test_not_an_effects_file(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"metric": "x"}))
    with pytest.raises(ValueError, match="no 'heads'"):
        Effects.load(tmp_path / "x.json")
    with pytest.raises(FileNotFoundError, match="keyheads identify"):
        Effects.load(tmp_path / "missing.json")


def test_a_field_of_the_wrong_type_is_named(tmp_path):
    from keyheads.errors import BadFile

    path = write_effects(tmp_path / "e.json", [[0.0, -0.1]])
    data = json.loads(path.read_text())
    data["n_samples"] = "many"
    path.write_text(json.dumps(data))
    with pytest.raises(BadFile, match=f"{path}.*n_samples"):
        Effects.load(path)
