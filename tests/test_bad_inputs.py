"""Every `keyheads` command on the inputs a user gets wrong: one line, `keyheads CMD: error: ...`, exit 2.

Empty, truncated and foreign files, pairs that do not align, multi-token answers, YAML that does not
parse, and settings out of range: each is the user's to fix, so the CLI names it in one line and never
shows a traceback (which would say "bug"). The commands run in-process on a tiny random model saved as a
local folder; every case fails before any real work (most before the model loads). `keyheads models`
takes no input, so it has no case here.
"""
import json
import re

import pytest

from keyheads.cli import main
from keyheads.testing import tiny_model

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
PAIR = {"reference": "3 + 4 = ", "counterfactual": "3 @ 4 = ", "answer": "7"}
# the tiny models' tokenizer has one token a character: "plus" is four tokens where "@" is one
MISALIGNED = {"reference": "3 + 4 = ", "counterfactual": "3 plus 4 = ", "answer": "7"}
MULTI_TOKEN = {"reference": "9 + 9 = ", "counterfactual": "9 @ 9 = ", "answer": "18"}
HEADS = [[-(4 * layer + head) / 100 for head in range(4)] for layer in range(3)]


def jsonl(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# name -> file content (bytes for foreign files); "{...}" in a case's argv names one of these
FILES = {
    "empty.jsonl": "",
    "blank.jsonl": "\n\n",
    "half.jsonl": jsonl(PAIR) + jsonl(PAIR)[:20],
    "image.jsonl": PNG,
    "table.jsonl": "reference,counterfactual,answer\n3 + 4 = ,3 @ 4 = ,7\n",
    "misaligned.jsonl": jsonl(PAIR, MISALIGNED),
    "multi.jsonl": jsonl(PAIR, MULTI_TOKEN),
    "pairs.jsonl": jsonl(PAIR, PAIR),
    "effects-half.json": json.dumps({"metric": "relative-logit", "heads": HEADS, "mlps": [0.0] * 3})[:40],
    "effects.png": PNG,
    "train-empty.jsonl": "",
    "train-half.jsonl": jsonl({"prompt": "1 + 2 = ", "completion": "3"})[:15],
    "train-image.jsonl": PNG,
    "templates-empty.yaml": "",
    "templates-half.yaml": 'templates:\n  - {id: my-add, task: addition, text: "{A} plus {B',
    "templates.png": PNG,
    "run-half.yaml": "model: smollm2-135m\nidentify: {top_k: [1,\n",
    "run-list.yaml": "- model\n- out\n",
    "run.png": PNG,
}


def _adapter_folder(root, adapter: bytes):
    """A finished precise run's folder whose adapter.safetensors is `adapter` (truncated, foreign)."""
    root.mkdir()
    (root / "finetune.json").write_text(json.dumps({"base_model": "tiny", "base_fingerprint": "x",
                                                    "method": "precise", "tuned_params": 1, "train": {}}))
    (root / "adapter.safetensors").write_bytes(adapter)
    return root


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Every bad file, a tiny model folder ({model}) and broken copies of it, by the names the cases use."""
    root = tmp_path_factory.mktemp("bad-inputs")
    found = {}
    for name, content in FILES.items():
        path = root / name
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        found[name] = path
    model = tiny_model("llama")
    found["model"] = root / "model"
    model.hf.save_pretrained(found["model"])
    model.tokenizer.save_pretrained(found["model"])
    weights = (found["model"] / "model.safetensors").read_bytes()
    found["adapter-half"] = _adapter_folder(root / "adapter-half", weights[:len(weights) // 2])
    found["adapter-image"] = _adapter_folder(root / "adapter-image", PNG)
    for name, change in (("model-half", lambda f: f.write_bytes(weights[:len(weights) // 2])),
                         ("model-config-half", None)):
        folder = found[name] = root / name
        folder.mkdir()
        for f in found["model"].iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        if change:
            change(folder / "model.safetensors")
        else:
            text = (folder / "config.json").read_text()
            (folder / "config.json").write_text(text[:len(text) // 2])
    found["empty-dir"] = root / "empty-dir"
    found["empty-dir"].mkdir()
    return found


M = ["--model", "{model}", "--device", "cpu", "--quiet"]
CASES = {
    # patch: the pairs file
    "identify-empty-file": ["identify", *M, "--data", "{empty.jsonl}", "--out", "{out}"],
    "identify-blank-lines": ["identify", *M, "--data", "{blank.jsonl}", "--out", "{out}"],
    "identify-truncated-jsonl": ["identify", *M, "--data", "{half.jsonl}", "--out", "{out}"],
    "identify-png-as-jsonl": ["identify", *M, "--data", "{image.jsonl}", "--out", "{out}"],
    "identify-csv-as-jsonl": ["identify", *M, "--data", "{table.jsonl}", "--out", "{out}"],
    "identify-misaligned-pairs": ["identify", *M, "--data", "{misaligned.jsonl}", "--out", "{out}"],
    "identify-multi-token-answer": ["identify", *M, "--data", "{multi.jsonl}", "--out", "{out}"],
    "identify-batch-size-0": ["identify", *M, "--data", "{pairs.jsonl}", "--out", "{out}", "--batch-size", "0"],
    "identify-model-truncated-safetensors": ["identify", "--model", "{model-half}", "--device", "cpu", "--quiet",
                                          "--data", "{pairs.jsonl}", "--out", "{out}"],
    # data: template files, ranges, and a model that answers nothing
    "data-empty-template-file": ["data", *M, "--template-files", "{templates-empty.yaml}", "--out", "{out}/p.jsonl"],
    "data-truncated-template-file": ["data", *M, "--template-files", "{templates-half.yaml}",
                                     "--out", "{out}/p.jsonl"],
    "data-png-as-template-file": ["data", *M, "--template-files", "{templates.png}", "--out", "{out}/p.jsonl"],
    "data-n-0": ["data", *M, "-n", "0", "--out", "{out}/p.jsonl"],
    "data-nothing-correct": ["data", *M, "-n", "3", "--keep-correct", "--out", "{out}/p.jsonl"],
    # eval
    "eval-batch-size-0": ["eval", *M, "--benchmarks", "arith-multi", "--batch-size", "0", "--out", "{out}"],
    "eval-limit-negative": ["eval", *M, "--benchmarks", "arith-multi", "--limit", "-1", "--out", "{out}"],
    "eval-truncated-adapter": ["eval", "--device", "cpu", "--quiet", "--adapter", "{adapter-half}",
                               "--benchmarks", "arith-multi", "--out", "{out}"],
    "eval-empty-knockout-data": ["eval", *M, "--knockout", "0.1", "--knockout-data", "{empty.jsonl}",
                                 "--benchmarks", "arith-multi", "--limit", "1", "--out", "{out}"],
    "eval-empty-data-dir": ["eval", *M, "--benchmarks", "gsm8k", "--data-dir", "{empty-dir}", "--out", "{out}"],
    # the analyses
    "knockout-empty-file": ["knockout", *M, "--data", "{empty.jsonl}", "--heads", "0.1", "--out", "{out}",
                            "--no-transfer"],
    "knockout-truncated-effects": ["knockout", *M, "--data", "{pairs.jsonl}", "--effects", "{effects-half.json}",
                                   "--out", "{out}"],
    "knockout-png-as-effects": ["knockout", *M, "--data", "{pairs.jsonl}", "--effects", "{effects.png}",
                                "--out", "{out}"],
    "knockout-k-negative": ["knockout", *M, "--data", "{pairs.jsonl}", "--heads", "0.1", "-k", "-1",
                            "--out", "{out}"],
    "attention-truncated-jsonl": ["attention", *M, "--data", "{half.jsonl}", "--heads", "0.1", "--out", "{out}"],
    "attention-csv-as-jsonl": ["attention", *M, "--data", "{table.jsonl}", "--heads", "0.1", "--out", "{out}"],
    "attention-misaligned-pairs": ["attention", *M, "--data", "{misaligned.jsonl}", "--heads", "0.1",
                                   "--out", "{out}"],
    "mlp-empty-file": ["mlp", *M, "--data", "{empty.jsonl}", "--out", "{out}"],
    "mlp-png-as-jsonl": ["mlp", *M, "--data", "{image.jsonl}", "--out", "{out}"],
    "mlp-batch-size-0": ["mlp", *M, "--data", "{pairs.jsonl}", "--batch-size", "0", "--out", "{out}"],
    # fine-tuning
    "finetune-empty-train-file": ["finetune", *M, "--train", "{train-empty.jsonl}", "--heads", "0.1",
                                  "--out", "{out}"],
    "finetune-truncated-train-file": ["finetune", *M, "--train", "{train-half.jsonl}", "--heads", "0.1",
                                      "--out", "{out}"],
    "finetune-png-as-train-file": ["finetune", *M, "--train", "{train-image.jsonl}", "--heads", "0.1",
                                   "--out", "{out}"],
    "finetune-lr-negative": ["finetune", *M, "--train", "arith:multidigit:4", "--heads", "0.1", "--lr", "-1",
                             "--out", "{out}"],
    "finetune-truncated-effects": ["finetune", *M, "--train", "arith:multidigit:4", "--effects",
                                   "{effects-half.json}", "--top-k", "2", "--out", "{out}"],
    "merge-truncated-adapter": ["merge", "--adapter", "{adapter-half}", "--out", "{out}"],
    "merge-png-as-adapter": ["merge", "--adapter", "{adapter-image}", "--out", "{out}"],
    # the whole study
    "run-truncated-yaml": ["run", "{run-half.yaml}", "--out", "{out}"],
    "run-yaml-not-a-mapping": ["run", "{run-list.yaml}", "--out", "{out}"],
    "run-png-as-yaml": ["run", "{run.png}", "--out", "{out}"],
    "run-missing-yaml": ["run", "{out}/nope.yaml", "--out", "{out}"],
    "run-batch-size-0": ["run", "--batch-size", "0", "--out", "{out}"],
    "run-lr-negative": ["run", "--finetune.lr", "-1", "--out", "{out}"],
    "demo-batch-size-0": ["demo", "--batch-size", "0", "--out", "{out}"],
    "demo-data-n-negative": ["demo", "--data.n", "-5", "--out", "{out}"],
    # the others
    "plan-gpus-0": ["plan", "--model", "{model}", "--gpus", "0"],
    "plan-gpu-memory-unreadable": ["plan", "--model", "{model}", "--gpu-memory", "80 gigs"],
    "plan-truncated-config": ["plan", "--model", "{model-config-half}"],
    "generate-max-new-tokens-0": ["generate", "--model", "{model}", "--device", "cpu", "--max-new-tokens", "0",
                                  "1 + 1 = "],
    "generate-truncated-safetensors": ["generate", "--model", "{model-half}", "--device", "cpu", "1 + 1 = "],
    "generate-truncated-config": ["generate", "--model", "{model-config-half}", "--device", "cpu", "1 + 1 = "],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_is_one_line_and_exit_2(case, paths, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KEYHEADS_DATA", raising=False)
    argv = CASES[case]
    command = argv[0]
    names = {**{k: str(v) for k, v in paths.items()}, "out": str(tmp_path / "out")}
    # an exception other than UserError leaves main(): in a shell, a traceback
    code = main([re.sub(r"\{([^}]+)\}", lambda m: names[m[1]], a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith(f"keyheads {command}: error: ")]
    assert len(errors) == 1, err
    # the one line is the last thing said (a model may report its loading before it)
    assert err.rstrip("\n").splitlines()[-1] == errors[0], err
