# ruff: noqa: E501 -- the mutation table: each line one pattern of the source and its replacement
"""Mutate each verdict rule once (a threshold, a test, a missing-evidence branch) and check that the golden cases
of tests/report/test_verdict_rules.py catch it: each mutation is applied to the source, the golden test runs, and
the source is restored. Prints one line per mutation ("caught" or "SURVIVED"); exits 1 if any survived.

    python tools/mutate_rules.py                    # every mutation (one golden-test run each)
    python tools/mutate_rules.py "row3 no Holm"     # only the ones named

A rule added or changed gets its mutations here too. Not part of the test suite: it re-runs the golden test once
per mutation.
"""
import pathlib
import signal
import subprocess
import sys


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # a SIGTERM restores the mutated source too (the finally below), as Ctrl-C does


signal.signal(signal.SIGTERM, _interrupt)

ROOT = pathlib.Path(__file__).resolve().parents[1]
R, F = "src/keyheads/report/rules.py", "src/keyheads/report/findings.py"
M = [
 (R, "FEW_HEADS = 0.05 ", "FEW_HEADS = 0.10 ", "row1 threshold x2"),
 (R, "FEW_HEADS = 0.05 ", "FEW_HEADS = 0.025 ", "row1 threshold /2"),
 (F, "0 < share < FEW_HEADS", "0 <= share < FEW_HEADS", "row1 none counts"),
 (F, 'return _claim(1, "not testable"', 'return _claim(1, "does not hold"', "row1 metric branch"),
 (F, '"holds" if 2 * inside > len(keys.heads)', '"holds" if 2 * inside >= len(keys.heads)', "row2 majority"),
 (F, 'return _claim(2, "not measured"', 'return _claim(2, "does not hold"', "row2 missing"),
 (R, "BEYOND_RANDOM = 0.05 ", "BEYOND_RANDOM = 0.10 ", "row3 gap x2"),
 (R, "BEYOND_RANDOM = 0.05 ", "BEYOND_RANDOM = 0.025 ", "row3 gap /2"),
 (F, "tests = holm([fisher_fewer_p(right, n, _count(d, n), n) for d in draws])", "tests = [fisher_fewer_p(right, n, _count(d, n), n) for d in draws]", "row3 no Holm"),
 (F, "tests = holm([fisher_fewer_p(right, n, _count(d, n), n) for d in draws])", "tests = holm([0.0 if right < _count(d, n) else 1.0 for d in draws])", "row3 no test (sign only)"),
 (F, "wins == len(draws) and len(draws) >= MIN_DRAWS", "wins >= 1 and len(draws) >= MIN_DRAWS", "row3 every draw"),
 (F, 'return _claim(3, "not measured", "no random-head', 'return _claim(3, "partly", "no random-head', "row3 missing control"),
 (F, 'return _claim(3, "not testable", "no prompt', 'return _claim(3, "does not hold", "no prompt', "row3 nothing to break"),
 (F, "if set(order[:n]) != key]", "]", "row3 key-set draws kept"),
 (F, 'return _claim(3, "not testable", f"every random draw', 'return _claim(3, "does not hold", f"every random draw', "row3 no other heads"),
 (R, "TRANSFER_GAP = 0.10 ", "TRANSFER_GAP = 0.20 ", "row4 gap x2"),
 (R, "TRANSFER_GAP = 0.10 ", "TRANSFER_GAP = 0.05 ", "row4 gap /2"),
 (F, "adjusted = holm([p for _, p in flat])", "adjusted = [p for _, p in flat]", "row4 no Holm"),
 (F, "counts.append(all(sig) and", "counts.append(any(sig) and", "row4 every draw"),
 (F, "2 * sum(counts) > len(rows)", "2 * sum(counts) >= len(rows)", "row4 majority"),
 (F, 'return _claim(4, "not testable"', 'return _claim(4, "does not hold"', "row4 not testable"),
 (F, 'return _claim(4, "not measured"', 'return _claim(4, "does not hold"', "row4 missing"),
 (F, '"holds" if 2 * task > len(kinds)', '"holds" if 2 * task >= len(kinds)', "row5 majority"),
 (F, 'return _claim(5, "not measured"', 'return _claim(5, "does not hold"', "row5 missing"),
 (F, 'verdict: Verdict = ("does not hold" if not alo > 0 else "holds" if blo > 0 else "partly")', 'verdict: Verdict = ("does not hold" if not alo > 0 else "holds")', "row6 drop b"),
 (F, "    if d is None:\n", "    if not d:\n", "row6 empty is not testable"),
 (F, 'verdict: Verdict = ("does not hold" if not alo > 0 else "holds" if blo > 0 else "partly")', 'verdict: Verdict = ("does not hold" if not sum(a) > 0 else "holds" if sum(b) > 0 else "partly")', "row6 no bootstrap"),
 (F, "later = [l for l in range(layers) if 2 * l >= layers]", "later = list(range(layers))", "row6 all layers"),
 (R, "MIN_PROMPTS = 20 ", "MIN_PROMPTS = 10 ", "row6 min prompts /2"),
 (R, "MIN_PROMPTS = 20 ", "MIN_PROMPTS = 40 ", "row6 min prompts x2"),
 (F, 'return _claim(6, "not measured", "the mlp record', 'return _claim(6, "does not hold", "the mlp record', "row6 missing measure"),
 (R, "LIKE_FULL = 0.02 ", "LIKE_FULL = 0.04 ", "row7 margin x2"),
 (R, "LIKE_FULL = 0.02 ", "LIKE_FULL = 0.01 ", "row7 margin /2"),
 (F, "return _claim(7, matches_full(pm, fm, _gain(ptests), _gain(ftests)),", "return _claim(7, matches_full(pm, fm, pm > 0, fm > 0),", "row7 no test"),
 (F, "return _claim(7, matches_full(pm, fm, _gain(ptests), _gain(ftests)),", "return _claim(7, matches_full(pm, fm, _gain(ptests) or _gain(ftests), _gain(ftests)),", "row7 full's test counts"),
 (F, "if pm is None or fm is None or not ptests or not ftests:", "if pm is None or fm is None:", "row7 missing per-item"),
 (F, 'return "does not hold" if full_gains else "not testable"', 'return "does not hold"', "row7 not testable"),
 (F, 'return _claim(8, "holds" if pval < ALPHA else "does not hold",', 'return _claim(8, "holds" if dp.kl < df.kl else "does not hold",', "row8 no test"),
 (F, 'return _claim(8, "holds" if pval < ALPHA else "does not hold",', 'return _claim(8, "holds" if dp.kl_ci95[1] < df.kl_ci95[0] else "does not hold",', "row8 overlap rule"),
 (F, "if dp is None or df is None or dp.kl is None or df.kl is None or not dp.kl_ci95 or not df.kl_ci95:", "if False:", "row8 missing"),
 (F, "pvals = holm([mcnemar_greater_p(t.gained, t.lost) for t in tests if t is not None])", "pvals = [mcnemar_greater_p(t.gained, t.lost) for t in tests if t is not None]", "row9 no Holm"),
 (F, '"holds" if wins == len(rows) and len(rows) >= MIN_DRAWS else "partly" if wins', '"holds" if wins >= 1 and len(rows) >= MIN_DRAWS else "partly" if wins', "row9 every draw"),
 (F, "if not rows or any(t is None for t in tests):", "if not rows or all(t is None for t in tests):", "row9 missing per-item"),
 (R, "MIN_DRAWS = 3 ", "MIN_DRAWS = 2 ", "draws /"),
 (R, "MIN_DRAWS = 3 ", "MIN_DRAWS = 4 ", "draws +1"),
 (R, "PAPER_SPEEDUP = 3.0 ", "PAPER_SPEEDUP = 6.0 ", "row10 x2"),
 (R, "PAPER_SPEEDUP = 3.0 ", "PAPER_SPEEDUP = 1.5 ", "row10 /2"),
 (F, "fewer = not is_num(tp) or not is_num(tf) or tp < tf", "fewer = True", "row10 params"),
 (R, "GENERIC_MARGIN = 0.05 ", "GENERIC_MARGIN = 0.10 ", "row11 margin x2"),
 (R, "GENERIC_MARGIN = 0.05 ", "GENERIC_MARGIN = 0.025 ", "row11 margin /2"),
 (F, "and t.ci[0] > -GENERIC_MARGIN for b in testable)", "and t.delta > -GENERIC_MARGIN for b in testable)", "row11 point not interval"),
 (F, "testable = [b for b, p in above.items() if p < ALPHA]", "testable = list(above)", "row11 chance"),
 (F, "drops = any(t.significant and t.delta < 0 for t in math_tests)", "drops = any(t.delta < 0 for t in math_tests)", "row11 math test"),
 (F, "if not math_tests or any(t is None for t in generic_tests.values()):", "if False:", "row11 missing per-item"),
]
ONLY = sys.argv[1:]
out = []
for path, old, new, name in M:
    if ONLY and name not in ONLY:
        continue
    p = ROOT / path
    src = p.read_text()
    if src.count(old) != 1:
        out.append(f"{name}: PATTERN NOT FOUND ({src.count(old)})")
        continue
    p.write_text(src.replace(old, new))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            "tests/report/test_verdict_rules.py"], cwd=ROOT, capture_output=True, text=True)
        failed = [l for l in r.stdout.splitlines() if l.startswith("FAILED")]
        out.append(f"{name}: {'caught' if r.returncode else 'SURVIVED'} {failed[0][7:90] if failed else ''}")
    finally:
        p.write_text(src)
    print(out[-1], flush=True)
sys.exit(any("caught" not in line for line in out))
