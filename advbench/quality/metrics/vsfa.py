"""VSFA (Li, Jiang & Jiang, ACM MM 2019) and MDTVSFA (IJCV 2021): video quality from frame features.

Both follow the authors' two-stage code (lidq92/VSFA, lidq92/MDTVSFA): an ImageNet ResNet-50
gives per-frame "content-aware" features, the mean and the (unbiased) standard deviation of
res5c over space (2 x 2048 = 4096-d); a linear reduction to 128-d, a GRU (32 hidden) and a
linear layer give per-frame quality; subjectively-inspired temporal pooling (SITP) turns
those into one score. MDTVSFA bounds the pooled score with a sigmoid and applies its learnt
4-parameter nonlinear mapping (`nlm`), returning the `mapped_score` of its demo.

Two files per metric: the authors' head (`VSFA.pt`, `MDTVSFA.pt`, plain state dicts) and the
torchvision ImageNet ResNet-50 checkpoint the features were extracted with.

Frames are scored at their native resolution, as the authors do. One deliberate difference:
features are computed in eval mode. The original VSFA feature script never called `.eval()`,
so its BatchNorm used the statistics of each 64-frame chunk, which would make a frame's score
depend on its batch-mates (MDTVSFA's script fixed this).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from advbench.quality.metrics.author_weights import WeightFile
from advbench.quality.metrics.common import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Normalize,
    PretrainedMetric,
    WeightPath,
    resnet_trunk,
    stage_channels,
)


def sitp(q: torch.Tensor, tau: int = 12, beta: float = 0.5) -> torch.Tensor:
    """Subjectively-inspired temporal pooling of frame scores q (N, T) -> (N, T).

    Per frame: beta * (softmin-weighted mean of the next tau frames) + (1 - beta) * (min of the
    previous tau frames), padded as in the authors' `TP` (-inf before, a large score after).
    """
    n = q.shape[0]
    before = q.new_full((n, tau - 1), -math.inf)
    after = q.new_full((n, tau - 1), 10000.0)
    memory = -F.max_pool1d(torch.cat((before, -q), dim=1).unsqueeze(1), tau, stride=1).squeeze(1)
    weights = torch.exp(-torch.cat((q, after), dim=1)).unsqueeze(1)
    padded = torch.cat((q, after), dim=1).unsqueeze(1)
    current = (F.avg_pool1d(padded * weights, tau, stride=1) / F.avg_pool1d(weights, tau, stride=1)).squeeze(1)
    return beta * current + (1 - beta) * memory


class FrameFeatures(nn.Module):
    """ImageNet-normalised frames -> [mean, std] of the last ResNet stage, (M, 2C)."""

    def __init__(self, arch: str, metric: str) -> None:
        super().__init__()
        self.arch = arch
        self.normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD)
        self.trunk = resnet_trunk(arch, metric, named=True)
        self.dim = 2 * stage_channels(self.trunk.layer4)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        maps = self.trunk(self.normalize(frames)).flatten(2)
        return torch.cat([maps.mean(dim=2), maps.std(dim=2)], dim=1)


class _VideoMetric(PretrainedMetric):
    """Shared video plumbing: chunked frame features, a head over time, images as 1-frame videos.

    `score_video` (from `QualityMetric`) is `pool_video(frame_features(...))`; the RD job calls
    the two halves itself so a clip streams through the CNN chunk by chunk.
    """

    is_video = True
    input_size = None
    default_name: str
    head_cls: type[nn.Module]
    head_source: str

    def __init__(
        self,
        weights: WeightPath = None,
        backbone_weights: WeightPath = None,
        backbone: str = "resnet50",
        frame_batch_size: int = 64,
        name: str | None = None,
    ) -> None:
        super().__init__(name or self.default_name)
        self.features = FrameFeatures(backbone, self.name)
        self.net = self.head_cls(self.features.dim)
        self.frame_batch_size = int(frame_batch_size)
        self.load_weights(weights=weights, backbone_weights=backbone_weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {
            "weights": WeightFile(self.net, self.head_source),
            "backbone_weights": WeightFile(
                self.features.trunk, f"torchvision's ImageNet {self.features.arch} state dict", ignore=("fc.",)
            ),
        }

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of images is a batch of 1-frame videos."""
        return self.pool_video(self.frame_features(x).unsqueeze(1))

    def frame_features(self, frames: torch.Tensor) -> torch.Tensor:
        """(M, 3, H, W) -> (M, D) content-aware features, pushed through the CNN in chunks."""
        return torch.cat([self.features(chunk) for chunk in frames.split(self.frame_batch_size)])

    def pool_video(self, features: torch.Tensor) -> torch.Tensor:
        """(N, T, D) -> (N,): the authors' head, GRU and temporal pooling over each whole clip."""
        return self.net(features)


class ANN(nn.Module):
    """VSFA's dimension reduction: `fc0` only (the `fc` layer exists but n_ANNlayers = 1)."""

    def __init__(self, input_size: int, reduced_size: int = 128) -> None:
        super().__init__()
        self.fc0 = nn.Linear(input_size, reduced_size)
        self.fc = nn.Linear(reduced_size, reduced_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc0(x)


class VSFAHead(nn.Module):
    """The network in the authors' `VSFA.pt`: ann -> GRU -> per-frame quality q."""

    def __init__(self, input_size: int, reduced_size: int = 128, hidden_size: int = 32) -> None:
        super().__init__()
        self.ann = ANN(input_size, reduced_size)
        self.rnn = nn.GRU(reduced_size, hidden_size, batch_first=True)
        self.q = nn.Linear(hidden_size, 1)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.ann(feats))
        return sitp(self.q(out).squeeze(2)).mean(dim=1)


class VSFA(_VideoMetric):
    """VSFA score, the MOS divided by the training set's maximum (about 0-1, higher is better)."""

    higher_better = True
    score_range = (0.0, 1.0)
    default_name = "vsfa"
    head_cls = VSFAHead
    head_source = "models/VSFA.pt of lidq92/VSFA"


class MDTVSFAHead(nn.Module):
    """The network in the authors' `MDTVSFA.pt` (their `VQAModel`, names kept, typo included)."""

    datasets = ("K", "C", "L", "N")  # KoNViD-1k, CVD2014, LIVE-Qualcomm, LIVE-VQC alignments

    def __init__(self, input_size: int, reduced_size: int = 128, hidden_size: int = 32) -> None:
        super().__init__()
        self.dimemsion_reduction = nn.Linear(input_size, reduced_size)
        self.feature_aggregation = nn.GRU(reduced_size, hidden_size, batch_first=True)
        self.regression = nn.Linear(hidden_size, 1)
        self.bound = nn.Sigmoid()
        self.nlm = nn.Sequential(nn.Linear(1, 1), nn.Sigmoid(), nn.Linear(1, 1))
        self.lm = nn.Sequential(OrderedDict((d, nn.Linear(1, 1)) for d in self.datasets))
        # The authors' initial mapping; it is what random-init (test) builds compute.
        nn.init.constant_(self.nlm[0].weight, 2 * math.sqrt(3))
        nn.init.constant_(self.nlm[0].bias, -math.sqrt(3))
        nn.init.constant_(self.nlm[2].weight, 1.0)
        nn.init.constant_(self.nlm[2].bias, 0.0)
        for layer in self.lm:
            nn.init.constant_(layer.weight, 1.0)
            nn.init.constant_(layer.bias, 0.0)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        out, _ = self.feature_aggregation(self.dimemsion_reduction(feats))
        q = self.regression(out).squeeze(2)
        relative = self.bound(sitp(q).mean(dim=1, keepdim=True))
        return self.nlm(relative).squeeze(1)


class MDTVSFA(_VideoMetric):
    """MDTVSFA mapped (perceptual) score, about 0-1, higher is better."""

    higher_better = True
    score_range = (0.0, 1.0)
    default_name = "mdtvsfa"
    head_cls = MDTVSFAHead
    head_source = "models/MDTVSFA.pt of lidq92/MDTVSFA"
