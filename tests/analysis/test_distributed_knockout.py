"""`keyheads knockout` in two processes (gloo) splits the knockout sets and writes what one process writes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed

from keyheads.cli import main
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_effects, write_rows

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


def test_two_processes_write_the_same_knockout_results(tmp_path):
    model = tiny_model("llama")
    folder = tmp_path / "model"
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    rows = []
    for row in make_rows(n=60):  # answers = the model's own predictions, so that knockouts have something to break
        ids = torch.tensor([model.tokens(row["reference"], add_special_tokens=True)])
        answer = model.tokenizer.decode([int(model.forward(ids)[0, -1].argmax())])
        if answer.isalnum():
            rows.append({**row, "answer": answer})
    assert len(rows) >= 12
    pairs = write_rows(tmp_path / "pairs.jsonl", rows)
    effects = write_effects(tmp_path / "effects.json", (-np.arange(12).reshape(3, 4) / 100.0).tolist())

    def argv(out):
        return ["knockout", "--model", str(folder), "--data", str(pairs), "--effects", str(effects), "--top-k", "3",
                "-k", "8", "--seeds", "3", "--transfer-n", "12", "--out", str(out), "--quiet",
                "--dtype", "float64"]  # float64: no near-tie of a random model flips with the batching

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
           "-m", "keyheads.cli", *argv(tmp_path / "two")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert main(argv(tmp_path / "one")) == 0
    one = json.loads((tmp_path / "one" / "knockout.json").read_text())
    two = json.loads((tmp_path / "two" / "knockout.json").read_text())
    assert one["curves"] == two["curves"] and one["key_heads"] == two["key_heads"]
    assert one["transfer"]["rows"] == two["transfer"]["rows"] and len(one["transfer"]["rows"]) >= 4
    assert min(one["curves"]["effect_rank"]) < one["curves"]["effect_rank"][0]  # the knockouts did something
    assert (tmp_path / "two" / "knockout_curves.png").exists()
