"""The shard reader's plain reads (keyheads.models.sharded.SlicedFile, PlainReader) give what safetensors' own
memory-mapped get_slice gives, slice for slice, and torch.distributed.checkpoint loads with them as with its reader."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed import checkpoint as dcp

from keyheads.models.sharded import PlainReader, SlicedFile


@pytest.fixture
def weights(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"embed": torch.randn(37, 12, generator=g), "half": torch.randn(9, 5, 3, generator=g).half(),
               "brain": torch.randn(11, 7, generator=g).bfloat16(), "ids": torch.randint(-5, 5, (13,), generator=g),
               "mask": torch.rand(6, 4, generator=g) > 0.5, "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path, tensors


SLICES = [(), (slice(0, None),), (slice(3, 17),), (slice(5, 6), slice(1, 4)), (slice(0, 0),),
          (slice(2, 9), slice(None), slice(1, 2))]


def test_every_slice_is_what_safetensors_reads(weights):
    path, tensors = weights
    with safe_open(str(path), "pt") as mapped, SlicedFile(path) as plain:
        for name, tensor in tensors.items():
            for slices in SLICES:
                if len(slices) > tensor.dim():
                    continue
                want = mapped.get_slice(name)[slices]
                got = plain.get_slice(name)[slices]
                assert got.dtype == want.dtype and got.shape == want.shape, (name, slices)
                assert torch.equal(got, want), (name, slices)


def test_a_checkpoint_loads_through_the_plain_reader_as_through_torch_s(weights, tmp_path):
    path, tensors = weights
    names = ["embed", "half", "brain", "ids"]
    plain = {n: torch.zeros_like(tensors[n]) for n in names}
    mapped = {n: torch.zeros_like(tensors[n]) for n in names}
    dcp.load(plain, storage_reader=PlainReader(str(path.parent)), no_dist=True)
    dcp.load(mapped, storage_reader=dcp.HuggingFaceStorageReader(str(path.parent)), no_dist=True)
    for n in names:
        assert torch.equal(plain[n], tensors[n]) and torch.equal(plain[n], mapped[n]), n


def test_a_file_cut_short_is_an_error_not_a_short_tensor(weights):
    path, tensors = weights
    data = path.read_bytes()
    with SlicedFile(path) as f:
        end = f.start + f.header["embed"]["data_offsets"][1]
    path.write_bytes(data[:end - 10])
    with SlicedFile(path) as f, pytest.raises(RuntimeError):
        f.get_slice("embed")[(slice(0, None),)]


def test_a_truncated_weights_file_is_reported_as_one(tmp_path):
    from keyheads.errors import BadFile
    from keyheads.models.sharded import read_own_shards, skeleton
    from keyheads.testing import tiny_model

    tiny = tiny_model("llama", seed=0)
    tiny.hf.save_pretrained(tmp_path)
    [weights] = tmp_path.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:-100])
    model = skeleton(tmp_path, torch.float32)
    model.to_empty(device="cpu")
    with pytest.raises(BadFile, match="truncated"):
        read_own_shards(model, tmp_path, {n for n, _ in model.named_parameters()})
