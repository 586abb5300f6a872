"""Compression codecs for what travels: ``fp16``, ``bf16``, ``int8`` (blockwise absmax) and
``topk:RATIO`` (with error feedback kept by the caller). Each maps float32 arrays to a byte
layout whose size follows from the codec and the count alone, named in the wire header and
checked there (transport/wire.py); never pickled. ``parse`` reads ``compression=``.

``codec`` declares the interface (Codec, CodecError, array_module); ``fp16``/``halves``/
``fast``, ``bf16``, ``int8`` and ``topk`` implement it; ``catalog`` finds a codec by name (a
user's spec, a header's dtype); ``float32`` turns an array of any family into the float32
array the codecs work on, and back."""
from collectives.codecs.bf16 import BFloat16
from collectives.codecs.catalog import (CODECS, WIRE_PREFIX, CodecSpec, from_wire, names, parse,
                                        wire_dtype)
from collectives.codecs.codec import WORK_ELEMENTS, Codec, CodecError, array_module
from collectives.codecs.float32 import FLOAT_DTYPES, as_float32, write_back, zeros_float32
from collectives.codecs.fp16 import Float16
from collectives.codecs.int8 import BLOCK, Int8Block
from collectives.codecs.topk import DEFAULT_RATIO, TopK

__all__ = ["Codec", "CodecSpec", "CodecError", "Float16", "BFloat16", "Int8Block", "TopK", "BLOCK",
           "DEFAULT_RATIO", "CODECS", "WIRE_PREFIX", "parse", "from_wire", "wire_dtype",
           "names", "array_module", "as_float32", "write_back", "zeros_float32", "FLOAT_DTYPES",
           "WORK_ELEMENTS"]
