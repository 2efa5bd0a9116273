"""Transfer sets and their before/after accuracy against a direct computation."""
import torch

from keyheads.analysis import transfer as tr
from keyheads.analysis.common import all_heads
from keyheads.analysis.knockout_run import transfer_sets
from keyheads.analysis.settings import KnockoutSettings
from keyheads.knockout import compute_means
from keyheads.selection import Notes

from tests.helpers import PREFIX, make_rows, write_rows


def test_generated_sets_have_the_right_answers(llama):
    md = tr.multidigit(llama, 5)
    assert md.prompts[0].endswith("281 + 135 = ") and md.answers[0] == "416"
    dec = tr.decimal(llama, 5)
    assert dec.prompts[0].endswith("4.2 plus 2.5 equals to ") and dec.answers[0] == "6.7"
    ys = tr.year_span(llama, 30, seed=3)
    assert ys.prompts[0].endswith("The war lasted 5 years from 1723 to 172") and ys.answers[0] == "8"
    for p, a in zip(ys.prompts, ys.answers):
        line = p.splitlines()[-1].split()
        years, start, end_prefix = int(line[3]), int(line[-3]), line[-1]
        assert end_prefix + a == str(start + years)
    for s in (md, dec, ys):
        assert [llama.tokenizer.decode([t]) for t in s.answer_ids] == [a[0] for a in s.answers]


def test_benchmark_sets_keep_the_papers_case(llama, shared_data):
    sv = tr.benchmark(llama, "svamp", shared_data, n=5, prefer="Danny has 12 bottle caps")
    assert len(sv.prompts) == 5 and "Danny has 12 bottle caps" in sv.prompts[sv.case]
    assert all(p.endswith("The answer is ") for p in sv.prompts)
    assert [llama.tokenizer.decode([t]) for t in sv.answer_ids] == [a[0] for a in sv.answers]
    gs = tr.benchmark(llama, "gsm8k", shared_data, n=3)
    assert len(gs.prompts) == 3 and all(a.lstrip("-")[0].isdigit() for a in gs.answers)
    assert tr.format_number(51.0) == "51" and tr.format_number(2.5) == "2.5"


def test_evaluate_equals_direct_knockout(llama, tmp_path):
    rows = make_rows(12)
    cfs = [r["counterfactual"] for r in rows]
    heads = [(1, 0), (2, 3), (2, 1)]
    full = compute_means(llama, cfs, heads=all_heads(llama), progress=False)
    from keyheads.analysis.common import knockout_subset

    ko = knockout_subset(full, heads)
    refs = [r["reference"] for r in rows]
    clean = llama.forward(llama.encode(refs))[:, -1].argmax(-1)
    answers = [llama.tokenizer.decode([t]) for t in clean[:8]] + ["0"] * 4  # 8 right, 4 (probably) wrong
    tset = tr._finish(llama, "mine", refs, answers)
    control, other = knockout_subset(full, [(0, 0), (0, 2), (1, 3)]), knockout_subset(full, [(1, 1), (2, 2), (0, 1)])
    row, case = tr.evaluate(llama, tset, ko, batch_size=5, progress=False, controls=[control, other])
    direct_ko = compute_means(llama, cfs, heads=heads, progress=False)
    after_logits = llama.run(llama.encode(refs), edit=direct_ko.edits())[0][:, -1]
    ids = torch.tensor(tset.answer_ids)
    assert row.accuracy_before == (clean == ids).float().mean().item()
    assert row.accuracy_after == (after_logits.argmax(-1) == ids).float().mean().item()
    assert row.relative_change == (row.accuracy_after - row.accuracy_before) / row.accuracy_before
    direct_control = compute_means(llama, cfs, heads=[(0, 0), (0, 2), (1, 3)], progress=False)
    control_logits = llama.run(llama.encode(refs), edit=direct_control.edits())[0][:, -1]
    direct_other = compute_means(llama, cfs, heads=[(1, 1), (2, 2), (0, 1)], progress=False)
    other_logits = llama.run(llama.encode(refs), edit=direct_other.edits())[0][:, -1]
    draws = [(logits.argmax(-1) == ids).float().mean().item() for logits in (control_logits, other_logits)]
    assert row.accuracy_random_draws == draws and row.random_draws() == draws
    assert row.accuracy_random_heads == sum(draws) / 2  # the band's mean
    assert row.relative_change_random_heads == (sum(draws) / 2 - row.accuracy_before) / row.accuracy_before
    assert case.prompt == refs[0] and len(case.before) == 5
    assert case.before[0][0] == answers[0]
    p = after_logits[0].softmax(-1)
    assert abs(case.after[0][1] - p.max().item()) < 1e-5
    assert row.fallback == ""  # same lengths as the counterfactuals: no fallback


def test_longer_prompts_report_the_fallback(llama):
    full = compute_means(llama, ["1 @ 2 = "], heads=[(0, 0)], progress=False)
    tset = tr.multidigit(llama, 3)
    row, _ = tr.evaluate(llama, tset, full, progress=False)
    assert "3/3" in row.fallback and "global mean" in row.fallback


def test_table_says_n_a_when_nothing_was_right_before():
    from keyheads.analysis.transfer import format_table
    from keyheads.results.knockout import TransferRow

    table = format_table([TransferRow.measured("svamp", 10, 0.0, 0.0), TransferRow.measured("add", 10, 0.5, 0.2)])
    rows = table.splitlines()[2:]
    assert rows[0].split()[-1] == "n/a" and rows[1].split()[-1] == "-60.0%"


def test_transfer_prompts_are_as_few_shot_as_the_identification_data(llama, shared_data, tmp_path):
    """Figure 4's prompts are zero-shot, as the paper's data is: the transfer sets follow the data's shot count."""
    def lines_before_question(prompt: str) -> int:
        return prompt.count("\n")

    for name, shots in (("zero", 0), ("three", 3)):
        rows = make_rows(8)
        prefix = "".join(f"{k} + 1 = {k + 1}\n" for k in range(1, shots + 1))
        for row in rows:  # `shots` solved examples, one a line, before each question (`keyheads data --few-shot`)
            for key in ("reference", "counterfactual"):
                row[key] = prefix + row[key].removeprefix(PREFIX)
            row["positions"] = {k: v - len(PREFIX) + len(prefix) for k, v in row["positions"].items()}
        data = write_rows(tmp_path / f"{name}.jsonl", rows)
        sets = transfer_sets(llama, str(data), KnockoutSettings(transfer_n=4, limit=None), None, str(shared_data),
                             Notes())
        assert tr.data_shots(sets[0].prompts) == shots  # the identification data itself
        generated = sets[1:]
        assert [s.name.split(" ")[0] for s in generated] == ["multi-digit", "decimal", "year", "SVAMP", "GSM8K"]
        for tset in generated:
            want = min(shots, 2) if tset.name.startswith("year") else shots  # year spans have two examples
            assert all(lines_before_question(p) == want for p in tset.prompts), tset.name
