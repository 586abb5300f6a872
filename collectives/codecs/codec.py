"""The codec interface: how a flat float array becomes the bytes that travel, and back.

A codec maps ``count`` float32 elements to exactly ``encoded_nbytes(count)`` bytes, a size
fixed by the codec and the count alone, so a receiver can check a header's byte count
against its codec and shape before it touches the payload (wire.py). Encoding and decoding
are written once against an array module ``xp`` (numpy, or cupy on a GPU: the same calls),
so one code path serves every array family; torch tensors reach it through codecs/float32.py.

Decoding never trusts the bytes beyond their length: a codec whose payload can be
inconsistent (top-k's indices) checks it and raises CodecError, a ProtocolError.
"""
from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from collectives.errors import ProtocolError

__all__ = ["Codec", "CodecError", "array_module", "WORK_ELEMENTS"]

# Elements per slice of a multi-pass codec: a slice's temporaries stay in L2, so each pass
# after the first reads cache instead of memory (measured in benchmarks/compression.py).
WORK_ELEMENTS = 64 * 1024
"""Elements per slice of a multi-pass codec (a slice's temporaries stay in L2)."""


class CodecError(ProtocolError):
    """A compressed payload that its codec cannot decode (e.g. top-k indices out of range)."""


def array_module(x: Any) -> Any:
    """numpy for numpy arrays, cupy for cupy arrays (the same API: the codecs' one path)."""
    if isinstance(x, np.ndarray):
        return np
    import cupy   # only reached with a cupy array, so cupy is installed
    return cupy.get_array_module(x)


class Codec(abc.ABC):
    """A lossy map from float32 arrays to bytes. Stateless: error feedback (top-k) is the
    caller's, which passes a residual buffer (collectives/operations/compressed_allreduce.py)."""

    #: Family name, the part of the wire name before any ':' ("fp16", "topk").
    family: ClassVar[str] = "abstract"
    #: True if it is a contraction, ||D(E(x)) - x||^2 <= (1 - delta) ||x||^2 with delta > 0,
    #: the assumption of CHOCO-SGD's exact consensus (all here but fp16, which underflows).
    contractive: ClassVar[bool] = True
    #: True if the decoded array is dense and close to x elementwise (fp16, bf16, int8), so
    #: it can stand for the parameters themselves; False (top-k): only differences and
    #: gradients with error feedback should be sent with it.
    dense: ClassVar[bool] = True

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The spec that names this codec, also its wire name ("int8", "topk:0.01")."""

    @abc.abstractmethod
    def encoded_nbytes(self, count: int) -> int:
        """Bytes of the encoding of ``count`` elements."""

    @abc.abstractmethod
    def encode(self, x: Any, out: Any) -> None:
        """Write the encoding of float32 ``x`` (flat) into uint8 ``out`` of
        encoded_nbytes(x.size) bytes, same module."""

    @abc.abstractmethod
    def decode(self, data: Any, out: Any) -> None:
        """Overwrite float32 ``out`` (flat, ``count`` elements) with the decoding of uint8
        ``data`` (encoded_nbytes(count) bytes); CodecError if ``data`` is inconsistent."""

    @abc.abstractmethod
    def error_bound(self, x: Any) -> Any:
        """An elementwise bound on |D(E(x)) - x| for float32 ``x`` (an array like x)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<codec {self.name}>"
