"""MIB's faithfulness on the compiled circuits, where the circuit is known: keeping its on-path heads and MLPs and
patching every other component from the counterfactual leaves the answer as the whole model gives it (f = 1), and
leaving out any one on-path head does not (f < 1)."""
import pytest

from keyheads.circuits import head_node, mlp_node
from keyheads.faithfulness import normalised
from keyheads.faithfulness.run import measure

from .circuits import PROGRAMS, circuit


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_known_circuit_is_faithful_and_no_smaller_one_is(name):
    c = circuit(name)
    model = c.model()
    known = {head_node(*h) for h in c.on_path} | {mlp_node(m["layer"]) for m in c.truth["mlps"] if m["on_path"]}
    smaller = [known - {head_node(*h)} for h in c.on_path]
    values, _ = measure(model, c.pairs, [None, set(), known, *smaller], batch_size=128, progress=False)
    full, empty, whole, *less = values
    assert abs(full - empty) > 0.1  # the counterfactual changes the answer: f is a real ratio
    assert normalised(whole, full, empty) == pytest.approx(1.0, abs=1e-5)
    for head, m in zip(c.on_path, less):
        assert normalised(m, full, empty) < 0.99, head
