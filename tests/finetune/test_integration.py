"""Precise SFT inside Hugging Face's Trainer and TRL's SFTTrainer (keyheads.finetune.integration).

On a family with grouped K/V heads (tiny llama: 4 query heads over 2) and one without (tiny gpt2, fused
c_attn), three optimizer steps through the trainers give the deltas that `keyheads finetune` gives on the
same examples, order, batches, schedule and seed:
- transformers.Trainer, fed keyheads' tokens: bit for bit (torch.equal). Float32 on the CPU, the same
  forward, and the model's own loss has the same per-row cross-entropy gradient as keyheads' completion loss
  (scaled by the same 1/tokens), so the only differences left are the integration's extension points.
- TRL's SFTTrainer, from prompt/completion strings (its batches are checked token for token): within a
  relative error of 1e-5 per tensor (1.5e-6 to 1.7e-6 measured, with gradient accumulation too). TRL
  always computes the loss with its own chunked log-probability kernel (trl's add_fused_lm_head), whose
  gradients differ from full-logits cross-entropy in the last bits; AdamW divides each entry by its own
  gradient scale, which can turn a last-bit difference of a near-zero gradient into a visible one for that
  entry, so the bound is on each tensor's norm, and the key-bias entries (zero gradient) are left out.
Dropping either half of the recipe (the H/h rescale, or the decay of W0 + delta) moves the deltas by 6e-3
to 0.16 relative error, so these tests can fail: breaking either in integration.py fails all five.

A Trainer killed in the middle of a step and resumed from its last checkpoint by a fresh Trainer gives the
uninterrupted run's adapter bit for bit; the README's example runs, and `keyheads eval --adapter` takes what
it wrote. Two processes under FSDP2: test_integration_fsdp.py.
"""
import re
from pathlib import Path

import pytest
import torch
import trl  # requirements/trl.txt, which `make` installs: without TRL these tests fail, they are never skipped
from transformers import TrainerCallback

from keyheads.components import Components
from keyheads.finetune import FinetuneSettings, apply_adapter, attach, finetune, load_finetuned
from keyheads.finetune.adapter import ADAPTER, INFO, AdapterMismatch, read_adapter
from keyheads.finetune.data import tokenize
from keyheads.finetune.integration import handle_of
from keyheads.finetune.layer import ATTR
from keyheads.finetune.train import batch_indices
from keyheads.io import read_json, write_json
from keyheads.models.families import family_for
from keyheads.models.loading import load_model
from keyheads.testing import tiny_model

FAMILIES = ("llama", "gpt2")  # grouped K/V heads, and none (GPT-2's fused c_attn)
# H/h = 4 in layer 0, 4/3 in layer 1 (not a power of two), 2 in layer 2; and MLP 1 trained whole.
COMPONENTS = Components(((0, 1), (1, 0), (1, 2), (1, 3), (2, 0), (2, 3)), (1,))
STEPS, BATCH = 3, 4
# A high learning rate, strong decay and clipping that acts on every step, so that each part of the recipe
# moves the deltas visibly.
RECIPE = dict(lr=1e-2, weight_decay=0.5, max_grad_norm=0.5, warmup_ratio=0.02, seed=0)

pytestmark = pytest.mark.slow  # trainer runs, a few seconds each; the resume test about 15 s
SFT_RTOL = 1e-5
README = Path(__file__).resolve().parents[2] / "README.md"


def model_folder(family: str, root: Path) -> Path:
    """The tiny model saved as a Hugging Face folder, as a user's model is."""
    folder = root / f"tiny-{family}"
    if not folder.is_dir():
        tiny = tiny_model(family)
        tiny.hf.save_pretrained(folder)
        tiny.tokenizer.save_pretrained(folder)
    return folder


def keyheads_run(folder: Path, examples, out: Path, micro: int = BATCH):
    """`keyheads finetune` on the folder's model; returns the trained model."""
    model = load_model(str(folder), device="cpu")
    cfg = FinetuneSettings(**RECIPE, optimizer_batch_size=BATCH, micro_batch_size=micro, max_steps=STEPS, save_every=0,
                           save_minutes=0)
    finetune(model, examples, cfg, out, COMPONENTS, progress=False)
    return model


def in_keyheads_order(examples, steps: int = STEPS):
    """The examples the first `steps` batches of `keyheads finetune` take, in its order."""
    return [examples[i] for step in range(steps) for i in batch_indices(step, len(examples), BATCH, RECIPE["seed"])]


def trainer_run(folder: Path, examples, out: Path, kind: str = "sft", micro: int = BATCH, rescale: bool = True,
                keyheads_optimizer: bool = True):
    """The same job through TRL's SFTTrainer ("sft") or transformers' Trainer ("trainer") on an attached model."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sft = attach(model, COMPONENTS, rescale=rescale)
    ordered = in_keyheads_order(examples)
    common = dict(output_dir=str(out / "trainer"), per_device_train_batch_size=micro,
                  gradient_accumulation_steps=BATCH // micro, max_steps=STEPS, learning_rate=RECIPE["lr"],
                  weight_decay=RECIPE["weight_decay"], max_grad_norm=RECIPE["max_grad_norm"],
                  warmup_steps=RECIPE["warmup_ratio"], lr_scheduler_type="linear", seed=RECIPE["seed"],
                  train_sampling_strategy="sequential", logging_steps=1, save_strategy="no", use_cpu=True,
                  disable_tqdm=True)
    if kind == "sft":
        args = trl.SFTConfig(**common, bf16=False)  # TRL's default gradient checkpointing stays on
        data = Dataset.from_list([{"prompt": e.prompt, "completion": e.completion} for e in ordered])
        extra = {"processing_class": tokenizer}
        make = trl.SFTTrainer
    else:
        args = TrainingArguments(**common)
        data = Dataset.from_list([{"input_ids": t.ids, "labels": [-100] * t.n_prompt + t.ids[t.n_prompt:]}
                                  for t in tokenize(tokenizer, ordered, 1024)])
        extra = {"data_collator": DataCollatorForSeq2Seq(tokenizer, padding=True)}
        make = Trainer
    optimizers = (sft.optimizer(args), None) if keyheads_optimizer else (None, None)
    trainer = make(model=model, args=args, train_dataset=data, optimizers=optimizers,
                   callbacks=[sft.callback(out / "adapter")], **extra)
    if kind == "sft":  # the batches are keyheads' batches, token for token
        want = tokenize(tokenizer, ordered, 1024)
        assert [row["input_ids"] for row in trainer.train_dataset] == [t.ids for t in want]
        assert [row["labels"] for row in trainer.train_dataset] == [[-100] * t.n_prompt + t.ids[t.n_prompt:]
                                                                   for t in want]
    trainer.train()
    return model, sft


def trained(module) -> dict[str, torch.Tensor]:
    """The deltas and the trained MLP's parameters, by name."""
    return {n: p.detach() for n, p in module.named_parameters() if ATTR in n or ".1.mlp." in n}


def relative_errors(a: dict, b: dict) -> dict[str, float]:
    assert a.keys() == b.keys()
    return {n: ((a[n] - b[n]).norm() / a[n].norm()).item() for n in a}


def without_key_biases(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors, less the bias entries of key rows. Their gradient is zero in exact arithmetic (adding a
    constant to every key adds the same q.b to all of a query's scores, and softmax ignores it), so AdamW
    moves them by the size of its normalised rounding noise, which no two computations share."""
    fam = family_for(model.config.model_type)
    keys = {(path, i) for g in range(fam.n_kv_heads(model.config)) for path, index in
            [fam.qkv_rows(model.config, "k", g)] for i in index}
    out = {}
    for name, value in tensors.items():
        if name.endswith(f"{ATTR}.bias"):
            layer_path = name[len(fam.layers) + 1:-len(f".{ATTR}.bias")]
            path = layer_path.split(".", 1)[1]
            index = model.get_buffer(name[:-len("bias")] + "index").tolist()
            value = value[torch.tensor([(path, i) not in keys for i in index])]
        out[name] = value
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("integration")


@pytest.fixture(scope="module")
def reference(root, examples):
    """`keyheads finetune`'s trained tensors, per family."""
    return {family: trained(keyheads_run(model_folder(family, root), examples, root / f"kh-{family}").hf)
            for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_gives_keyheads_deltas_bit_for_bit(family, root, examples, reference, tmp_path):
    model, sft = trainer_run(model_folder(family, root), examples, tmp_path, kind="trainer")
    got = trained(model)
    assert got.keys() == reference[family].keys() and any(ATTR in n for n in got)
    assert all(v.abs().max() > 1e-3 for n, v in got.items() if ATTR in n and n.endswith("weight")), "nothing trained"
    differ = [n for n in got if not torch.equal(got[n], reference[family][n])]
    assert not differ, f"differ from keyheads finetune: {differ[:3]}"
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(got)


@pytest.mark.parametrize("broken", ["rescale", "decay"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_broken_recipe_is_seen(family, broken, root, examples, reference, tmp_path):
    """Without the gradient hooks, or with the Trainer's own optimizer (decay of the delta alone), the deltas
    move by more than ten times the SFTTrainer bound: the exactness tests above and below can fail."""
    model, _ = trainer_run(model_folder(family, root), examples, tmp_path, kind="trainer",
                           rescale=broken != "rescale", keyheads_optimizer=broken != "decay")
    errors = relative_errors(without_key_biases(model, reference[family]), without_key_biases(model, trained(model)))
    assert max(errors.values()) > 10 * SFT_RTOL, errors


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_trainer_gives_keyheads_deltas_and_a_keyheads_adapter(family, root, examples, reference, tmp_path):
    folder = model_folder(family, root)
    model, sft = trainer_run(folder, examples, tmp_path, kind="sft")
    errors = relative_errors(without_key_biases(model, reference[family]), without_key_biases(model, trained(model)))
    assert max(errors.values()) < SFT_RTOL, errors

    # The callback wrote what `keyheads finetune` writes; the loader of `keyheads eval --adapter` puts it back.
    out = tmp_path / "adapter"
    tensors, meta = read_adapter(out)
    _, kh_meta = read_adapter(root / f"kh-{family}")
    assert set(tensors) == set(read_adapter(root / f"kh-{family}")[0])
    for key in ("base_model", "base_fingerprint", "method", "components", "kv", "tuned_params"):
        assert meta[key] == kh_meta[key], key
    info = read_json(out / INFO)
    assert info["config"]["lr"] == RECIPE["lr"] and info["config"]["optimizer_batch_size"] == BATCH
    assert info["train"]["steps"] == STEPS and len(info["train"]["losses"]) == STEPS
    loaded = load_finetuned(out, lambda name: load_model(name, device="cpu"))
    batch = loaded.encode(["12 + 3 = ", "Q: 4 plus 19? A: 2"])
    with torch.no_grad():
        model.eval()
        want = model(**batch.as_kwargs(), use_cache=False).logits
        have = loaded.hf(**batch.as_kwargs(), use_cache=False).logits
    assert torch.equal(want, have)
    with pytest.raises(AdapterMismatch):  # a wrong base is refused, as for `keyheads finetune`'s adapters
        apply_adapter(tiny_model(family, seed=1), out)
    # The attached model still saves as a Hugging Face folder (module names unchanged).
    model.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    sft.remove()
    assert not any(ATTR in n for n, _ in model.named_parameters())


def test_gradient_accumulation(root, examples, reference, tmp_path):
    """Two micro-batches of 2 give the deltas of one batch of 4 (keyheads' own, within the SFTTrainer bound:
    each micro-batch pads to its own width, and its gradient is rescaled before the sum)."""
    model, _ = trainer_run(model_folder("gpt2", root), examples, tmp_path, kind="sft", micro=2)
    errors = relative_errors(without_key_biases(model, reference["gpt2"]), without_key_biases(model, trained(model)))
    assert max(errors.values()) < SFT_RTOL, errors


class Killed(RuntimeError):
    pass


class Probe(TrainerCallback):
    """Records the deltas (as parameters and as the adapter's tensors) and their AdamW state: at the end of
    step `at`, and when training (re)starts; with `kill_at`, stops the run in the middle of the next step."""

    def __init__(self, at: int, kill_at: int | None = None):
        self.at, self.kill_at, self.seen = at, kill_at, {}

    @staticmethod
    def snapshot(model, optimizer) -> dict:
        params = {n: p for n, p in model.named_parameters() if ATTR in n}
        state = optimizer.state
        return {"deltas": {n: p.detach().clone() for n, p in params.items()},
                "adapter": {k: v.clone() for k, v in handle_of(model).tuned.adapter_tensors().items()},
                "adam": {n: {k: v.clone() for k, v in state[p].items()} for n, p in params.items() if p in state}}

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.seen["begin"] = self.snapshot(model, optimizer)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step == self.at:
            self.seen["at"] = self.snapshot(model, optimizer)

    def on_substep_end(self, args, state, control, **kwargs):
        if state.global_step == self.kill_at:  # in the middle of a step, after a checkpoint
            raise Killed(f"killed during step {state.global_step + 1}")


def same(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, {k: (a[k].double() - b[k].double()).abs().max().item() for k in differ}
    return True


def test_a_killed_trainer_resumes_to_the_uninterrupted_result(root, examples, tmp_path):
    """Trainer + callback with checkpoints every 2 steps (micro-batches of 2, accumulated to 4), killed in
    the middle of step 3 and resumed by a fresh Trainer from checkpoint-2 with `train(resume_from_checkpoint=)`,
    gives the uninterrupted run's adapter and losses bit for bit: float32 on the CPU, the same batches in the
    same order, and the checkpoint restores exactly what the next steps read (the deltas as model parameters,
    AdamW's moments and step count, the schedule)."""
    from tests.finetune.trainer_worker import train

    steps, every = 4, 2
    folder = model_folder("llama", root)
    from transformers import AutoTokenizer

    rows = [{"input_ids": t.ids, "labels": [-100] * t.n_prompt + t.ids[t.n_prompt:]}
            for t in tokenize(AutoTokenizer.from_pretrained(folder), in_keyheads_order(examples, steps), 1024)]

    def args(out: Path) -> dict:
        return dict(output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                    max_steps=steps, learning_rate=RECIPE["lr"], weight_decay=RECIPE["weight_decay"],
                    max_grad_norm=RECIPE["max_grad_norm"], warmup_steps=RECIPE["warmup_ratio"],
                    lr_scheduler_type="linear", seed=RECIPE["seed"], train_sampling_strategy="sequential",
                    logging_steps=1, save_strategy="steps", save_steps=every, use_cpu=True, disable_tqdm=True,
                    report_to="none")

    whole = Probe(at=every)
    model, _, trainer = train(folder, COMPONENTS, rows, args(tmp_path / "whole"), tmp_path / "whole-adapter",
                              callbacks=[whole])
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]

    killed = tmp_path / "killed"
    with pytest.raises(Killed, match="killed during step 3"):
        train(folder, COMPONENTS, rows, args(killed), tmp_path / "killed-adapter", callbacks=[Probe(every, every)])
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (tmp_path / "killed-adapter").exists()
    checkpoint = killed / "checkpoint-2"
    # The callback wrote the adapter of step 2 into the trainer's checkpoint: the deltas of step 2.
    assert same(read_adapter(checkpoint)[0], whole.seen["at"]["adapter"])
    assert read_json(checkpoint / INFO)["train"]["steps"] == every
    at_2 = whole.seen["at"]["deltas"]
    # The trainer's own checkpoint holds the deltas as model parameters (so resuming restores them).
    from safetensors.torch import load_file

    saved = {n: v for n, v in load_file(str(checkpoint / "model.safetensors")).items() if ATTR in n}
    assert same(saved, at_2)

    resumed = Probe(at=every)
    model_r, _, trainer_r = train(folder, COMPONENTS, rows, args(killed), tmp_path / "resumed-adapter",
                                  callbacks=[resumed], resume_from_checkpoint=str(checkpoint))
    begin = resumed.seen["begin"]
    assert same(begin["deltas"], at_2)  # the deltas of step 2, not the zeros attach made
    assert begin["adam"].keys() == whole.seen["at"]["adam"].keys() and begin["adam"]
    for name, state in whole.seen["at"]["adam"].items():  # AdamW's moments and step of step 2
        assert same(begin["adam"][name], state), name
    # Bit for bit the uninterrupted run: its adapter, its losses.
    final, whole_final = read_adapter(tmp_path / "resumed-adapter")[0], read_adapter(tmp_path / "whole-adapter")[0]
    assert any(v.abs().max() > 1e-3 for k, v in final.items() if k.endswith(".weight"))
    assert same(final, whole_final)
    assert [row["loss"] for row in trainer_r.state.log_history if "loss" in row] == losses
    info = read_json(tmp_path / "resumed-adapter" / INFO)["train"]
    assert info["steps"] == steps and info["steps_this_run"] == steps - every and info["losses"] == losses
    assert read_json(killed / f"checkpoint-{steps}" / INFO)["train"]["steps"] == steps


def readme_example() -> str:
    """The SFTTrainer example of README's "Improve: precise SFT" section."""
    section = README.read_text().split("## Improve: precise SFT", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "SFTTrainer" in b]
    assert len(blocks) == 1, "README's precise-SFT section should hold one SFTTrainer example"
    return blocks[0]


def test_readme_example_runs(root, tmp_path, monkeypatch, shared_data):
    """The README's example, as a user runs it, on a tiny model folder and a key_heads.json of its heads; then
    `keyheads eval --adapter` on what it wrote (two problems of a benchmark, through the CLI's own main)."""
    code = readme_example()
    folder = model_folder("llama", root)
    heads = [{"layer": layer, "head": head} for layer in range(3) for head in range(4)][::-1]
    write_json(tmp_path / "key_heads.json", {"metric": "logit_diff", "threshold": None, "top_k": None,
                                             "heads": heads, "mlps": []})
    monkeypatch.setenv("MODEL", str(folder))
    monkeypatch.setenv("KEY_HEADS", str(tmp_path / "key_heads.json"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    written = [p.parent for p in tmp_path.rglob(ADAPTER) if "checkpoint" not in str(p)]
    assert len(written) == 1
    meta = read_adapter(written[0])[1]
    assert meta["components"]["heads"] == heads[:8]
    loaded = load_finetuned(written[0], lambda name: load_model(name, device="cpu"))
    assert any(p.abs().max() > 0 for n, p in loaded.hf.named_parameters() if ATTR in n and n.endswith("weight"))

    from keyheads.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--adapter", str(written[0]), "--device", "cpu", "--benchmarks", "addsub", "--limit", "2",
                 "--few-shot", "0", "--max-new-tokens", "4", "--batch-size", "2", "--data-dir", str(shared_data),
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--quiet"]) == 0
    rows = (out / "table.md").read_text().split("\n")
    assert rows[2].startswith(f"| {folder} | - | - |")  # the adapter's base model is the reference row
    cells = [c.strip() for c in rows[3].strip("|").split("|")]
    assert cells[0] == f"{folder} + precise SFT" and cells[2] not in ("", "-")
