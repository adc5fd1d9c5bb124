"""CNNQA: a small CNN quality metric that advbench trains itself, offline, in well under a minute.

What it measures: how strongly an image shows four synthetic distortions — Gaussian blur,
additive Gaussian noise, JPEG compression and contrast loss — each at three strengths. It is
trained on random 64x64 crops of the training split of scikit-image's sample photos
(`advbench.quality.images`) to score the clean crop above every distorted version of it and a
stronger distortion below a weaker one (a pairwise ranking loss), plus a weak anchor pulling
scores towards fixed targets (90 for clean, 70/45/20 for the three strengths), so scores are
comparable across distortion types. Output in [0, 100], higher is better.

Limits: it knows nothing of human opinion beyond "less of these four distortions is
better"; it is blind to other artefacts (colour shifts, ringing from other codecs, banding,
semantic content) and its absolute level depends on the training photos. Its convolutions,
pooling and gradients are those of the CNN metrics the seed attacks, which is what a UAP
stability test needs; it is not a substitute for a validated metric.

Weights live in `<cache_dir>/cnnqa/cnnqa-v1.pt` (cache_dir defaults to $ADVBENCH_CACHE or
~/.cache/advbench). A missing default file is trained on first use (progress bar); an
explicit `weights=` path that does not exist is an error.

Training runs on one CPU thread whatever torch's setting: a convolution's sums are split across
threads, so the same seed trained on one and on two threads gives other weights (the FGSM gain of
`iqa run` at 8/255 moved from 0.536 to 0.525, docs/iqa.md), and the first use decides the cache.
On one thread the same seed gives bitwise the same weights on a given torch build.
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.paths import location
from advbench.core.runtime import threads_for
from advbench.quality.images import photo_crops
from advbench.quality.metrics.metric_contract import QualityMetric

WEIGHTS_FILE = "cnnqa/cnnqa-v1.pt"
TARGETS = (0.9, 0.7, 0.45, 0.2)  # anchor quality of clean, mild, medium, strong
BLUR_SIGMAS = (0.8, 1.6, 3.0)
NOISE_STDS = (0.02, 0.05, 0.1)
JPEG_QUALITIES = (40, 20, 8)
CONTRAST_FACTORS = (0.7, 0.45, 0.25)
LEVELS = len(TARGETS)


class QualityNet(nn.Module):
    """Three strided conv layers, mean and std pooling, a two-layer head: logits (N,).

    The first layer is a 4x4 stride-2 convolution: it still sees every pixel (windows overlap),
    so it can learn the high-pass filters that noise, blur and JPEG blocking show up in, at a
    quarter of the cost of a full-resolution layer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 24, 4, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(24, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features((x - 0.5) / 0.25).flatten(2)
        pooled = torch.cat([f.mean(-1), (f.var(-1, unbiased=False) + 1e-6).sqrt()], 1)
        return self.head(pooled).squeeze(1)


def _blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur (reflect padding), radius 3 sigma."""
    radius = max(1, int(3 * sigma))
    ax = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-(ax ** 2) / (2 * sigma ** 2))
    k = (k / k.sum()).repeat(3, 1, 1, 1)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="reflect"), k.view(3, 1, 1, -1), groups=3)
    return F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), k.view(3, 1, -1, 1), groups=3)


def _jpeg(x: torch.Tensor, quality: int) -> torch.Tensor:
    """Real JPEG round trip (PIL) of every image in a batch."""
    out = []
    for img in (x.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        out.append(np.array(Image.open(buf).convert("RGB")))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 255


def distortion_ladder(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(4 types, B, 3, H, W) clean crops -> (4 types, 4 levels, B, 3, H, W).

    Type t distorts its own B crops (blur, noise, JPEG, contrast); level 0 is the clean crop,
    levels 1..3 are increasingly strong.
    """
    blur, noisy, jpeg, faded = x
    mean = faded.mean((1, 2, 3), keepdim=True)
    noise = torch.randn(noisy.shape, generator=generator)
    ladders = [
        [blur, *(_blur(blur, s) for s in BLUR_SIGMAS)],
        [noisy, *((noisy + s * noise).clamp(0, 1) for s in NOISE_STDS)],
        [jpeg, *(_jpeg(jpeg, q) for q in JPEG_QUALITIES)],
        [faded, *(mean + c * (faded - mean) for c in CONTRAST_FACTORS)],
    ]
    return torch.stack([torch.stack(levels) for levels in ladders])


def ranking_loss(logits: torch.Tensor, margin: float = 0.5) -> torch.Tensor:
    """(types, levels, B) logits: every weaker level must beat every stronger one by `margin`."""
    i, j = torch.triu_indices(LEVELS, LEVELS, offset=1)
    return F.relu(margin - (logits[:, i] - logits[:, j])).mean()


def train_cnnqa(*, steps: int = 200, batch_size: int = 16, crop: int = 64, lr: float = 2e-3,
                seed: int = 0, progress: bool = True) -> QualityNet:
    """Train a QualityNet on distortion ladders of random crops of the training photos.

    Each step draws `batch_size` crops, a quarter per distortion type, and ranks the four
    levels of each crop's ladder. On one thread, so the weights do not depend on the machine's cores.
    """
    if batch_size < 4 or steps < 1:
        raise AdvbenchError(f"cnnqa training needs batch_size >= 4 and steps >= 1, got {batch_size} and {steps}")
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    pool = photo_crops("train", size=crop, stride=crop // 2)
    net = QualityNet()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    targets = torch.tensor(TARGETS).view(1, LEVELS, 1)
    columns = (TextColumn("training cnnqa"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[loss]}"),
               TimeRemainingColumn())
    with threads_for(1), Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("train", total=steps, loss="")  # no loss before the first step
        for _ in range(steps):
            idx = torch.randint(len(pool), (batch_size // 4 * 4,), generator=gen)
            flip = torch.rand(len(idx), generator=gen) < 0.5
            clean = torch.where(flip.view(-1, 1, 1, 1), pool[idx].flip(-1), pool[idx])
            ladder = distortion_ladder(clean.view(4, -1, *clean.shape[1:]), gen)
            logits = net(ladder.flatten(0, 2)).view(*ladder.shape[:3])
            loss = ranking_loss(logits) + 0.5 * F.binary_cross_entropy_with_logits(logits, targets.expand_as(logits))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            bar.update(task, advance=1, loss=f"loss {loss.item():.3f}")
    return net.eval()


def save_weights(net: QualityNet, path: str | Path) -> Path:
    """Write the state dict atomically: a temporary file beside `path`, renamed into place.

    A killed run never leaves a half file under the real name, and a failed write (a full
    disk) removes its temporary file before the OSError goes on to the command's one line.
    """
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        torch.save({"state_dict": net.state_dict(), "meta": {"metric": "cnnqa", "version": 1}}, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def default_weights(cache_dir: str | Path) -> Path:
    """The cached weights, trained (with a progress bar) when the file is not there yet."""
    path = Path(cache_dir).expanduser() / WEIGHTS_FILE
    if not path.is_file():
        save_weights(train_cnnqa(), path)
    return path


class CNNQA(QualityMetric):
    """advbench's self-trained CNN quality metric: score in [0, 100], higher is better."""

    higher_better = True
    score_range = (0.0, 100.0)
    differentiable = True

    def __init__(self, name: str = "cnnqa", weights: str | None = None,
                 cache_dir: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.net = QualityNet()
        file = Path(weights).expanduser() if weights is not None else default_weights(cache_dir or location("cache"))
        if not file.is_file():
            raise AdvbenchError(f"cnnqa: weights file '{file}' not found; expected a file written by "
                                "advbench.quality.metrics.learned.save_weights (or weights: null to train one)")
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)["state_dict"]
            self.net.load_state_dict(state)
        except Exception as exc:  # noqa: BLE001 - any failure means the file is not ours
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise AdvbenchError(f"cnnqa: cannot load weights '{file}': {first}") from None
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> CNNQA:
        """Always in eval mode: a metric is a fixed scoring function."""
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise AdvbenchError(f"cnnqa: expected images (N, 3, H, W) in [0, 1], got shape {tuple(x.shape)}")
        return 100 * torch.sigmoid(self.net(x))
