"""Data: batch layouts (the one definition of positives/negatives), datasets, samplers, synthetic world."""

from cocos.data.layout import DIRECTIONS, BatchLayout, QueryView
from cocos.data.precomp import PrecompSplit, data_fingerprint, load_split
from cocos.data.synth import generate_world, make_synthetic
from cocos.data.text import Vocabulary, pad_batch, tokenize

__all__ = [
    "DIRECTIONS",
    "BatchLayout",
    "PrecompSplit",
    "QueryView",
    "Vocabulary",
    "data_fingerprint",
    "generate_world",
    "load_split",
    "make_synthetic",
    "pad_batch",
    "tokenize",
]
