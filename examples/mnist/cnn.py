"""A small CNN for MNIST, built as pipe wants a user's model: an nn.SequentialCell of layers.

    python examples/mnist/train.py --model cnn
    mpiexec -n 2 python examples/mnist/train.py --model cnn --stages 2 --dropout 0.25
    mpiexec -n 2 python examples/mnist/train.py --model cnn --stages 2 --build own

It has what real models have and what a pipeline must get right: batch norm (moving
statistics), a skip connection, dropout. The skip connection is one layer (`Residual`):
pipe splits the SequentialCell between layers, never inside one.
"""
from mindspore import nn


class Residual(nn.Cell):
    """x + block(x). One layer to pipe: a stage boundary never cuts the skip."""

    def __init__(self, channels):
        super().__init__()
        self.block = nn.SequentialCell([
            nn.Conv2d(channels, channels, 3, pad_mode="same"), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, pad_mode="same")])

    def construct(self, x):
        return x + self.block(x)


def cnn_layers(channels=8, dropout=0.25, classes=10):
    """(B, 784) pixels -> 10 logits: one builder per layer, 11 layers (shapes in comments).
    Given as the model, each rank builds only its own layers (pipe.features.builders)."""
    return [
        lambda: nn.Unflatten(1, (1, 28, 28)),                          # (B, 1, 28, 28)
        lambda: nn.Conv2d(1, channels, 3, pad_mode="same"),            # (B, C, 28, 28)
        lambda: nn.BatchNorm2d(channels),
        nn.ReLU,
        lambda: nn.MaxPool2d(2, 2),                                    # (B, C, 14, 14)
        lambda: Residual(channels),
        nn.ReLU,
        lambda: nn.MaxPool2d(2, 2),                                    # (B, C, 7, 7)
        nn.Flatten,                                                    # (B, 49 C)
        lambda: nn.Dropout(p=dropout),
        lambda: nn.Dense(49 * channels, classes)]                      # (B, 10)

