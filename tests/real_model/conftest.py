"""The real-model tier: SmolLM2-135M-Instruct served by one real torchserve (tests/support/real_model.py)."""

from tests.support.real_model import (
    real_client,
    real_model,
    real_model_dir,
    real_server,
    real_tokenizer,
)

__all__ = ["real_client", "real_model", "real_model_dir", "real_server", "real_tokenizer"]
