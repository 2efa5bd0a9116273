import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The compiled models' matrices are a few dozen wide: a second thread costs more in synchronisation than
    it saves (30 times more, for fine-tuning's many small steps on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
