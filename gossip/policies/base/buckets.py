"""Buckets: a model's parameters packed once into a few contiguous flat buffers, so that every
averaging step is a handful of large messages and no per-step allocation.

torch tensors are *rebound*: each ``param.data`` becomes a view of its bucket, so the optimizer
updates the bucket in place and the policy communicates it without a copy; with
``gradients=True`` each ``param.grad`` is likewise a view of a flat gradient bucket.

numpy arrays cannot be rebound, so the user's arrays stay authoritative: ``copy_in()`` packs
them into the buckets before a communication and ``copy_out()`` writes the result back (two
memory copies, no allocation).

Buckets group parameters by (dtype, device) and hold about ``bucket_bytes`` each (25 MiB by
default, as torch's DistributedDataParallel); a parameter larger than that gets a bucket of its
own. With ``gradients=True`` parameters are packed in reverse order, the order in which
backward produces their gradients, so the first bucket is the first one ready.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from collectives.arrays import adapter_for
from gossip.policies.base.arguments import check_int

__all__ = ["DEFAULT_BUCKET_BYTES", "Placement", "Bucket", "BucketSet", "is_torch_tensor"]

DEFAULT_BUCKET_BYTES = 25 << 20
"""Bytes a bucket holds by default (25 MiB, as torch's DistributedDataParallel); a parameter larger
than that gets a bucket of its own."""


def is_torch_tensor(x: Any) -> bool:
    """True for a torch tensor, without importing torch (a numpy-only user never loads it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


@dataclass(frozen=True)
class Placement:
    """Where one parameter lives in its bucket."""

    index: int         # position of the parameter in the list given to BucketSet
    offset: int        # first element of the parameter in its bucket
    numel: int         # number of elements
    shape: tuple       # the parameter's shape


class Bucket:
    """One flat buffer (a numpy array or a torch tensor) holding several parameters back to
    back, and, for torch with gradients, the matching flat gradient buffer."""

    def __init__(self, index: int, flat: Any, placements: list[Placement],
                 grad: Any = None) -> None:
        self.index = index
        self.flat = flat
        self.placements = placements
        self.grad = grad
        if isinstance(flat, np.ndarray):
            self.numel, self.itemsize = int(flat.size), int(flat.itemsize)
        else:
            self.numel, self.itemsize = int(flat.numel()), int(flat.element_size())

    @property
    def nbytes(self) -> int:
        """Size of the parameter buffer in bytes."""
        return self.numel * self.itemsize

    def view(self, place: Placement, buffer: Any = None) -> Any:
        """The place's elements of ``buffer`` (default: the parameter bucket), in its shape."""
        buf = self.flat if buffer is None else buffer
        return buf[place.offset:place.offset + place.numel].reshape(place.shape)

    def new(self, extra: int = 0, *, numel: int | None = None) -> Any:
        """A zeroed flat buffer like the bucket (same kind, dtype, device) of ``numel``
        elements (default: the bucket's) plus ``extra``: push-sum appends its weight to the
        parameters so both travel in one message."""
        count = (self.numel if numel is None else numel) + extra
        return adapter_for(self.flat).zeros(count, self.flat)

    def __repr__(self) -> str:
        return (f"Bucket({self.index}, {len(self.placements)} parameters, {self.numel} elements, "
                f"{self.nbytes / 2**20:.2f} MiB)")


class BucketSet:
    """The parameters of one policy, packed into buckets.

    ``params``: a non-empty list of torch tensors or of numpy arrays (not mixed), of a floating
    dtype. torch tensors are rebound to bucket views at construction (see the module doc).
    ``names``: the parameters' own names, one each (a module's ``fc.weight``), for errors and
    for ``describe()``; default none (a parameter is then named by its place, ``#3``).
    """

    def __init__(self, params: Iterable[Any], *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int | None = None, gradients: bool = False,
                 names: Sequence[str] | None = None) -> None:
        params = list(params)
        if not params:
            raise ValueError("no parameters to attach: pass a non-empty list of torch tensors "
                             "or numpy arrays (e.g. list(model.parameters()))")
        if names is not None:
            names = [str(n) for n in names]
            if len(names) != len(params):
                raise ValueError(f"{len(names)} names for {len(params)} parameters; give one "
                                 "name per parameter")
        self.names: list[str] | None = names
        check_int("bucket_bytes", bucket_bytes)
        kinds = {"torch" if is_torch_tensor(p) else "numpy" if isinstance(p, np.ndarray)
                 else type(p).__name__ for p in params}
        if len(kinds) > 1 or not kinds <= {"torch", "numpy"}:
            raise TypeError(f"parameters must be all torch tensors or all numpy arrays, got "
                            f"{sorted(kinds)}")
        seen: set[int] = set()
        for i, p in enumerate(params):
            if id(p) in seen:
                raise ValueError(f"parameter #{i} appears twice in the list; pass each once")
            seen.add(id(p))
        self.kind = kinds.pop()
        self.params = params
        self.gradients = gradients and self.kind == "torch"
        if self.kind == "numpy":
            for i, p in enumerate(params):
                if p.dtype.kind != "f":
                    raise TypeError(f"parameter #{i} is {p.dtype}; averaging needs a floating "
                                    "dtype (float16, float32 or float64)")
                if not p.flags.writeable:
                    raise ValueError(f"parameter #{i} is read-only; policies update it in place")
        else:
            import torch
            for i, p in enumerate(params):
                if not p.dtype.is_floating_point:
                    raise TypeError(f"parameter #{i} is {p.dtype}; averaging needs a floating "
                                    "dtype")
                if p.layout != torch.strided:
                    raise TypeError(f"parameter #{i} has layout {p.layout}; only dense tensors "
                                    "can be packed into buckets")
        if first_bucket_bytes is None:
            first_bucket_bytes = bucket_bytes
        check_int("first_bucket_bytes", first_bucket_bytes)
        self.buckets = self._pack(bucket_bytes, first_bucket_bytes)
        self._where: dict[int, tuple[Bucket, Placement]] = {
            id(self.params[s.index]): (b, s) for b in self.buckets for s in b.placements}
        if self.kind == "torch":
            self._rebind()
        else:
            self.copy_in()

    # ------------------------------------------------------------------ packing
    def _key(self, p: Any) -> tuple:
        if self.kind == "numpy":
            return ("numpy", p.dtype.str)
        return ("torch", str(p.dtype), str(p.device))

    def _pack(self, bucket_bytes: int, first_bucket_bytes: int) -> list[Bucket]:
        order: Iterable[int] = range(len(self.params))
        if self.gradients:
            # backward produces the last layers' gradients first
            order = reversed(range(len(self.params)))
        open_: dict[tuple, list[Placement]] = {}
        closed: list[list[Placement]] = []
        sizes: dict[tuple, int] = {}
        for i in order:
            p = self.params[i]
            key = self._key(p)
            numel = int(p.size if self.kind == "numpy" else p.numel())
            itemsize = int(p.itemsize if self.kind == "numpy" else p.element_size())
            placements = open_.get(key)
            # The first bucket of each kind may be smaller (DDP's is 1 MiB), so that the first
            # allreduce starts early in the backward pass.
            first = not any(self._key(self.params[c[0].index]) == key for c in closed)
            cap = first_bucket_bytes if first else bucket_bytes
            if placements is not None and (sizes[key] + numel) * itemsize > cap:
                closed.append(placements)
                placements = None
            if placements is None:
                placements = open_[key] = []
                sizes[key] = 0
            placements.append(Placement(i, sizes[key], numel, tuple(p.shape)))
            sizes[key] += numel
        # Buckets in the order they were opened: the same on every peer for the same model.
        groups = sorted(closed + [s for s in open_.values() if s],
                        key=lambda placements: self._rank_of(placements[0].index))
        return [self._allocate(k, placements) for k, placements in enumerate(groups)]

    def _rank_of(self, index: int) -> int:
        return len(self.params) - 1 - index if self.gradients else index

    def _allocate(self, k: int, placements: list[Placement]) -> Bucket:
        first = self.params[placements[0].index]
        total = placements[-1].offset + placements[-1].numel
        if self.kind == "numpy":
            return Bucket(k, np.empty(total, dtype=first.dtype), placements)
        import torch
        with torch.no_grad():
            flat = torch.empty(total, dtype=first.dtype, device=first.device)
            grad = torch.zeros_like(flat) if self.gradients else None
        return Bucket(k, flat, placements, grad)

    def _rebind(self) -> None:
        import torch
        with torch.no_grad():
            for b in self.buckets:
                for s in b.placements:
                    p = self.params[s.index]
                    view = b.view(s)
                    view.copy_(p.detach())
                    p.data = view
                    if b.grad is not None and p.requires_grad:
                        g = b.view(s, b.grad)
                        if p.grad is not None:
                            g.copy_(p.grad)
                        p.grad = g

    # ------------------------------------------------------------------ numpy round trip
    def copy_in(self) -> None:
        """numpy: pack the user's arrays into the buckets (torch: nothing to do, the
        parameters are the buckets)."""
        if self.kind != "numpy":
            return
        for b in self.buckets:
            for s in b.placements:
                np.copyto(b.view(s), self.params[s.index])

    def copy_out(self) -> None:
        """numpy: write the buckets back into the user's arrays."""
        if self.kind != "numpy":
            return
        for b in self.buckets:
            for s in b.placements:
                np.copyto(self.params[s.index], b.view(s))

    # ------------------------------------------------------------------ torch upkeep
    def locate(self, param: Any) -> tuple[Bucket, Placement]:
        """The bucket and place of one of the parameters."""
        try:
            return self._where[id(param)]
        except KeyError:
            raise ValueError("this tensor is not one of the attached parameters") from None

    def check_bound(self) -> None:
        """torch: raise if a parameter no longer lives in its bucket (``param.data`` was
        replaced, e.g. by ``model.to(...)`` after attach), since the policy would then
        average buffers the optimizer no longer updates."""
        if self.kind != "torch":
            return
        for b in self.buckets:
            base = b.flat.data_ptr()
            for s in b.placements:
                p = self.params[s.index]
                if p.data_ptr() != base + s.offset * b.itemsize:
                    raise RuntimeError(
                        f"parameter #{s.index} (shape {tuple(p.shape)}) was moved out of its "
                        "bucket after the policy was attached (param.data replaced, or the "
                        "model moved with .to()/.cuda()); move the model first, then attach")

    def bind_grad(self, param: Any) -> Any:
        """Make ``param.grad`` the view of the gradient bucket (copying a gradient autograd
        allocated after zero_grad(set_to_none=True)); returns the view."""
        b, s = self._where[id(param)]
        view = b.view(s, b.grad)
        g = param.grad
        if g is None:
            view.zero_()
            param.grad = view
        elif g.data_ptr() != view.data_ptr():
            view.copy_(g)
            param.grad = view
        return view

    def zero_grads(self) -> None:
        """Zero the gradient buckets in place (one fill per bucket) and keep ``param.grad``
        bound to them, so the next backward accumulates straight into the buckets."""
        for b in self.buckets:
            if b.grad is not None:
                b.grad.zero_()
        for b in self.buckets:
            for s in b.placements:
                p = self.params[s.index]
                if p.requires_grad and (p.grad is None
                                        or p.grad.data_ptr() != b.grad.data_ptr()
                                        + s.offset * b.itemsize):
                    p.grad = b.view(s, b.grad)

    # ------------------------------------------------------------------ description
    def name_of(self, index: int) -> str:
        """Parameter ``index`` as errors name it: its own name and its place ("fc.weight
        (#2)"), or its place alone ("#2")."""
        return f"{self.names[index]} (#{index})" if self.names is not None else f"#{index}"

    def describe(self) -> list[list]:
        """Each parameter as given (in the order given): [name or None, dtype, shape], plain
        values, so another peer can tell which of its own differs (a joiner's model)."""
        out = []
        for i, p in enumerate(self.params):
            dtype = p.dtype.name if self.kind == "numpy" else str(p.dtype).replace("torch.", "")
            out.append([self.names[i] if self.names is not None else None, dtype,
                        [int(d) for d in p.shape]])
        return out

    # ------------------------------------------------------------------ sizes
    @property
    def numel(self) -> int:
        """Elements in all buckets."""
        return sum(b.numel for b in self.buckets)

    @property
    def nbytes(self) -> int:
        """Bytes in all parameter buckets."""
        return sum(b.nbytes for b in self.buckets)

    def __len__(self) -> int:
        return len(self.buckets)

    def __iter__(self):
        return iter(self.buckets)

    def __repr__(self) -> str:
        return (f"BucketSet({self.kind}, {len(self.params)} parameters in {len(self.buckets)} "
                f"buckets, {self.nbytes / 2**20:.2f} MiB)")
