"""One reader of pairs files: the analyses, patching and the evaluation's knockout all read through
keyheads.data.pairs.read_pairs, so a bad file gets the same message (file:line, field) everywhere."""
import pytest

from keyheads.analysis.common import read_pair_list
from keyheads.data import pairs as pairs_module
from keyheads.data.pairs import Pair, read_pairs
from keyheads.errors import NoPairs, UserError
from keyheads.evaluation.variants import read_counterfactuals
from keyheads.io import MalformedLine
from keyheads.patching.samples import load_patch_samples
from keyheads.testing.tiny import tiny_model

GOOD = '{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}'


class NoTokenizer:
    tokenizer = None  # the file is refused before anything is tokenised


READERS = {
    "read_pairs": read_pairs,
    "analysis": read_pair_list,
    "patching": lambda path: load_patch_samples(NoTokenizer(), path),
    "evaluation": read_counterfactuals,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_missing_field_is_named_with_file_and_line(reader, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(f'{GOOD}\n\n{{"reference": "1+2=", "answer": "3"}}\n')
    with pytest.raises(MalformedLine, match=r"bad.jsonl:3: missing counterfactual \(a pair needs reference, "
                                            r"counterfactual, answer\)"):
        READERS[reader](path)


@pytest.mark.parametrize("reader", list(READERS))
def test_wrong_type_and_bad_json_are_named(reader, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(f'{GOOD}\n{{"reference": "", "counterfactual": "x", "answer": "3"}}\n')
    with pytest.raises(MalformedLine, match=r"bad.jsonl:2: `reference` must be a non-empty string"):
        READERS[reader](path)
    path.write_text(f'{GOOD}\n{{oops\n')
    with pytest.raises(MalformedLine, match=r"bad.jsonl:2: not valid JSON"):
        READERS[reader](path)


@pytest.mark.parametrize("reader, error", [("read_pairs", NoPairs), ("analysis", NoPairs),
                                           ("patching", NoPairs), ("evaluation", NoPairs)])
def test_empty_file_is_an_error(reader, error, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(error, match=r"empty.jsonl: no pairs in the file"):
        READERS[reader](path)
    assert issubclass(error, UserError)  # the CLI prints it as one line


@pytest.mark.parametrize("reader", list(READERS))
def test_missing_file(reader, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        READERS[reader](tmp_path / "nope.jsonl")


def test_every_reader_goes_through_read_pairs(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    path.write_text(f"{GOOD}\n")
    calls = []
    real = pairs_module.read_pairs

    def spy(p):
        calls.append(p)
        return real(p)

    monkeypatch.setattr(pairs_module, "read_pairs", spy)
    monkeypatch.setattr("keyheads.patching.samples.read_pairs", spy)
    monkeypatch.setattr("keyheads.evaluation.variants.read_pairs", spy)
    assert read_pair_list(path)[0].answer == "3"
    assert read_counterfactuals(path) == ["1 @ 2 = "]
    assert len(load_patch_samples(tiny_model("llama"), path, first_token_only=True)) == 1
    assert calls == [path] * 3


def test_line_numbers_and_numeric_answers(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(f'\n{GOOD}\n{{"reference": "5 / 2 = ", "counterfactual": "5 @ 2 = ", "answer": 2.5}}\n'
                    '{"reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ", "answer": 8}\n')
    pairs = read_pairs(path)
    assert [p.line for p in pairs] == [2, 3, 4]
    assert [p.answer for p in pairs] == ["3", "2.5", "8"]
    assert pairs[2] == Pair("3 + 5 = ", "3 @ 5 = ", "8")  # the line number is not part of the pair
    assert "line" not in pairs[0].to_dict()
    samples = load_patch_samples(tiny_model("llama"), path, first_token_only=True)
    assert [s.line for s in samples] == [2, 3, 4]
