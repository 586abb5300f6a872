"""How `gossip demo` scores a model: the test set as tensors (normalised as every peer
normalises), accuracy and loss in chunks, and the accuracy of the peers' averaged parameters
(evaluated in the launching process, once the peers are gone). torch is imported when used.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gossip.demo.data import Dataset
from gossip.demo.model import make_cnn

__all__ = ["tensors", "evaluate", "pixel_statistics", "flat_parameters", "averaged_accuracies"]

_EVAL_CHUNK = 1000  # test images per forward pass: bounds memory on MNIST's 10000


def tensors(images: np.ndarray, labels: np.ndarray, max_value: float, mean: float,
            std: float) -> tuple[Any, Any]:
    """(x, y) as torch tensors: images normalised (mean, std on the [0, 1] scale) to
    (N, 1, H, W) float32, labels int64."""
    import torch

    x = (images.astype(np.float32) / max_value - mean) / std
    return torch.from_numpy(x[:, None]), torch.from_numpy(labels.astype(np.int64))


def evaluate(model: Any, x: Any, y: Any) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on (x, y)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for lo in range(0, len(y), _EVAL_CHUNK):
            logits = model(x[lo:lo + _EVAL_CHUNK])
            target = y[lo:lo + _EVAL_CHUNK]
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(1) == target).sum())
    model.train()
    return correct / len(y), loss / len(y)


def averaged_accuracies(dataset: Dataset, vectors: list[np.ndarray]) -> list[float]:
    """Test accuracy of the model whose parameters are each of ``vectors`` (the peers'
    averages, each one vector in flat_parameters' order), normalised as the peers
    normalise: one model and one copy of the test set for all."""
    import torch

    model = make_cnn(dataset.image_shape, dataset.classes)
    mean, std = pixel_statistics(dataset)
    x, y = tensors(dataset.test_images, dataset.test_labels, dataset.max_value, mean, std)
    out = []
    for parameters in vectors:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(
                torch.from_numpy(parameters.astype(np.float32)), model.parameters())
        out.append(evaluate(model, x, y)[0])
    return out


def flat_parameters(model: Any) -> np.ndarray:
    """The model's parameters as one float32 vector (what the consensus distance compares)."""
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def pixel_statistics(dataset: Dataset) -> tuple[float, float]:
    """Mean and standard deviation of the training pixels on the [0, 1] scale: every peer
    normalises with the whole training set's, so they agree. From a histogram of the uint8
    values, so MNIST's 47 MB never becomes a float copy."""
    counts = np.bincount(dataset.train_images.ravel(), minlength=256).astype(np.float64)
    values = np.arange(len(counts)) / dataset.max_value
    mean = float(counts @ values / counts.sum())
    std = float(np.sqrt(counts @ (values - mean) ** 2 / counts.sum()))
    return mean, std or 1.0
