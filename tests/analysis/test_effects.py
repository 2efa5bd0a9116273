"""Reading effects.json and choosing key heads."""
import json

import numpy as np
import pytest

from keyheads.analysis.common import AnalysisError
from keyheads.analysis.effects import read_effects, select_key_heads


def write_effects(path, heads, mlps=None):
    path.write_text(json.dumps({"metric": "relative-logit", "method": "path", "model": "tiny", "n_samples": 4,
                                "n_excluded": 0, "data_sha256": "x", "heads": heads,
                                "mlps": mlps if mlps is not None else [0.0] * len(heads)}))
    return path


def test_ranking_is_most_negative_first_with_nan_last(tmp_path):
    heads = [[0.01, -0.2, float("nan")], [-0.06, 0.0, -0.5]]
    eff = read_effects(write_effects(tmp_path / "e.json", heads))
    assert eff.ranked() == [(1, 2), (0, 1), (1, 0), (1, 1), (0, 0), (0, 2)]
    assert select_key_heads(eff) == [(1, 2), (0, 1), (1, 0)]
    assert select_key_heads(eff, threshold=-0.1) == [(1, 2), (0, 1)]
    assert select_key_heads(eff, threshold=None, top_k=4) == [(1, 2), (0, 1), (1, 0), (1, 1)]


def test_empty_selection_names_the_threshold_and_suggests_top_k(tmp_path):
    eff = read_effects(write_effects(tmp_path / "e.json", [[-0.01, 0.02], [0.0, -0.03]]))
    with pytest.raises(AnalysisError) as err:
        select_key_heads(eff, threshold=-0.05)
    assert "-0.05" in str(err.value) and "--top-k" in str(err.value) and "1.1" in str(err.value)


def test_shape_must_match_the_model(tmp_path, llama):
    path = write_effects(tmp_path / "e.json", np.zeros((2, 4)).tolist())
    with pytest.raises(AnalysisError, match="3 x 4"):
        read_effects(path, llama)
    ok = write_effects(tmp_path / "ok.json", np.zeros((3, 4)).tolist())
    assert read_effects(ok, llama).heads.shape == (3, 4)


def test_not_an_effects_file(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"metric": "x"}))
    with pytest.raises(AnalysisError, match="no 'heads'"):
        read_effects(tmp_path / "x.json")
