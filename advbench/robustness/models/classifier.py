"""The model contract: [0, 1] NCHW in, logits out, normalisation inside."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from advbench.core.errors import AdvbenchError, first_line

NORMALIZATIONS = ("outside", "inside")


class Classifier(nn.Module):
    """Wraps a network that expects normalised input.

    Attacks clip to `bounds` and measure perturbations in pixel space, so normalisation must
    be part of the model; the mean/std buffers travel with the checkpoint. `arch` is the
    registry name, recorded in checkpoints to catch loading into the wrong network.
    """

    bounds: tuple[float, float] = (0.0, 1.0)
    randomized: bool = False

    def __init__(self, net: nn.Module, arch: str, in_channels: int, mean: Sequence[float], std: Sequence[float],
                 normalization: str = "outside", *, user_code: bool = False) -> None:
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise AdvbenchError(f"model.normalization must be one of {', '.join(NORMALIZATIONS)}, got '{normalization}'")
        self.arch = arch
        # Where a foreign state dict keeps the input normalisation (`checkpoint.load_checkpoint`):
        # `outside` (mean/std from the config), `inside` (the file's own `mu`/`sigma` buffers).
        self.normalization = normalization
        self.register_buffer("mean", _per_channel(mean, in_channels, "mean"))
        self.register_buffer("std", _per_channel(std, in_channels, "std"))
        if (self.std <= 0).any():
            raise AdvbenchError(f"model std must be positive, got {list(std)}")
        self.net = net
        self.user_code = user_code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.net((x - self.mean) / self.std)
        except torch.OutOfMemoryError:  # the batch size search's signal, not the model's fault
            raise
        except Exception as exc:  # a user's network failing mid-run: say whose, keep its traceback as the cause
            if not self.user_code:
                raise
            raise AdvbenchError(f"model '{self.arch}' failed on a batch of {x.shape[0]} "
                                f"{'x'.join(map(str, x.shape[1:]))} inputs: {type(exc).__name__}: {first_line(exc)}") from exc


def evaluation_mode(model: nn.Module) -> nn.Module:
    """`model` in the mode it is attacked in: eval, except that a model marked `randomized` (a
    user's stochastic network) keeps its dropout layers drawing.

    eval() would switch MC dropout off and leave a deterministic model judged by a vote over
    passes that all agree; batch norm and the rest still run on their stored statistics, so
    samples do not interact through a batch.
    """
    model.eval()
    if getattr(model, "randomized", False):
        for sub in model.modules():
            if isinstance(sub, nn.modules.dropout._DropoutNd):
                sub.train()
    return model


def _per_channel(values: Sequence[float], channels: int, what: str) -> torch.Tensor:
    """A (C, 1, 1) buffer; a single value is shared by every channel."""
    values = [float(v) for v in values]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise AdvbenchError(f"model {what} has {len(values)} entries, expected 1 or {channels} (in_channels)")
    return torch.tensor(values).view(channels, 1, 1)
