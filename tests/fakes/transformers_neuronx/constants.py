"""Mirrors src/transformers_neuronx/constants.py: the GQA sharding strategies and layouts."""

import enum

LAYOUT_BSH = "BSH"
LAYOUT_HSB = "HSB"
LAYOUT_SBH = "SBH"


class Layout(enum.Enum):
    """Like the real one, a member equals its string spelling (NeuronConfig keeps whatever it was given)."""

    HSB = "HSB"
    BSH = "BSH"
    SBH = "SBH"

    def __eq__(self, value: object) -> bool:
        return super().__eq__(Layout(value))

    __hash__ = enum.Enum.__hash__


class GQA(enum.Enum):
    SHARD_OVER_HEADS = "shard-over-heads"
    SHARD_OVER_BATCH = "shard-over-batch"
    REPLICATED_HEADS = "replicated-heads"
    ALL_GATHER_HEADS = "all-gather-heads"
