"""handler.cpu_threads: torch's intra-op threads (process-wide; tests/conftest.py restores
the count after every test)."""

import torch

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig


def test_cpu_threads_sets_torch_intra_op_threads(tiny_model_dir):
    torch.set_num_threads(2)  # start from another count, so that "1" must come from the setting
    assert torch.get_num_threads() == 2
    HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1), tiny_model_dir)
    assert torch.get_num_threads() == 1


def test_without_cpu_threads_torch_threads_are_left_alone(tiny_model_dir):
    torch.set_num_threads(3)  # a count nothing in the handler would pick
    HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir)), tiny_model_dir)
    assert torch.get_num_threads() == 3
