"""Codecs by name: ``parse("topk:0.01")`` for what users pass as ``compression=``, and
``from_wire(dtype)`` for what a header names, which only takes canonical names and never
raises (an unknown one is None: the receiver drops the message)."""
from __future__ import annotations

from typing import Callable, TypeAlias

from collectives.codecs.bf16 import BFloat16
from collectives.codecs.codec import Codec
from collectives.codecs.fp16 import Float16
from collectives.codecs.int8 import Int8Block
from collectives.codecs.topk import TopK

__all__ = ["CodecSpec", "CODECS", "WIRE_PREFIX", "parse", "from_wire", "wire_dtype", "names"]

CodecSpec: TypeAlias = Codec | str | None
"""What ``compression=`` takes: a Codec, a spec string ("fp16" | "bf16" | "int8" | "topk" |
"topk:RATIO"; "none" or "" for none), or None for none."""

CODECS: dict[str, Callable[[str | None], Codec]] = {
    "fp16": lambda arg: Float16() if arg is None else _no_argument("fp16"),
    "bf16": lambda arg: BFloat16() if arg is None else _no_argument("bf16"),
    "int8": lambda arg: Int8Block() if arg is None else _no_argument("int8"),
    "topk": lambda arg: TopK() if arg is None else TopK(_ratio(arg)),
}
"""family -> constructor from the text after ':' (None when there is none)."""

WIRE_PREFIX = "codec:"
"""A header's dtype field names a codec's payload as WIRE_PREFIX + the codec's name."""
_WIRE_CACHE: dict[str, Codec] = {}
_WIRE_CACHE_MAX = 64  # distinct names remembered; a sender cycling through more re-parses


def _no_argument(family: str) -> Codec:
    raise ValueError(f"codec {family!r} takes no argument")


def _ratio(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"top-k ratio {text!r} is not a number") from None


def names() -> list[str]:
    """The codec families, as documented."""
    return list(CODECS)


def parse(spec: CodecSpec) -> Codec | None:
    """The codec that ``compression=`` names: None (or "none") for none, a Codec as it is,
    or a spec string "fp16" | "bf16" | "int8" | "topk" | "topk:RATIO". ValueError for an
    unknown name, TypeError for another type."""
    if spec is None or isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"compression must be a codec name or a Codec, got "
                        f"{type(spec).__name__}")
    text = spec.strip().lower()
    if text in ("", "none"):
        return None
    family, sep, arg = text.partition(":")
    make = CODECS.get(family)
    if make is None:
        raise ValueError(f"unknown codec {spec!r}; known: {', '.join(CODECS)} "
                         "(top-k as topk:RATIO)")
    return make(arg if sep else None)


def wire_dtype(codec: Codec) -> str:
    """The header dtype of ``codec``'s payloads."""
    return WIRE_PREFIX + codec.name


def from_wire(dtype: str) -> Codec | None:
    """The codec a header's dtype names, if it is WIRE_PREFIX + a canonical codec name;
    None for anything else (never raises: the input came from the network)."""
    codec = _WIRE_CACHE.get(dtype)
    if codec is not None:
        return codec
    if not dtype.startswith(WIRE_PREFIX):
        return None
    name = dtype[len(WIRE_PREFIX):]
    try:
        codec = parse(name)
    except (ValueError, TypeError):
        return None
    if codec is None or codec.name != name:   # only the canonical spelling travels
        return None
    if len(_WIRE_CACHE) < _WIRE_CACHE_MAX:
        _WIRE_CACHE[dtype] = codec
    return codec
