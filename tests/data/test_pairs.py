"""Pair generation on character-level tokenizers: alignment, positions, answers, files.

With the tiny character tokenizer every character is one token and no special token is added, so
a token position is simply a character index: the checks below index the prompt strings directly.
"""
import json
import re
from fractions import Fraction

import pytest
import torch

from keyheads.data.correct import predict_correct, predict_next
from keyheads.data.generate import CounterfactualError, Generator, make_pairs
from keyheads.data.pairs import Pair, encode_with_offsets, read_pairs, verify_pair, write_pairs
from keyheads.data.settings import PairSettings
from keyheads.data.templates import TASKS, TemplateError, load_templates
from keyheads.errors import NothingCorrect
from keyheads.io import MalformedLine
from keyheads.testing.tiny import ALPHABET, SPECIALS, char_tokenizer, tiny_model

SLOT = re.compile(r"\{(\w+)(~?)(?::([^}]*))?\}")
QUIET = lambda *a, **k: None  # noqa: E731


@pytest.fixture(scope="module")
def templates():
    return load_templates()


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def glue_tokenizer():
    """Like GPT-2: the space before a word or number belongs to that token (" 8")."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in ALPHABET if c != " "]
    vocab = {t: i for i, t in enumerate(SPECIALS + [" "] + chars + [" " + c for c in chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(" ?[^ ]| "), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>")


def expected_answer(task, a, b):
    a, b = int(a), int(b)
    return {"addition": a + b, "subtraction": a - b, "multiplication": a * b,
            "division": Fraction(a, b), "exponentiation": a ** b}[task]


def template_regex(text, counterfactual=False):
    """A regex for a filled template, written from its text. A filler slot must repeat its value
    (a backreference) except at ~ occurrences of a counterfactual; every ~ occurrence is captured."""
    out, pos, seen, n = [], 0, set(), 0
    for m in SLOT.finditer(text):
        out.append(re.escape(text[pos:m.start()]))
        name, tilde, word = m.groups()
        if name in ("A", "B"):
            out.append(f"(?P<{name}>\\d+)")
        elif name == "C":
            out.append("(?P<C>-?[\\d.]+)" if not counterfactual else "")
        elif name == "OP":
            out.append("(?P<OP>\\S+?)" if counterfactual else re.escape(word))
        elif tilde:
            n += 1
            out.append(f"(?P<{name}_{n}>.+?)" if counterfactual else f"(?P={name})")
        else:
            pattern = r"\d{3}" if name == "YYY" else ".+?"
            out.append(f"(?P={name})" if name in seen else f"(?P<{name}>{pattern})")
            seen.add(name)
        pos = m.end()
    out.append(re.escape(text[pos:]))
    return re.compile("^" + "".join(out) + "$")


def candidates_for(templates, tok, task, **config):
    config = {"n": 2 * len(templates.for_task(task)), **config}
    return Generator(templates, tok, PairSettings(**config)).task(task, log=QUIET)


@pytest.mark.parametrize("task", TASKS)
def test_every_template_aligned_and_correct(templates, tok, task):
    pools = templates.pools
    cands = candidates_for(templates, tok, task, few_shot=2, seed=3)
    assert {c.pair.template for c in cands} == {t.id for t in templates.for_task(task)}
    for c in cands:
        p, t = c.pair, templates.get(c.pair.template)
        ref, cf = p.reference, p.counterfactual
        # aligned: same token count; positions point at the operands (character = token here)
        assert len(tok(ref)["input_ids"]) == len(tok(cf)["input_ids"]) == len(ref) == len(cf) == c.n_tokens
        last = ref.rfind("\n")
        assert ref[p.positions["A"]] == p.operands["A"] and ref[p.positions["B"]] == p.operands["B"]
        assert last < min(p.positions.values())
        assert ref[:p.positions["operator"] + 1].endswith(t.operator.word)
        assert ref[p.positions["operator"]] != cf[p.positions["operator"]]
        assert verify_pair(tok, p) == []
        # the few-shot prefix: two solved examples of this template, shared by both prompts
        assert ref[:last + 1] == cf[:last + 1] and ref.count("\n") == 2
        for line in ref[:last].split("\n") + [ref[last + 1:] + p.answer]:
            m = template_regex(t.text).match(line)
            assert m, (t.id, line)
            value = expected_answer(task, m["A"], m["B"])
            assert value.denominator == 1 if task == "division" else value >= 0
            assert m["C"] == str(int(value)) and (t.max_answer is None or value <= t.max_answer)
        assert (p.operands["A"], p.operands["B"]) == (m["A"], m["B"])
        assert tok.decode([c.answer_token]) == p.answer[0]
        # the prompt ends where the answer starts: after the space unless the answer continues digits
        assert ref.endswith(" ") != bool(re.search(r"\{YYY\}\{C\}$", t.text))
        # the counterfactual: the operator replaced from the right pool, ~ fillers changed
        m_cf = template_regex(t.text, counterfactual=True).match(cf[last + 1:])
        assert m_cf, (t.id, cf)
        pool = pools["NONSENSE"] if t.operator.word.isalpha() else pools["SYMBOLS"]
        assert m_cf["OP"] in pool and m_cf["OP"] != t.operator.word
        m_ref = template_regex(t.text).match(ref[last + 1:] + p.answer)
        for group, value in m_cf.groupdict().items():
            if "_" in group:  # a ~ occurrence: another value of the slot's pool
                slot = group.split("_")[0]
                assert value != m_ref[slot] and value in pools[t.pool_of[slot]]


def test_year_templates_state_true_years(templates, tok):
    for c in candidates_for(templates, tok, "addition", n=200, seed=5):
        if c.pair.template in ("add-time-1", "add-time-2"):
            ref = c.pair.reference
            start = int(re.search(r"from (?:the year )?(\d{4})", ref)[1])
            end = int(re.search(r"(\d{3})$", ref)[1] + c.pair.answer)
            assert start + int(c.pair.operands["A"]) == end


def test_subtraction_and_division_rules(templates, tok):
    sub = [c.pair for c in candidates_for(templates, tok, "subtraction", n=90)]
    assert all(int(p.answer) >= 0 for p in sub)
    sub = [c.pair for c in candidates_for(templates, tok, "subtraction", n=90, allow_negative=True)]
    assert any(p.answer.startswith("-") for p in sub)
    for p in sub:
        assert int(p.answer) == int(p.operands["A"]) - int(p.operands["B"])
    div = [c.pair for c in candidates_for(templates, tok, "division", n=90, allow_fractions=True)]
    assert any("." in p.answer for p in div)
    for p in div:
        assert abs(float(p.answer) - int(p.operands["A"]) / int(p.operands["B"])) < 0.006


def test_operand_ranges_and_multi_token_operands(templates, tok):
    assert PairSettings(a_range=(10, 99), b_range=(2, 3)).b_range == (2, 3)
    with pytest.raises(ValueError, match="needs 0 <= LO <= HI"):
        PairSettings(b_range=(9, 1))
    add = load_templates()
    add.templates = [add.get("add-eq-1")]
    gen = Generator(add, tok, PairSettings(n=5, a_range=(10, 99), b_range=(10, 99)))
    with pytest.raises(TemplateError, match="every sample was rejected"):
        gen.task("addition", log=QUIET)
    assert gen.rejected["operand is not a single token"] > 0
    gen = Generator(add, tok, PairSettings(n=20, a_range=(10, 99), b_range=(100, 120), single_token_operands=False))
    for c in gen.task("addition", log=QUIET):
        p = c.pair
        assert 10 <= int(p.operands["A"]) <= 99 and 100 <= int(p.operands["B"]) <= 120
        a, b = p.positions["A"], p.positions["B"]  # the last token (character) of each operand
        assert p.reference[a - 1:a + 1] == p.operands["A"] and p.reference[b - 2:b + 1] == p.operands["B"]
        assert p.answer == str(int(p.operands["A"]) + int(p.operands["B"]))


def test_single_token_answer(templates, tok):
    cands = candidates_for(templates, tok, "multiplication", n=40, single_token_answer=True)
    assert all(len(c.pair.answer) == 1 for c in cands)


def test_template_without_max_answer_room_is_skipped(templates, tok):
    logs = []
    gen = Generator(templates, tok, PairSettings(n=30, a_range=(5, 9), b_range=(5, 9)))
    cands = gen.task("addition", log=logs.append)
    assert not any(c.pair.template in ("add-time-1", "add-time-2") for c in cands)
    assert any("add-time-1: skipped" in line for line in logs)


def test_space_glued_to_numbers(templates):
    """When " 8" is one token the prompt must not end with the space: the answer token is " 8"."""
    glue = glue_tokenizer()
    for task in ("addition", "exponentiation"):
        for c in candidates_for(templates, glue, task, few_shot=1):
            p = c.pair
            ids = glue(p.reference)["input_ids"]
            assert len(ids) == len(glue(p.counterfactual)["input_ids"])
            assert not p.reference.endswith(" ")
            assert glue.decode([c.answer_token]) == " " + p.answer[0]
            pieces = glue.convert_ids_to_tokens(ids)
            # " 3", or "3" at the start of a line
            assert pieces[p.positions["A"]] in (" " + p.operands["A"], p.operands["A"])
            assert pieces[p.positions["B"]] == " " + p.operands["B"]
            assert verify_pair(glue, p) == []


def test_positions_count_special_tokens(templates):
    """A tokenizer that adds BOS shifts every position by one: positions index what the model sees."""
    from tokenizers.processors import TemplateProcessing

    bos = char_tokenizer()
    bos._tokenizer.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    assert bos("1 + 2")["input_ids"][0] == 1
    plain = candidates_for(templates, char_tokenizer(), "addition", few_shot=1)
    shifted = candidates_for(templates, bos, "addition", few_shot=1)
    for a, b in zip(plain, shifted):
        assert a.pair.reference == b.pair.reference
        assert {k: v + 1 for k, v in a.pair.positions.items()} == b.pair.positions
        assert verify_pair(bos, b.pair) == []


def test_deterministic_given_seed_and_independent_of_other_tasks(templates, tok):
    cfg = PairSettings(n=30, few_shot=1, seed=7)
    one = make_pairs(templates, ["addition"], cfg, tokenizer=tok, log=QUIET)
    again = make_pairs(templates, ["addition"], cfg, tokenizer=tok, log=QUIET)
    both = make_pairs(templates, ["subtraction", "addition"], cfg, tokenizer=tok, log=QUIET)
    other = make_pairs(templates, ["addition"], PairSettings(n=30, few_shot=1, seed=8), tokenizer=tok, log=QUIET)
    assert [p.to_dict() for p in one] == [p.to_dict() for p in again]
    assert [p.to_dict() for p in one] == [p.to_dict() for p in both if p.task == "addition"]
    assert [p.to_dict() for p in one] != [p.to_dict() for p in other]


def test_alignment_check(tok):
    def check(ref, ref_spans, cf, cf_spans):
        ids, off = encode_with_offsets(tok, ref)
        cf_ids, cf_off = encode_with_offsets(tok, cf)
        return Generator._aligned(ids, off, ref_spans, cf_ids, cf_off, cf_spans)

    assert check("3 plus 5", [(2, 6)], "3 none 5", [(2, 6)])
    assert not check("3 plus 5", [(2, 6)], "3 nothing 5", [(2, 9)])  # longer
    assert not check("3 plus 5", [(2, 6)], "3 none 6", [(2, 6)])     # a token outside the span changed
    assert not check("3 plus 5 ", [(2, 6)], "3 nil 5  ", [(2, 5)])   # same length, shifted


def test_no_same_length_counterfactual_is_an_error(tmp_path, tok):
    path = tmp_path / "t.yaml"
    path.write_text('templates:\n  - {id: my-exp, task: exponentiation, text: "{A} {OP:exponentiated} {B} = {C}"}\n')
    with pytest.raises(CounterfactualError, match="my-exp.*NONSENSE"):
        candidates_for(load_templates([path]), tok, "exponentiation")


# ---- keeping the correct ones ----------------------------------------------------------------------
def ConstantModel(tokenizer, token: str):
    """A tiny model whose unembedding always puts the highest logit on `token`."""
    model = tiny_model("llama")
    assert model.tokenizer.get_vocab() == tokenizer.get_vocab()
    token_id = tokenizer.convert_tokens_to_ids(token)

    def constant(module, args, logits):
        out = torch.zeros_like(logits)
        out[..., token_id] = 1.0
        return out

    model.hf.get_output_embeddings().register_forward_hook(constant)
    return model


def test_keep_correct_keeps_exactly_the_right_ones(templates, tok):
    cfg = PairSettings(n=40, seed=2)
    all_pairs = make_pairs(templates, ["addition"], cfg, tokenizer=tok, log=QUIET)
    kept = make_pairs(templates, ["addition"], cfg, model=ConstantModel(tok, "1"), keep_correct=True,
                      batch_size=7, log=QUIET)
    assert kept and [p.to_dict() for p in kept] == [p.to_dict() for p in all_pairs if p.answer.startswith("1")]


def test_model_that_gets_nothing_right_is_an_error(templates, tok):
    logs = []
    with pytest.raises(NothingCorrect, match=r"predicted none of the 40 prompts correctly") as err:
        make_pairs(templates, ["addition"], PairSettings(n=40), model=ConstantModel(tok, "<pad>"),
                   keep_correct=True, log=logs.append)
    assert "\n" not in str(err.value)  # the CLI prints it as one line
    table = "\n".join(logs)  # the accuracy table was printed as it went
    assert re.search(r"(?s)add-eq-1 +0/\d+ +0\.0%.*all +0/\d+", table) and "add-qa-4" in table


def test_batched_prediction_equals_one_prompt_at_a_time(templates):
    model = tiny_model("llama", seed=1)
    cands = candidates_for(templates, model.tokenizer, "addition", n=21, few_shot=1)
    prompts = [c.pair.reference for c in cands]
    assert len({len(p) for p in prompts}) > 5  # batches mix lengths, so left padding is exercised
    alone = [model.forward(torch.tensor([model.tokenizer(p)["input_ids"]]))[0, -1].argmax().item() for p in prompts]
    assert predict_next(model, prompts, batch_size=5) == alone
    assert predict_correct(model, cands, batch_size=5) == [a == c.answer_token for a, c in zip(alone, cands)]


# ---- the file format ------------------------------------------------------------------------------
def test_roundtrip_and_minimal_files(tmp_path, templates, tok):
    pairs = make_pairs(templates, ["division"], PairSettings(n=9), tokenizer=tok, log=QUIET)
    path = write_pairs(tmp_path / "p.jsonl", pairs)
    assert read_pairs(path) == pairs
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["task", "template", "reference", "counterfactual", "answer", "operands", "positions"]
    minimal = tmp_path / "m.jsonl"
    minimal.write_text('{"reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ", "answer": 8}\n\n')
    assert read_pairs(minimal) == [Pair("3 + 5 = ", "3 @ 5 = ", "8")]


@pytest.mark.parametrize("line, why", [
    ('{"reference": "1 + 1 = ", "counterfactual": "1 < 1 = "', "not valid JSON"),
    ('{"reference": "1 + 1 = ", "answer": "2"}', "counterfactual"),
    ('{"reference": "1 + 1 = ", "counterfactual": "1 < 1 = ", "answer": ["2"]}', "answer"),
    ('{"reference": "1 + 1 = ", "counterfactual": "1 < 1 = ", "answer": "2", "positions": {"A": 0}}', "positions"),
    ('{"reference": "1 + 1 = ", "counterfactual": "1 < 1 = ", "answer": "2", '
     '"positions": {"A": 0, "B": "4", "operator": 2}}', "positions"),
    ('[1, 2]', "JSON object"),
])
def test_malformed_line_names_its_number(tmp_path, line, why):
    good = '{"reference": "1 + 2 = ", "counterfactual": "1 < 2 = ", "answer": "3"}'
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n{good}\n{line}\n{good}\n")
    with pytest.raises(MalformedLine, match=rf"bad.jsonl:3: .*{why}"):
        read_pairs(path)


def test_verify_pair_catches_misalignment(tok):
    good = Pair("3 + 5 = ", "3 @ 5 = ", "8", operands={"A": "3", "B": "5"}, positions={"A": 0, "B": 4, "operator": 2})
    assert verify_pair(tok, good) == []
    assert verify_pair(tok, Pair("3 + 5 = ", "3 none 5 = ", "8"))  # token counts differ
    wrong = Pair(good.reference, good.counterfactual, "8", operands=good.operands,
                 positions={"A": 1, "B": 4, "operator": 2})
    assert any("position A" in p for p in verify_pair(tok, wrong))


def test_shared_prefix_is_one_per_template_and_never_the_question(templates, tok):
    cands = candidates_for(templates, tok, "addition", few_shot=3, shared_prefix=True, n=60, seed=5)
    prefixes: dict[str, set] = {}
    for c in cands:
        ref = c.pair.reference
        prefix = ref[:ref.rfind("\n") + 1]
        assert prefix.count("\n") == 3 and c.pair.counterfactual.startswith(prefix)
        prefixes.setdefault(c.pair.template, set()).add(prefix)
        shown = {tuple(re.findall(r"\d+", line)[:2]) for line in prefix.splitlines()}
        assert (c.pair.operands["A"], c.pair.operands["B"]) not in shown  # the question is not an example
    assert len(prefixes) > 3 and all(len(p) == 1 for p in prefixes.values())
    assert len(set().union(*prefixes.values())) == len(prefixes)  # each template its own examples
    again = candidates_for(templates, tok, "addition", few_shot=3, shared_prefix=True, n=60, seed=5)
    assert [c.pair.to_dict() for c in again] == [c.pair.to_dict() for c in cands]
    per_prompt = candidates_for(templates, tok, "addition", few_shot=3, n=60, seed=5)
    assert len({c.pair.reference[:c.pair.reference.rfind("\n")] for c in per_prompt}) > len(prefixes)
