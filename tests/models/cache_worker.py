"""One process of test_cache_processes.py (launched by torch.distributed.run): with a process group up, as
under any launcher, every rank asks for the same GGUF file's cache at once. Reading the GGUF is replaced by
a tiny model (the reading is not what is tested); saving, locking and checking are keyheads' own.

    python -m torch.distributed.run --standalone --nproc_per_node 2 cache_worker.py FAKE.gguf RESULTS
"""
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from keyheads.models import loading
from keyheads.testing import tiny_model

torch.set_num_threads(1)
gguf, results = Path(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
reads = []


def read_tiny(path, tied=False, whole=False):
    reads.append(str(path))
    time.sleep(1.0)  # a real conversion takes 30 s or more: the other rank arrives while this one converts
    model = tiny_model("llama", seed=0)
    return model.hf, model.tokenizer


loading._read_gguf = read_tiny
dist.barrier()  # both ranks ask at the same moment
folder = loading.ensure_converted(str(gguf), progress=False)
dist.barrier()
facts = {"rank": rank, "reads": len(reads), "folder": str(folder), "valid": loading._cache_valid(folder),
         "files": sorted(p.name for p in folder.iterdir())}
results.mkdir(parents=True, exist_ok=True)
(results / f"rank{rank}.json").write_text(json.dumps(facts))
dist.destroy_process_group()
