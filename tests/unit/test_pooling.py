"""handler/backends/pooling.py on small tensors: each mode against its definition, padding never counts."""

from __future__ import annotations

import pytest
import torch

from handler.backends.pooling import POOLING_MODES, l2_normalize, pool

# Two rows of three positions, dimension 2; row 1's last position is padding (mask 0) with large
# values that would show if it were counted.
HIDDEN = torch.tensor(
    [
        [[1.0, 2.0], [3.0, 4.0], [5.0, -6.0]],
        [[2.0, 0.0], [4.0, 8.0], [100.0, 100.0]],
    ]
)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("cls", [[1.0, 2.0], [2.0, 0.0]]),
        ("mean", [[3.0, 0.0], [3.0, 4.0]]),
        ("max", [[5.0, 4.0], [4.0, 8.0]]),
        ("mean_sqrt_len", [[9.0 / 3**0.5, 0.0], [6.0 / 2**0.5, 8.0 / 2**0.5]]),
        ("lasttoken", [[5.0, -6.0], [4.0, 8.0]]),
    ],
)
def test_each_mode_ignores_padding(mode, expected):
    assert torch.allclose(pool(HIDDEN, MASK, mode), torch.tensor(expected), atol=1e-6)


def test_lasttoken_reads_left_padded_rows_too():
    left = torch.tensor([[0, 1, 1], [0, 0, 1]])
    assert torch.equal(pool(HIDDEN, left, "lasttoken"), torch.tensor([[5.0, -6.0], [100.0, 100.0]]))


def test_a_rows_vector_does_not_depend_on_its_batch_mates():
    """The same row pooled alone (no padding) and beside a longer row (padded) gives the same vector."""
    torch.manual_seed(0)
    short = torch.randn(1, 2, 4)
    batch = torch.cat([torch.cat([short, torch.randn(1, 3, 4)], dim=1), torch.randn(1, 5, 4)])
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    for mode in POOLING_MODES:
        alone = pool(short, torch.ones(1, 2, dtype=torch.long), mode)
        assert torch.allclose(pool(batch, mask, mode)[0], alone[0], atol=1e-6), mode


def test_l2_normalize_gives_unit_rows_and_keeps_zero_rows():
    out = l2_normalize(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    assert torch.allclose(out, torch.tensor([[0.6, 0.8], [0.0, 0.0]]))


def test_mismatched_shapes_and_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="do not match"):
        pool(HIDDEN, MASK[:, :2], "mean")
    with pytest.raises(ValueError, match="unknown pooling mode"):
        pool(HIDDEN, MASK, "weightedmean")  # type: ignore[arg-type]
