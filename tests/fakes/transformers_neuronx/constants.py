"""Mirrors src/transformers_neuronx/constants.py: the GQA sharding strategies and layouts."""

import enum


class Layout(enum.Enum):
    HSB = "HSB"
    BSH = "BSH"
    SBH = "SBH"


class GQA(enum.Enum):
    SHARD_OVER_HEADS = "shard-over-heads"
    SHARD_OVER_BATCH = "shard-over-batch"
    REPLICATED_HEADS = "replicated-heads"
    ALL_GATHER_HEADS = "all-gather-heads"
