"""`PoolTo`: the digits nets' pool is free on maps already its size, and the numbers are torch's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from advbench.robustness.models import build_model
from advbench.robustness.models.pool import PoolTo


def test_a_map_of_the_pools_size_passes_unchanged_and_others_pool_as_torch_does() -> None:
    x = torch.randn(3, 5, 4, 4)
    assert PoolTo(4)(x) is x
    assert torch.equal(F.adaptive_avg_pool2d(x, 4), x), "torch's pool to the same size is the identity too"
    y = torch.randn(3, 5, 9, 7)
    assert torch.equal(PoolTo(4)(y), F.adaptive_avg_pool2d(y, 4))
    assert torch.equal(PoolTo(4)(x[..., :2, :2]), F.adaptive_avg_pool2d(x[..., :2, :2], 4))


def test_small_cnn_gives_the_numbers_of_the_net_with_torchs_pool() -> None:
    torch.manual_seed(0)
    model = build_model("small_cnn", num_classes=10, in_channels=1).eval()
    reference = build_model("small_cnn", num_classes=10, in_channels=1).eval()
    reference.net[4] = nn.AdaptiveAvgPool2d(4)
    reference.load_state_dict(model.state_dict())  # the pool has no parameters: checkpoints load either way
    outputs = []
    for net in (model, reference):
        torch.manual_seed(1)
        x = torch.rand(6, 1, 8, 8, requires_grad=True)
        logits = net(x)
        grad, = torch.autograd.grad(F.cross_entropy(logits, torch.arange(6)), x)
        outputs.append((logits.detach(), grad))
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])
