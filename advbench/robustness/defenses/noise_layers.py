"""Random self-ensemble (Liu et al. 2018): Gaussian noise layers before convolutions.

The noise layers have no parameters, so they are forward pre-hooks on the network's own
`Conv2d` modules, active only inside `conv_noise`: an RSE checkpoint has the plain
architecture's key layout, any architecture with convolutions takes them, and a model used
elsewhere never keeps a hook. The "init" noise (σ_init) is added to the [0, 1] image, as
the authors' VGG takes unnormalised images, so it lands before the first convolution; the
"inner" noise (σ_inner) is added to the input of every later convolution.

Training (recipe `rse`, `recipes/rse.py`) draws with torch's generator (seeded by the trainer);
the deployed model (`wrappers.RandomSelfEnsemble`) draws per row with `advbench.core.sample_draws`,
keyed by sample id and call index (`Draw` gets the pass's keys through its closure, so the hooks
stay stateless and a resumed run draws what an uninterrupted one does), and averages the logits
of an ensemble of noisy passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

Draw = Callable[[torch.Tensor, int], torch.Tensor]
"""(activation, layer index) -> noise of the activation's shape."""


def inner_convolutions(model: nn.Module) -> list[nn.Conv2d]:
    """The convolutions that get inner noise: all but the first (which sees the init noise)."""
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)][1:]


def _add_noise(draw: Draw, layer: int, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:  # noqa: ARG001
    return (args[0] + draw(args[0], layer), *args[1:])


@contextmanager
def conv_noise(model: nn.Module, draw: Draw) -> Iterator[None]:
    """While open, `draw(input, layer)` is added to the input of each of `inner_convolutions`."""
    handles = [conv.register_forward_pre_hook(partial(_add_noise, draw, layer))
               for layer, conv in enumerate(inner_convolutions(model))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()

