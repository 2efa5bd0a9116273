"""Pairs for the real SmolLM2 tokenizer and model: its space before a number is a token of its own."""
import json
import re

import pytest
import torch

from keyheads.cli import main
from keyheads.data.arithmetic import compute_answer, format_answer
from keyheads.data.generate import Generator
from keyheads.data.pairs import answer_token_id, read_pairs, verify_pair
from keyheads.data.settings import PairSettings
from keyheads.data.templates import TASKS, load_templates

pytestmark = pytest.mark.real_model


def test_smollm2_every_template_aligned_with_positions_on_the_digits(smollm2):
    tok, templates = smollm2.tokenizer, load_templates()
    assert tok.convert_ids_to_tokens(tok(" 8")["input_ids"]) == ["Ġ", "8"]  # the case this handles
    for task in TASKS:
        n = len(templates.for_task(task))
        for c in Generator(templates, tok, PairSettings(n=n, few_shot=2, seed=11)).task(task, log=print):
            p, t = c.pair, templates.get(c.pair.template)
            ids = tok(p.reference)["input_ids"]
            pieces = tok.convert_ids_to_tokens(ids)
            assert len(ids) == len(tok(p.counterfactual)["input_ids"]) == c.n_tokens
            assert pieces[p.positions["A"]] == p.operands["A"] and pieces[p.positions["B"]] == p.operands["B"]
            assert pieces[p.positions["B"] - 1] == "Ġ" or "{YYY}{B}" in t.text  # the space is its own token
            assert t.operator.word.endswith(pieces[p.positions["operator"]].lstrip("Ġ"))
            if re.search(r"\{YYY\}\{C\}$", t.text):
                assert p.reference[-1].isdigit()
            else:  # ends with the space token, so that the next token is the digit
                assert p.reference.endswith(" ") and pieces[-1] == "Ġ"
            assert tok.convert_ids_to_tokens([c.answer_token]) == [p.answer[0]]
            assert answer_token_id(tok, p.reference, p.answer) == c.answer_token
            assert p.answer == format_answer(
                compute_answer(task, int(p.operands["A"]), int(p.operands["B"]), PairSettings())
            )
            assert verify_pair(tok, p) == []


def test_smollm2_keep_correct_cli_writes_correct_pairs(smollm2, tmp_path, monkeypatch):
    import keyheads.commands.data as command

    monkeypatch.setattr(command, "load_from_args", lambda args: smollm2)  # loading is tested elsewhere
    out = tmp_path / "add.jsonl"
    assert main(["data", "--model", "smollm2-135m", "--task", "addition", "-n", "12", "--few-shot", "3",
                 "--keep-correct", "--templates", "add-eq-1,add-qa-2", "--out", str(out)]) == 0
    pairs = read_pairs(out)
    assert len(pairs) >= 3  # SmolLM2 gets most three-shot additions right
    tok = smollm2.tokenizer
    with torch.inference_mode():
        for p in pairs:
            assert verify_pair(tok, p) == []
            logits = smollm2.forward(torch.tensor([tok(p.reference)["input_ids"]]))
            assert logits[0, -1].argmax().item() == answer_token_id(tok, p.reference, p.answer)
            assert int(p.answer) == int(p.operands["A"]) + int(p.operands["B"])


def test_an_answer_with_its_leading_space_is_the_same_answer(smollm2, tmp_path):
    """" Paul", as lm-eval and Hugging Face targets write an answer, is the answer "Paul" after the prompt: patching,
    knockout and the transfer sets take the same token for both (IOI, where a name follows "to")."""
    from keyheads.analysis.common import answer_token  # noqa: PLC0415
    from keyheads.patching.samples import load_patch_samples  # noqa: PLC0415

    prompt = "When Paul and Laura went to the school, Laura gave a gift to"
    want = smollm2.tokenizer(prompt + " Paul")["input_ids"][len(smollm2.tokenizer(prompt)["input_ids"])]
    assert smollm2.tokenizer.decode([want]) == " Paul"
    assert answer_token_id(smollm2.tokenizer, prompt, " Paul") == answer_token_id(smollm2.tokenizer, prompt, "Paul") \
        == want
    assert answer_token(smollm2, prompt, " Paul") == answer_token(smollm2, prompt, "Paul") == (prompt, want)
    path = tmp_path / "ioi.jsonl"
    path.write_text(json.dumps({"reference": prompt, "counterfactual": prompt.replace("Laura gave", "Maria gave"),
                                "answer": " Paul"}) + "\n")
    assert [s.answer_id for s in load_patch_samples(smollm2, path)] == [want]
