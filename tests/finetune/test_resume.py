"""Checkpoints and resume: a run killed part-way and started again on a fresh model ends bit-identical
to one that was never interrupted; a resume with other settings is refused, naming them; a finished
folder is returned as it is; checkpoint writes are atomic and leave no temporaries behind."""
import logging
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import keyheads.finetune.checkpoint as checkpoint_mod
import keyheads.finetune.run as run_mod
import keyheads.finetune.train as train_mod
from keyheads.components import Components
from keyheads.finetune.adapter import ADAPTER, INFO
from keyheads.finetune.checkpoint import ResumeMismatch
from keyheads.finetune.run import finetune
from keyheads.finetune.settings import FinetuneSettings
from keyheads.io import read_json
from keyheads.results.finetune import FinetuneResult
from keyheads.testing import tiny_model

from tests.helpers import Killed, at_optimizer_step, kill_at_optimizer_step

pytestmark = pytest.mark.slow  # killed and resumed training runs, up to about 9 s each

COMPONENTS = Components(((1, 0), (1, 1), (2, 3)), (2,))
CFG = FinetuneSettings(max_steps=6, save_every=2, optimizer_batch_size=8, micro_batch_size=4, lr=1e-2)


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.hf.named_parameters() if p.requires_grad}


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".checkpoint.", ".old-", f".{ADAPTER}.")))


@pytest.fixture(scope="module")
def uninterrupted(examples, tmp_path_factory):
    """(folder, finetune.json, trainable tensors) of a run that was never interrupted."""
    out = tmp_path_factory.mktemp("uninterrupted")
    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, CFG, out, COMPONENTS, progress=False)
    return out, info, trainable(model)


def killed_run(monkeypatch, examples, out: Path, at: int) -> None:
    """A run into `out` that dies in optimizer step `at` (so after step at-1 finished)."""
    kill_at_optimizer_step(monkeypatch, at)
    with pytest.raises(Killed):
        finetune(tiny_model("llama", seed=0), examples, CFG, out, COMPONENTS, progress=False)
    monkeypatch.undo()


def assert_same_as(uninterrupted, out: Path, info: FinetuneResult, model) -> None:
    ref_out, ref_info, ref_tensors = uninterrupted
    assert info.train.losses == ref_info.train.losses
    assert len(info.train.losses) == CFG.max_steps
    now = trainable(model)
    assert set(now) == set(ref_tensors)
    for name, t in ref_tensors.items():
        assert torch.equal(now[name], t), name
    a, b = load_file(str(out / ADAPTER)), load_file(str(ref_out / ADAPTER))
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("at, saved, resume_cfg", [
    (4, 2, CFG),  # dies in step 4: the newest checkpoint is of step 2
    (5, 4, CFG),  # dies in step 5: the newest checkpoint is of step 4
    (5, 4, CFG.model_copy(update=dict(save_every=3))),  # a setting a resume may change
])
def test_killed_run_resumes_bit_identical(at, saved, resume_cfg, examples, uninterrupted, tmp_path, monkeypatch,
                                          caplog):
    out = tmp_path / "run"
    killed_run(monkeypatch, examples, out, at)
    assert read_json(out / "checkpoint" / "record.json")["step"] == saved
    assert not (out / INFO).exists() and not (out / ADAPTER).exists()
    assert temporaries(out) == []

    caplog.set_level(logging.INFO, logger="keyheads")
    model = tiny_model("llama", seed=0)  # a fresh model, as a new process would have
    info = finetune(model, examples, resume_cfg, out, COMPONENTS, progress=False)
    assert f"at step {saved}" in caplog.text
    assert info.train.steps_this_run == CFG.max_steps - saved  # resumed, not restarted
    assert not (out / "checkpoint").exists()  # dead weight once the run has finished
    assert_same_as(uninterrupted, out, info, model)
    assert temporaries(out) == []


def test_resume_after_kill_between_renames(examples, uninterrupted, tmp_path, monkeypatch):
    """Killed after the old checkpoint was moved aside and before the new one took its place."""
    out = tmp_path / "run"
    killed_run(monkeypatch, examples, out, 5)
    os.replace(out / "checkpoint", out / ".old-checkpoint")
    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, CFG, out, COMPONENTS, progress=False)
    assert info.train.steps_this_run == 2
    assert_same_as(uninterrupted, out, info, model)
    assert temporaries(out) == []


def test_kill_while_saving_keeps_the_previous_checkpoint(examples, uninterrupted, tmp_path, monkeypatch):
    """A checkpoint write that dies half-way leaves the previous checkpoint whole and no temporary."""
    out = tmp_path / "run"
    real, calls = checkpoint_mod.write_json, [0]

    def dying_write(path, obj):
        calls[0] += 1
        if calls[0] == 2:  # the record of step 4: its tensors and optimizer state are written already
            raise Killed("killed while saving")
        return real(path, obj)

    monkeypatch.setattr(checkpoint_mod, "write_json", dying_write)
    with pytest.raises(Killed):
        finetune(tiny_model("llama", seed=0), examples, CFG, out, COMPONENTS, progress=False)
    monkeypatch.undo()
    assert read_json(out / "checkpoint" / "record.json")["step"] == 2
    assert temporaries(out) == []
    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, CFG, out, COMPONENTS, progress=False)
    assert info.train.steps_this_run == 4
    assert_same_as(uninterrupted, out, info, model)


def test_stale_temporaries_do_not_block_saving(examples, uninterrupted, tmp_path, monkeypatch):
    """Leftovers of a run killed hard (no clean-up ran) while saving: a temporary checkpoint folder,
    and the moved-aside old checkpoint next to the new one. The next run saves, and a third finishes."""
    out = tmp_path / "run"
    killed_run(monkeypatch, examples, out, 4)  # checkpoint of step 2
    shutil.copytree(out / "checkpoint", out / ".old-checkpoint")
    shutil.copytree(out / "checkpoint", out / ".checkpoint.stale123")
    killed_run(monkeypatch, examples, out, 3)  # resumes at step 3, saves step 4, dies in step 5
    assert read_json(out / "checkpoint" / "record.json")["step"] == 4
    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, CFG, out, COMPONENTS, progress=False)
    assert info.train.steps_this_run == 2
    assert_same_as(uninterrupted, out, info, model)
    assert temporaries(out) == [] and not (out / "checkpoint").exists()


@pytest.mark.parametrize("change, keys", [
    (dict(cfg=CFG.model_copy(update=dict(lr=2e-2))), ["config.lr"]),
    (dict(components=Components(((1, 0), (2, 3)), (2,))), ["components.heads"]),
    (dict(cfg=CFG.model_copy(update=dict(optimizer_batch_size=4, micro_batch_size=2))),
     ["config.optimizer_batch_size", "config.micro_batch_size"]),
])
def test_resume_with_other_settings_is_refused(change, keys, examples, tmp_path, monkeypatch):
    out = tmp_path / "run"
    killed_run(monkeypatch, examples, out, 4)
    before = {p.name: p.read_bytes() for p in (out / "checkpoint").iterdir()}
    cfg, components = change.get("cfg", CFG), change.get("components", COMPONENTS)
    with pytest.raises(ResumeMismatch) as err:
        finetune(tiny_model("llama", seed=0), examples, cfg, out, components, progress=False)
    named = re.findall(r"([\w.]+): checkpoint ", str(err.value))
    assert named == sorted(keys), str(err.value)  # exactly the changed settings, by name
    assert {p.name: p.read_bytes() for p in (out / "checkpoint").iterdir()} == before  # left as it was
    assert not (out / INFO).exists()


def test_other_data_is_refused(examples, tmp_path, monkeypatch):
    out = tmp_path / "run"
    killed_run(monkeypatch, examples, out, 4)
    with pytest.raises(ResumeMismatch, match=r"data\.sha256"):
        finetune(tiny_model("llama", seed=0), examples[:-1], CFG, out, COMPONENTS, progress=False)


def test_finished_folder_is_not_trained_again(examples, uninterrupted, monkeypatch, caplog):
    out, info, _ = uninterrupted
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def no_training(*args, **kwargs):
        raise AssertionError("a finished folder was trained again")

    monkeypatch.setattr(run_mod, "train", no_training)
    monkeypatch.setattr(run_mod, "make_trainable", no_training)
    caplog.set_level(logging.INFO, logger="keyheads")
    again = finetune(tiny_model("llama", seed=0), examples, CFG, out, COMPONENTS, progress=False)
    assert any("nothing to do" in m for m in caplog.messages)
    assert again.to_json() == read_json(out / INFO)
    assert again.train.losses == info.train.losses
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # nothing rewritten
    assert temporaries(out) == []


def test_ctrl_c_keeps_every_finished_step(examples, uninterrupted, tmp_path, monkeypatch, caplog):
    """Ctrl-C in the 4th step's forward pass: steps 1-3 are saved (the periodic checkpoint has only 2)."""
    out = tmp_path / "run"
    real, calls = train_mod.collate, [0]

    def interrupted_collate(*args, **kwargs):  # 2 micro-batches a step: call 7 is step 4's first
        calls[0] += 1
        if calls[0] == 7:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "collate", interrupted_collate)
    with pytest.raises(KeyboardInterrupt):
        finetune(tiny_model("llama", seed=0), examples, CFG, out, COMPONENTS, progress=False)
    monkeypatch.undo()
    assert read_json(out / "checkpoint" / "record.json")["step"] == 3
    assert temporaries(out) == []
    caplog.set_level(logging.INFO, logger="keyheads")
    caplog.clear()
    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, CFG, out, COMPONENTS, progress=False)
    assert "at step 3" in caplog.text
    assert_same_as(uninterrupted, out, info, model)


def test_ctrl_c_during_the_update_saves_nothing_new(examples, tmp_path, monkeypatch):
    """Interrupted inside the optimizer step, the state is half-updated: only the periodic checkpoint stays."""
    out = tmp_path / "run"
    kill_at_optimizer_step(monkeypatch, 4, error=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        finetune(tiny_model("llama", seed=0), examples, CFG, out, COMPONENTS, progress=False)
    assert read_json(out / "checkpoint" / "record.json")["step"] == 2


def _interrupt(signum, frame):  # what the CLI installs for SIGTERM
    raise KeyboardInterrupt


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_update_waits_for_it_and_keeps_the_step(signum, examples, uninterrupted, tmp_path,
                                                                     monkeypatch):
    """Ctrl-C or a scheduler's SIGTERM inside the 4th optimizer step: the step finishes, then the interrupt
    saves steps 1-4 (the periodic checkpoint has 2), and the resumed run ends in the same bits."""
    at_optimizer_step(monkeypatch, 4, lambda: os.kill(os.getpid(), signum))  # its handler runs before the update
    # Ctrl-C's handler as in a foreground process: one started in the background inherits SIGINT ignored
    handlers = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _interrupt}
    out, before = tmp_path / "run", {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        with pytest.raises(KeyboardInterrupt):
            finetune(tiny_model("llama", seed=0), examples, CFG, out, COMPONENTS, progress=False)
        assert {s: signal.getsignal(s) for s in handlers} == handlers  # the handlers are put back
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    monkeypatch.undo()
    assert read_json(out / "checkpoint" / "record.json")["step"] == 4
    model = tiny_model("llama", seed=0)
    assert_same_as(uninterrupted, out, finetune(model, examples, CFG, out, COMPONENTS, progress=False), model)


@pytest.mark.parametrize("save_minutes, saved", [(1e-9, 3), (0.0, None)])
def test_checkpoints_by_time_when_steps_are_slow(save_minutes, saved, examples, uninterrupted, tmp_path,
                                                 monkeypatch):
    """With no step interval, a checkpoint still follows every step once save_minutes have passed (here at
    once); with both off only the end is saved. The time-saved run resumes to the same bits."""
    out = tmp_path / "run"
    cfg = CFG.model_copy(update=dict(save_every=0, save_minutes=save_minutes))
    kill_at_optimizer_step(monkeypatch, 4)
    with pytest.raises(Killed):
        finetune(tiny_model("llama", seed=0), examples, cfg, out, COMPONENTS, progress=False)
    monkeypatch.undo()
    if saved is None:
        assert not (out / "checkpoint").exists()
        return
    assert read_json(out / "checkpoint" / "record.json")["step"] == saved
    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, cfg.model_copy(update=dict(save_minutes=30.0)), out, COMPONENTS, progress=False)
    assert info.train.steps_this_run == CFG.max_steps - saved
    assert_same_as(uninterrupted, out, info, model)
