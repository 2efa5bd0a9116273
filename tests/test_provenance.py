"""Versions recorded with results, and the settings diff that stages and checkpoints share."""
import platform

import torch
import transformers

import keyheads
from keyheads.provenance import changed_settings, flatten, machine_record, versions


def test_versions_and_machine():
    assert versions() == {"keyheads": keyheads.__version__, "torch": torch.__version__,
                          "transformers": transformers.__version__, "python": platform.python_version()}
    assert machine_record()["torch_threads"] == torch.get_num_threads()


def test_changed_settings_name_each_nested_difference_once():
    old = {"top_k": 8, "config": {"lr": 1e-4, "save_every": 2, "seed": 0}, "gone": 1}
    new = {"top_k": 10, "config": {"lr": 1e-4, "save_every": 5, "seed": 0}, "added": None}
    assert flatten(old) == {"top_k": 8, "config.lr": 1e-4, "config.save_every": 2, "config.seed": 0, "gone": 1}
    assert changed_settings(old, new) == [("config.save_every", 2, 5), ("gone", 1, None), ("top_k", 8, 10)]
    # a missing key and a None value are alike unless `missing` tells them apart
    assert changed_settings(old, new, skip=["config.save_every"], missing="<unset>") == [
        ("added", "<unset>", None), ("gone", 1, "<unset>"), ("top_k", 8, 10)]
    assert changed_settings(new, new) == []
