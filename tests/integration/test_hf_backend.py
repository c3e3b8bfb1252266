import torch

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig


def test_cpu_threads_sets_torch_intra_op_threads(tiny_model_dir):
    before = torch.get_num_threads()
    try:
        HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1), tiny_model_dir)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_without_cpu_threads_torch_keeps_its_default(tiny_model_dir):
    before = torch.get_num_threads()
    HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir)), tiny_model_dir)
    assert torch.get_num_threads() == before
