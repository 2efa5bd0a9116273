"""One process of the two-process tests in test_distributed.py and test_distributed_run.py
(launched by torch.distributed.run).

    python -m torch.distributed.run --standalone --nproc_per_node 2 dist_worker.py SPEC.json

SPEC.json holds "results" (a folder) and either "identify" and "eval" (argument lists of `keyheads`)
or "study" (see check_study). For the first, every process runs, in order:
  1. keyheads.distributed on its own (shard, gather, map_sharded, errors on one rank);
  2. `keyheads identify` with a crash on rank 1 at its second batch, then the same command again
     (the resume), then with --restart, counting the batches each rank computes;
  3. `keyheads eval`, counting the cache rows each rank appends;
and writes what it saw to RESULTS/rank{r}.json.
"""
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)


def outcome(fn):
    """-> (value, None) or (None, "ErrorType: message")."""
    try:
        return fn(), None
    except Exception as err:  # noqa: BLE001 - what each rank saw is the point
        return None, f"{type(err).__name__}: {err}"


def check_distributed(r: int) -> dict:
    import numpy as np

    from keyheads import distributed as d

    seen = []

    def times_ten(sub):
        seen.append(list(sub))
        return [x * 10 for x in sub]

    facts = {"launched": d.launched(), "rank": d.rank(), "world": d.world(), "device": d.default_device(),
             "backend": torch.distributed.get_backend(), "shard7": d.shard(7)}
    facts["full"] = d.map_sharded(times_ten, list(range(7)))
    facts["empty"] = d.map_sharded(times_ten, [])
    facts["one"] = d.map_sharded(times_ten, [5])
    facts["calls"] = seen
    facts["gathered"] = [a.tolist() for a in d.gather(np.arange(3) + r)]

    def fails_on_rank1(sub):
        if r == 1:
            raise ValueError("bad item")
        return sub

    facts["error"] = outcome(lambda: d.map_sharded(fails_on_rank1, list(range(4))))[1]
    facts["wrong_length"] = outcome(lambda: d.map_sharded(lambda sub: [] if r == 0 else sub, list(range(4))))[1]
    facts["bad_n"] = outcome(lambda: d.shard(-1))[1]
    d.barrier()
    return facts


def check_patch(r: int, argv: list[str]) -> dict:
    import numpy as np

    import keyheads.patching.sweep as sweep_module
    from keyheads.cli import main

    real = sweep_module.PATCH_METHODS["path"]
    calls = {"n": 0}

    def crash_on_rank1(*args, **kwargs):
        calls["n"] += 1
        if r == 1 and calls["n"] == 2:
            raise RuntimeError("simulated crash")
        return real(*args, **kwargs)

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    out = Path(argv[argv.index("--out") + 1])
    facts = {}
    sweep_module.PATCH_METHODS["path"] = crash_on_rank1
    facts["crash"] = outcome(lambda: main(argv))[1]
    facts["crash_calls"] = calls["n"]
    with np.load(out / f"per_sample.rank{r}of2.npz") as saved:
        facts["checkpointed"] = np.flatnonzero(saved["done"]).tolist()
    sweep_module.PATCH_METHODS["path"] = counting
    for name, args in (("resume", argv), ("restart", argv + ["--restart"])):
        calls["n"] = 0
        code, error = outcome(lambda args=args: main(args))
        facts[name] = {"code": code, "error": error, "calls": calls["n"]}
        if name == "resume":
            facts["effects_after_resume"] = (out / "effects.json").read_text() if r == 0 else None
    sweep_module.PATCH_METHODS["path"] = real
    return facts


def check_eval(argv: list[str]) -> dict:
    import keyheads.evaluation.cache as cache_module
    from keyheads.cli import main

    added = {"rows": 0}
    real = cache_module.ResultCache.add

    def counting(self, rows):
        rows = list(rows)
        added["rows"] += len(rows)
        return real(self, rows)

    cache_module.ResultCache.add = counting
    code, error = outcome(lambda: main(argv))
    cache_module.ResultCache.add = real
    return {"code": code, "error": error, "rows_added": added["rows"]}


def check_study(spec: dict) -> dict:
    """`keyheads run` twice: first with a data stage that fails on the main process ("fail_out"),
    then the whole study ("argv"); main() then calls fail_on_one_process. The data stage copies
    "pairs" (a random tiny model gets no sum right, so the real one would keep nothing). Counts
    which stage functions each process called, the forward passes each made in each stage, and
    the device each asked the model onto."""
    import shutil

    import keyheads.models
    import keyheads.pipeline as pipeline
    from keyheads.cli import main
    from keyheads.errors import UserError

    stage = {"now": None}
    calls: dict = {}
    forwards: dict = {}
    devices = []
    real_load = keyheads.models.loading.load_model

    def load(name, device=None, dtype=None, **kw):
        devices.append(device)
        model = real_load(name, device=device, dtype=dtype, **kw)

        def count(*_):  # copied along with the module when a stage deep-copies it to train
            forwards[stage["now"]] = forwards.get(stage["now"], 0) + 1
        # every pass starts at the embeddings (patching runs the layers one by one)
        model.hf.get_input_embeddings().register_forward_pre_hook(count)
        return model

    def given_pairs(cfg, run, model, progress=True):
        if str(run) == spec["fail_out"]:
            raise UserError("no pairs in this test")
        shutil.copy(spec["pairs"], run / "pairs.jsonl")

    def counted(name, fn):
        def wrapped(*args, **kwargs):
            stage["now"] = name
            calls[name] = calls.get(name, 0) + 1
            try:
                return fn(*args, **kwargs)
            finally:
                stage["now"] = None
        return wrapped

    keyheads.models.loading.load_model = load
    pipeline._data = given_pairs
    for name in ("data", "identify", "knockout", "attention", "mlp", "finetune", "eval", "report"):
        setattr(pipeline, f"_{name}", counted(name, getattr(pipeline, f"_{name}")))
    failed = outcome(lambda: main(spec["fail_argv"]))
    calls.clear()
    code, error = outcome(lambda: main(spec["argv"]))
    return {"fail": failed, "code": code, "error": error, "calls": calls, "forwards": forwards,
            "devices": devices}


def fail_on_one_process(spec: dict) -> None:
    """The knockout stage, again on a copy of the finished run, raising at once on rank 1 alone. Rank 0
    is then inside the stage, where no message can reach it: the job must end anyway, and say why."""
    import shutil

    import keyheads.pipeline as pipeline
    from keyheads import distributed
    from keyheads.cli import main

    argv = spec["argv"]
    run, copy = Path(json.loads(Path(argv[1]).read_text())["out"]), Path(spec["spread_fail_out"])
    if distributed.is_main():
        shutil.copytree(run, copy)
    distributed.barrier()
    real = pipeline._knockout

    def knockout(*args, **kwargs):
        if distributed.rank() == 1:
            raise RuntimeError("simulated failure on process 1")
        return real(*args, **kwargs)

    pipeline._knockout = knockout
    main(argv + ["--out", str(copy), "--stages", "knockout", "--force"])
    raise AssertionError("the run went on after a process failed")


def main(spec_path: str) -> None:
    from keyheads import distributed

    spec = json.loads(Path(spec_path).read_text())
    r = distributed.rank()
    if "study" in spec:
        facts = {"study": check_study(spec["study"])}
    else:
        facts = {"distributed": check_distributed(r), "identify": check_patch(r, spec["identify"]),
                 "eval": check_eval(spec["eval"])}
    results = Path(spec["results"])
    results.mkdir(parents=True, exist_ok=True)
    (results / f"rank{r}.json").write_text(json.dumps(facts, indent=2))
    distributed.barrier()
    if "study" in spec:
        fail_on_one_process(spec["study"])  # does not return
    # A rank that exits while a peer still reads its last barrier message failed that peer now and
    # then with "Connection closed by peer": take the group down before exiting.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
