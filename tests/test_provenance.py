"""Versions recorded with results, and the settings diff that stages and checkpoints share."""
import platform

import torch
import transformers

import keyheads
from keyheads.provenance import changed_settings, flatten, machine_record, versions


def test_versions_and_machine():
    from keyheads.provenance import code_commit

    expected = {"keyheads": keyheads.__version__, "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version()}
    if code_commit() is not None:  # run from a git checkout of keyheads (not an installed wheel)
        expected["commit"] = code_commit()
    assert versions() == expected
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


def test_the_code_commit_is_the_checkout_s_and_says_when_the_code_has_changes(tmp_path):
    import subprocess

    from keyheads.provenance import code_commit

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("x = 1\n")
    git("init", "-q")
    assert code_commit.__wrapped__(package) is None  # a folder the checkout does not track: an installed copy
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = git("rev-parse", "HEAD")
    assert code_commit.__wrapped__(package) == sha
    (tmp_path / "notes.txt").write_text("outside the package")  # a change elsewhere in the checkout: no matter
    assert code_commit.__wrapped__(package) == sha
    (package / "__init__.py").write_text("x = 2\n")
    assert code_commit.__wrapped__(package) == sha + " + uncommitted changes"
    assert code_commit.__wrapped__(tmp_path.parent / "nowhere") is None


def test_none_and_an_empty_list_are_the_same_setting():
    """A list setting once written as None (its default) and now as [] does not make a stage stale; any value does."""
    assert changed_settings({"data": {"template_files": None}}, {"data": {"template_files": []}}) == []
    assert changed_settings({"x": None}, {"x": {}}) == [] and changed_settings({}, {"x": []}) == []
    assert changed_settings({"data": {"template_files": None}}, {"data": {"template_files": ["t.yaml"]}}) == [
        ("data.template_files", None, ["t.yaml"])]
    assert changed_settings({"k": 0}, {"k": None}) == [("k", 0, None)]  # zero is a value, not unset
