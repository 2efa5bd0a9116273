"""Peak host memory per process of precise SFT under FSDP2 on two CPU processes: the model read shard by shard
(keyheads.models.sharded, what `keyheads finetune --parallel fsdp` does) against the same job with the model
loaded whole by every process first (the way before it).

    python -m bench.fsdp_memory --model qwen2.5-coder-1.5b --dtype bfloat16    # writes its RESULTS section
    python -m bench.fsdp_memory --tiny      # a check in seconds: a tiny random model in float32, 3 heads

Each way is one `torch.distributed.run` of two processes. A process samples its anonymous resident memory
(RssAnon: what it allocated, not the weights files' pages it maps, which are page cache shared by the
processes) every millisecond, from before the model loads to the end of one optimizer step, with glibc's
malloc held to a fixed mmap threshold so that freed buffers leave; it also reports the kernel's peak of all
its resident memory (VmHWM, mapped file pages included). A third run starts from an empty model cache (the GGUF
kept), so that one of its processes first converts the GGUF into the float32 safetensors cache, as the first run on
a machine does.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import tiny
from keyheads.testing.memory import AnonymousPeak, status

HEADS = "19.11,23.9,22.0,17.4,18.11,16.7,22.3,16.8,15.4,20.8"  # the Qwen study's top 10 (any heads would do)
TINY = {"dtype": "float32", "heads": "0.0,1.1,2.2"}  # heads the tiny model has
TITLE = "FSDP2 on two CPU processes: peak host memory per process, model read shard by shard or loaded whole " \
        "(bench/fsdp_memory.py)"


def worker(args) -> None:
    """One process: load as told, train one step of precise SFT, write this process's figures."""
    import torch

    torch.set_num_threads(1)
    memory = AnonymousPeak()
    import torch.distributed as dist

    from keyheads import models
    from keyheads.components import Components
    from keyheads.finetune import finetune
    from keyheads.finetune.data import Example
    from keyheads.finetune.settings import FinetuneSettings

    before = memory.peak
    t0 = time.perf_counter()
    model, where = models.load_placed(args.model, "cpu", args.dtype, sharded=not args.whole)
    model_bytes = sum(p.numel() for p in model.hf.parameters()) * model.dtype.itemsize
    file_bytes = sum(f.stat().st_size for f in Path(model.source).glob("*.safetensors"))  # what it was read from
    # FSDP2's root unit (embedding, final norm, unembedding) is gathered whole for the forward: its share
    root = {id(p): p.numel() for m in (model.hf.get_input_embeddings(), model.hf.get_output_embeddings())
            for p in m.parameters()}
    root_share = sum(root.values()) * model.dtype.itemsize / model_bytes
    cfg = FinetuneSettings(method="precise", parallel="fsdp", max_steps=1, optimizer_batch_size=2,
                           micro_batch_size=1, save_every=0)
    examples = [Example(prompt=f"{a} + {b} = ", completion=str(a + b)) for a in range(2) for b in range(2)]
    heads = Components.explicit(args.heads)
    finetune(model, examples, cfg, Path(args.out) / args.tag, heads, progress=False,
             device=where.run_on)
    rank = dist.get_rank()
    facts = {"rank": rank, "model_bytes": model_bytes, "file_bytes": file_bytes, "root_share": root_share,
             "anon_before": before, "anon_peak": memory.peak, "vm_hwm": status("VmHWM"),
             "seconds": round(time.perf_counter() - t0, 1)}
    Path(args.out, f"{args.tag}-rank{rank}.json").write_text(json.dumps(facts))
    dist.barrier()
    dist.destroy_process_group()


def launch(args, whole: bool, converting: bool = False) -> list[dict]:
    """One two-process run; `converting`: with an empty model cache (the GGUF files kept), so that the run first
    converts the GGUF into the float32 safetensors cache, as a first run on a machine does."""
    tag = "converting" if converting else "whole" if whole else "shards"
    shutil.rmtree(Path(args.out) / tag, ignore_errors=True)  # train, not resume
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "bench.fsdp_memory", "--worker", "--model", args.model, "--dtype", args.dtype, "--heads", args.heads,
           "--out", args.out, "--tag", tag] + (["--whole"] if whole else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "TOKENIZERS_PARALLELISM": "false"}
    if converting:
        from keyheads.models.loading import cache_root

        fresh = Path(args.out) / "fresh-cache"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        (fresh / "gguf").symlink_to(cache_root() / "gguf")  # the joined GGUF parts: only the conversion is redone
        env["KEYHEADS_CACHE"] = str(fresh)
    subprocess.run(cmd, env=env, check=True)
    return [json.loads(Path(args.out, f"{tag}-rank{r}.json").read_text()) for r in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="bundled name or model folder (default: qwen2.5-coder-1.5b; with --tiny, a "
                        "tiny random Llama)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--heads", default=HEADS, help="the heads precise SFT trains, LAYER.HEAD,...")
    parser.add_argument("--out", default="/tmp/keyheads-fsdp-memory")
    parser.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="shards", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    tiny.add_flags(parser)
    args = tiny.parse(parser, TINY)
    if args.worker:
        worker(args)
        return
    args.model = args.model or (str(tiny.model_folder()) if args.tiny else "qwen2.5-coder-1.5b")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs = {"read shard by shard (now)": launch(args, whole=False), "loaded whole first (before)": launch(args, True)}
    if not args.tiny:  # a tiny model is a folder already: nothing to convert
        runs["read shard by shard, converting the GGUF first"] = launch(args, whole=False, converting=True)
    gib = 2 ** 30
    model_bytes = runs["read shard by shard (now)"][0]["model_bytes"]
    lines = [f"- date: {datetime.date.today()}; command: `python -m bench.fsdp_memory --model {args.model} "
             f"--dtype {args.dtype}{' --tiny' if args.tiny else ''}`",
             f"- model: {args.model}, {model_bytes / gib:.2f} GiB of weights in {args.dtype} (read from float32 "
             f"safetensors); precise SFT of {len(args.heads.split(','))} heads, one optimizer step of 2 samples; "
             "2 processes, gloo, CPU",
             "", "| loading | process | peak anonymous memory above the runtime | as a share of the model in "
             f"{args.dtype} | peak resident (VmHWM) | as a share of the weights files | seconds |",
             "|---|---|---|---|---|---|---|"]
    for name, ranks in runs.items():
        for f in ranks:
            grew = f["anon_peak"] - f["anon_before"]
            lines.append(f"| {name} | {f['rank']} | {grew / gib:.2f} GiB | {grew / model_bytes:.2f} | "
                         f"{f['vm_hwm'] / gib:.2f} GiB | {f['vm_hwm'] / f['file_bytes']:.2f} | {f['seconds']} |")
    root_share = runs["read shard by shard (now)"][0]["root_share"]
    files = runs["read shard by shard (now)"][0]["file_bytes"]
    lines += ["", f"- the weights files: {files / gib:.2f} GiB of float32 safetensors (the converted cache). Anonymous "
              "memory is what a process allocated; VmHWM is all its resident memory at its peak, the runtime's "
              "libraries and any mapped file pages included. Read shard by shard, each slice is read with plain "
              "file reads (keyheads.models.sharded.PlainReader), so no page of the files is mapped; loaded whole, "
              "transformers maps them.",
              f"- what the peak read shard by shard is made of: half the model (the process's shards), then, during "
              f"the forward, FSDP2's root unit gathered whole: the embeddings are {root_share:.0%} of this model "
              "(a 151,936-token vocabulary, tied), and on the CPU the gathered copy and gloo's all-gather buffer "
              "exist together for a moment; then the layer computing and the one prefetched. At LLaMA-2-7B's "
              "proportions (embeddings 4%) the same sum is about 0.6 of the model.",
              "- converting: the process that converts de-quantises the GGUF tensor by tensor, a block of rows at a "
              "time, straight into the cache's safetensors file (keyheads.models.streamed_gguf: the bytes "
              "transformers' whole conversion wrote), so it peaks no higher than the others; transformers' whole "
              "conversion held the float32 model and more (1.51 of the weights files at commit f4667cb)."]
    print("\n".join(lines))
    if not args.no_write:
        from bench.results import machine, provenance, publish

        lines.insert(0, provenance("bench/fsdp_memory.py", f"{machine()}; 2 processes of 1 thread each, gloo"))
        publish(TITLE, "bench.fsdp_memory", "fsdp_memory", {"model": args.model, "dtype": args.dtype, **runs}, lines,
                tiny.results_file(args))


if __name__ == "__main__":
    main()
