"""Compressed collectives: block codecs, error feedback, quantized allreduce."""

from commflow.compress.allreduce import AllreduceStats, quantized_allreduce
from commflow.compress.block_sparse import block_sparse_allreduce
from commflow.compress.codecs import (
    CODECS,
    Codec,
    ErrorFeedback,
    decode,
    encode,
    scales,
    wire_fraction,
)
from commflow.compress.topk import topk_allreduce
from commflow.compress.volumes import simulate_compressed

__all__ = [
    "CODECS",
    "AllreduceStats",
    "Codec",
    "ErrorFeedback",
    "block_sparse_allreduce",
    "decode",
    "encode",
    "quantized_allreduce",
    "scales",
    "simulate_compressed",
    "topk_allreduce",
    "wire_fraction",
]
