"""The shared-prefix forward, greedy generation and letter scoring against direct computations."""
import pytest
import torch

from keyheads.evaluation import EvalSettings
from keyheads.evaluation.engine import PrefixKV, next_token_logits
from keyheads.evaluation.prompts import letter_tokens
from keyheads.evaluation.tasks import make_task
from keyheads.testing import char_tokenizer, tiny_model
from keyheads.testing.oracles import greedy_generate

SHOTS = "3+4=7\n1+1=2\n6+2=8\n5+4=9\n2+5=7\n"
PROMPTS = [SHOTS + "3+3=", SHOTS + "12+5=", SHOTS + "9+99=", SHOTS + "4+0="]


def _rows(model, prompts):
    return [model.tokenizer(p)["input_ids"] for p in prompts]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_prefix_cache_gives_the_logits_of_separate_runs(family):
    model = tiny_model(family)
    rows = _rows(model, PROMPTS)
    prefix = PrefixKV(model, min_len=4)
    got = next_token_logits(model, rows, prefix)
    want = torch.stack([model.forward(torch.tensor([r]))[0, -1] for r in rows])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # a second batch reuses the stored prefix instead of computing it again
    next_token_logits(model, rows[:2], prefix)
    if family == "gemma3":  # sliding-window layers cannot share a prefix: computed per batch instead
        assert not prefix.enabled
    else:
        assert prefix.computed == 1 and prefix.ids == rows[0][:len(prefix.ids)]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_generation_equals_transformers_generate(family):
    model = tiny_model(family, seed=3)
    rows = _rows(model, PROMPTS)
    got = greedy_generate(model, rows, 10, lambda text: None, PrefixKV(model, min_len=4))
    for row, (text, finish) in zip(rows, got):
        out = model.hf.generate(input_ids=torch.tensor([row]), attention_mask=torch.ones(1, len(row), dtype=torch.long),
                                max_new_tokens=10, do_sample=False, pad_token_id=model.tokenizer.pad_token_id)
        want = model.tokenizer.decode(out[0, len(row):], skip_special_tokens=True)
        assert text == want[:len(text)]
        assert finish == "eos" or text == want


def test_generation_stops_where_told():
    model = tiny_model("llama", seed=3)
    rows = _rows(model, PROMPTS)
    free = greedy_generate(model, rows, 8, lambda text: None)
    cut = greedy_generate(model, rows, 8, lambda text: 1 if len(text) >= 3 else None)
    for (a, _), (b, why) in zip(free, cut):
        if len(a) >= 3:
            assert why == "stop" and b == a[:1]


def test_letter_tokens_for_a_tokenizer_that_splits_the_space():
    tok = char_tokenizer()
    lt = letter_tokens(tok, 5)
    assert lt.extra == tuple(tok.convert_tokens_to_ids([" "]))
    assert lt.letters == tuple(tok.convert_tokens_to_ids(list("ABCDE")))


@pytest.mark.real_model
def test_letter_tokens_for_a_tokenizer_that_merges_the_space():
    from transformers import AutoTokenizer

    from keyheads.models import ensure_converted

    tok = AutoTokenizer.from_pretrained(ensure_converted("smollm2-135m"))
    lt = letter_tokens(tok, 4)
    assert lt.extra == ()
    # exactly the token that "Answer: B" ends with in context
    assert tok("Q\nAnswer: B", add_special_tokens=False)["input_ids"][-1] == lt.letters[1]
    assert [tok.decode([t]) for t in lt.letters] == [" A", " B", " C", " D"]


@pytest.mark.parametrize("bench", ["mmlu", "csqa"])
def test_letter_scores_equal_a_direct_forward(tiny, tiny_data, bench):
    task = make_task(bench, EvalSettings(few_shot=1), str(tiny_data))
    rows = [r for _, r in sorted(task.run(tiny, task.items, PrefixKV(tiny, min_len=4), EvalSettings(), 16))]
    tok = tiny.tokenizer
    for item, row in zip(task.items, rows):
        ids = tok(item.prompt + " ")["input_ids"]  # the char tokenizer: the space is its own token
        logits = tiny.forward(torch.tensor([ids]))[0, -1]
        letters = tok.convert_tokens_to_ids(list("ABCDE"[:len(item.record.choices)]))
        torch.testing.assert_close(torch.tensor(row["scores"]), logits[letters], atol=1e-4, rtol=0)


def test_boosted_letter_wins(tiny, tiny_data):
    """An unembedding hook that favours "C": every prediction is C, accuracy is the share of C answers."""
    c = tiny.tokenizer.convert_tokens_to_ids("C")

    def boost(module, args, output):
        output = output.clone()
        output[..., c] += 1000.0
        return output

    handle = tiny.hf.get_output_embeddings().register_forward_hook(boost)
    try:
        for bench in ("mmlu", "csqa"):
            task = make_task(bench, EvalSettings(few_shot=1), str(tiny_data))
            raw = [r for _, r in sorted(task.run(tiny, task.items, None, EvalSettings(), 16))]
            rows = [task.score(it, r) for it, r in zip(task.items, raw)]
            assert all(r["pred"] == 2 for r in rows)
            summary = task.summarize(task.items, rows)
            assert summary["correct"] == sum(it.record.letter == "C" for it in task.items)
    finally:
        handle.remove()


@pytest.mark.parametrize("every", [3, 8])
def test_reading_tokens_back_every_few_steps_ends_rows_where_a_check_per_step_does(every):
    model = tiny_model("llama", seed=3)
    rows = _rows(model, PROMPTS)
    stop = lambda text: 2 if len(text) >= 5 else None  # noqa: E731  rows end at different steps
    per_step = greedy_generate(model, rows, 12, stop, PrefixKV(model, min_len=4), check_every=1)
    chunked = greedy_generate(model, rows, 12, stop, PrefixKV(model, min_len=4), check_every=every)
    assert chunked == per_step
    assert {why for _, why in per_step} - {"eos"}, "the stop or the budget must end some row"


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
@pytest.mark.parametrize("width,every", [(2, 1), (3, 4)])
def test_rows_that_join_a_running_batch_end_as_they_would_alone(family, width, every):
    """Continuous batching: rows enter as others end (gemma3's sliding layers: when all have ended)."""
    model = tiny_model(family, seed=3)
    prompts = PROMPTS + [SHOTS + "7+7=", SHOTS + "10+20=", SHOTS + "1+2+3="]
    rows = _rows(model, prompts)
    stop = lambda text: len(text) if sum(map(ord, text)) % 5 == 0 else None  # noqa: E731  ends vary with the text
    alone = [greedy_generate(model, [r], 10, stop)[0] for r in rows]
    together = greedy_generate(model, rows, 10, stop, PrefixKV(model, min_len=4), batch_size=width,
                               check_every=every)
    assert together == alone
    if family != "gemma3":  # the tiny gemma3 repeats one token: it checks the batch-after-batch path only
        assert len({len(t) for t, _ in alone}) > 1, "rows must end at different steps for the test to mean anything"


def test_rows_that_joined_are_still_checked_every_step(monkeypatch):
    """A row that joins must stop where its text is complete, not run on to the budget unchecked."""
    model = tiny_model("llama", seed=3)
    rows = _rows(model, PROMPTS + [SHOTS + "7+7=", SHOTS + "10+20="])
    stop = lambda text: len(text) if len(text) >= 3 else None  # noqa: E731
    decoded = []
    real = model.hf.forward

    def counting(*args, **kwargs):
        if kwargs["input_ids"].shape[1] == 1:
            decoded.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(model.hf, "forward", counting)
    out = greedy_generate(model, rows, 40, stop, PrefixKV(model, min_len=4), batch_size=2, check_every=1)
    tokens = sum(len(model.tokenizer(t)["input_ids"]) for t, _ in out)
    assert all(why in ("stop", "eos") for _, why in out)
    assert sum(decoded) <= tokens + 2 * len(rows), f"{sum(decoded)} row-steps for {tokens} tokens"
