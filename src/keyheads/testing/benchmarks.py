"""A hand-made benchmark folder in the original formats, a few items each, for tiny random models: the tests'
data and the code witness's (keyheads.study.witness)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

MATH = [  # (question, worked solution, answer)
    ("Tom has 2 cats and 3 dogs. How many pets?", "2+3=<<2+3=5>>5", "5"),
    ("Ann has 4 pens and buys 3. How many now?", "4+3=<<4+3=7>>7", "7"),
    ("A box holds 6 eggs. How many in 2 boxes?", "6*2=<<6*2=12>>12", "12"),
    ("Sam had 9 cards and lost 4. How many left?", "9-4=<<9-4=5>>5", "5"),
    ("Kim reads 8 pages a day. Pages in 3 days?", "8*3=<<8*3=24>>24", "24"),
    ("Joe has 1,200 coins and 300 more. Total?", "1200+300=<<1200+300=1500>>1500", "1,500"),
]
CHOICE = [  # (question, choices, label)
    ("2+2?", ["3", "4", "5", "6"], 1), ("Sky colour?", ["red", "blue", "green", "gold"], 1),
    ("5-3?", ["2", "1", "0", "9"], 0), ("Ice is?", ["hot", "wet", "cold", "loud"], 2),
    ("1*7?", ["1", "8", "6", "7"], 3), ("Sun is a?", ["star", "moon", "rock", "tree"], 0),
]


def write_tiny_benchmarks(root: Path, mmlu_subjects: tuple[str, str] = ("math", "science")) -> Path:
    """A data folder of every benchmark, a few items each, small enough for tiny random models; MMLU has two
    subjects (name real ones, e.g. formal_logic and astronomy, for the MMLU categories)."""
    (root / "gsm8k").mkdir()
    for split, problems in (("train", MATH[:3]), ("test", MATH)):
        with open(root / "gsm8k" / f"{split}.jsonl", "w") as f:
            for q, sol, a in problems:
                f.write(json.dumps({"question": q, "answer": f"{sol}\n#### {a}"}) + "\n")
    plain = [(q, float(a.replace(",", ""))) for q, _, a in MATH]
    for name, file in (("addsub", "AddSub.json"), ("singleeq", "questions.json")):
        (root / name).mkdir()
        (root / name / file).write_text(json.dumps(
            [{"iIndex": i, "sQuestion": q, "lEquations": [f"X={a}"], "lSolutions": [str(a)]}
             for i, (q, a) in enumerate(plain)]))
    (root / "svamp").mkdir()
    (root / "svamp" / "SVAMP.json").write_text(json.dumps(
        [{"ID": f"chal-{i}", "Body": q.split(". ")[0] + ".", "Question": q.split(". ")[-1], "Equation": str(a),
          "Answer": a, "Type": "Addition"} for i, (q, a) in enumerate(plain)]))
    first, second = mmlu_subjects
    for split, subjects in (("dev", {first: CHOICE[:2], second: CHOICE[2:4]}),
                            ("test", {first: CHOICE[:3], second: CHOICE[3:]})):
        (root / "mmlu" / split).mkdir(parents=True)
        for subject, rows in subjects.items():
            with open(root / "mmlu" / split / f"{subject}_{split}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["question", "choice0", "choice1", "choice2", "choice3", "answer"])
                for q, ch, label in rows:
                    writer.writerow([q, *ch, label])
    (root / "csqa").mkdir()
    for split, rows in (("train", CHOICE + CHOICE), ("dev", CHOICE)):
        with open(root / "csqa" / f"{split}_rand_split.jsonl", "w") as f:
            for i, (q, ch, label) in enumerate(rows):
                choices = [{"label": "ABCDE"[j], "text": t} for j, t in enumerate(ch + ["none"])]
                # train rows cycle their answers through A-E so balanced exemplars exist
                key = "ABCDE"[i % 5] if split == "train" else "ABCD"[label]
                f.write(json.dumps({"id": f"{split}{i}", "answerKey": key,
                                    "question": {"stem": q, "choices": choices}}) + "\n")
    return root
