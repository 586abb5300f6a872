"""The demo's model: a small LeNet-style CNN, sized from the images it will see.

    model = make_cnn((8, 8))      # digits: about 14k parameters
    model = make_cnn((28, 28))    # MNIST: about 105k parameters

torch is imported when a model is made, not when this module is imported.
"""
from __future__ import annotations

from typing import Any

__all__ = ["make_cnn", "count_parameters"]


def make_cnn(image_shape: tuple[int, int], classes: int = 10, *,
             channels: tuple[int, int] = (16, 32), hidden: int = 64) -> Any:
    """conv(1->16, 3x3, pad 1)-relu-maxpool 2 -> conv(16->32, 3x3, pad 1)-relu-maxpool 2 ->
    fc(32 * H/4 * W/4 -> 64)-relu -> fc(10), as a torch.nn.Sequential taking (N, 1, H, W)."""
    import torch.nn as nn

    h, w = image_shape
    if h < 4 or w < 4:
        raise ValueError(f"images of {h}x{w} are too small for two 2x2 poolings (4x4 at least)")
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * (h // 4) * (w // 4), hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def count_parameters(model: Any) -> int:
    """The number of elements in all of ``model``'s parameters."""
    return sum(p.numel() for p in model.parameters())
