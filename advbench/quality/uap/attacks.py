"""Universal perturbations as attacks on a metric: one perturbation for every image, applied at amplitude ε.

`uap` is the seed paper's Adam-trained perturbation (`advbench uap train`'s `train_uap`);
`cumulative_uap` is the MSU benchmark's Cumulative-UAP, which adds every batch's raw loss
gradient to the perturbation (a plain gradient step of size `lr`, 1 in MSU) and clips it to
[-0.1, 0.1]. Either is trained once per metric on the sample photos' train split (or loaded
from `file`), kept under the records folder by content key, and applied as
`clip(x + tile(δ) · ε / 0.1)`, so no pixel moves by more than ε and the cell is judged on the
held-out test split.

A cache entry must be the perturbation its name promises: the settings saved beside it are
the ones its content key was computed from, and its shape is a training crop's. A UAP
trained otherwise and copied over the entry would load without complaint and make the
cell's records claim settings that were never used, so it is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from rich.console import Console
from torch.utils.data import DataLoader

from advbench.core import hyperparameters as hyper
from advbench.core.digests import module_digest, tensor_digest
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key
from advbench.core.torchfile import read_torch_file
from advbench.quality.attacks.metric_attack import Attacked, MetricAttack, PrepareContext, final_scores
from advbench.quality.images import uap_images
from advbench.quality.iqa.guard import user_metric_failures
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.uap.perturbation import CLAMP, SIZE, apply_uap, check_uap, load_uap, save_uap
from advbench.quality.uap.training import train_uap, uap_loss


def train_cumulative_uap(metric: QualityMetric, images: Any, *, epochs: int = 5, batch_size: int = 8,
                         lr: float = 1.0, seed: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """MSU's Cumulative-UAP: p ← clip(p − lr·∇loss, ±0.1) after every batch, loss = 1 − goodness, p₀ = 1e-4."""
    device = device or torch.device("cpu")
    metric = metric.to(device).eval()
    loader = DataLoader(images, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))
    p = torch.full((3, *images[0].shape[-2:]), 1e-4, device=device)
    for _ in range(epochs):
        for batch in loader:
            p.requires_grad_(True)
            (grad,) = torch.autograd.grad(uap_loss(metric, (batch.to(device) + p).clamp(0, 1)), p)
            p = (p.detach() - lr * grad).clamp(-CLAMP, CLAMP)
    return p.detach().cpu()


def load_cache_entry(pt: Path, settings: Mapping[str, Any], shape: tuple[int, ...]) -> torch.Tensor:
    """The UAP cached at `pt`, if it is the entry its name promises: trained with `settings`, of `shape`.

    Read with tensors and plain values only; a file that is not a UAP, meta that is missing or
    unreadable, other settings or another shape is a one-line AdvbenchError saying what differs.
    """
    fix = "it is not the cache entry its name promises; delete it and advbench trains the right one"
    try:
        obj = read_torch_file(pt, "UAP")
    except AdvbenchError as exc:
        raise AdvbenchError(f"{exc}; {fix}") from None
    uap = obj.get("uap") if isinstance(obj, dict) else None
    if not isinstance(uap, torch.Tensor):
        raise AdvbenchError(f"the cached UAP '{pt}' holds no UAP tensor (expected key 'uap'): {fix}")
    try:
        found = json.loads(obj.get("meta", ""))
    except (TypeError, ValueError):
        found = None
    if not isinstance(found, dict):
        raise AdvbenchError(f"the cached UAP '{pt}' carries no readable settings: {fix}")
    expected = json.loads(json.dumps(dict(settings)))  # as save_uap stored them (JSON values)
    differs = [f"{k} {_shown(found, k)}, not {_shown(expected, k)}"
               for k in sorted(set(found) | set(expected), key=str) if found.get(k, ...) != expected.get(k, ...)]
    if tuple(uap.shape) != tuple(shape):
        differs.append(f"shape {tuple(uap.shape)}, not {tuple(shape)}")
    if differs:
        raise AdvbenchError(f"the cached UAP '{pt}' was trained with {'; '.join(differs)}: {fix}")
    return check_uap(uap.float().contiguous(), str(pt)).clamp(-CLAMP, CLAMP)


def _shown(values: Mapping[str, Any], key: str) -> str:
    """One setting as a message shows it: its repr, cut short, or `none` when it is absent."""
    text = repr(values[key]) if key in values else "none"
    return text if len(text) <= 80 else f"{text[:77]}..."


class Universal(MetricAttack):
    name = "uap"
    hyperparameters = {"file": hyper.File(optional=True), "epochs": hyper.Whole(1), "lr": hyper.Real(0, open_low=True),
                       "batch_size": hyper.Whole(1), "n_train": hyper.Whole(1, optional=True)}

    def __init__(self, *, file: str | None = None, epochs: int = 5, lr: float = 1e-3, batch_size: int = 8,
                 n_train: int | None = None) -> None:
        self.set_hyperparameters(locals())
        self.delta: torch.Tensor | None = None

    def _train(self, metric: QualityMetric, images: Any, context: PrepareContext) -> torch.Tensor:
        return train_uap(metric, images, size=images[0].shape[-1], lr=self.lr, epochs=self.epochs,
                         batch_size=self.batch_size, seed=context.seed, device=context.device,
                         progress=context.progress)

    def prepare(self, metric: QualityMetric, context: PrepareContext) -> dict[str, Any]:
        """Load `file`, or the perturbation trained before with these settings, or train it now."""
        if self.file:
            self.delta = load_uap(self.file)
        else:
            # lr as a float: lr=1 and lr=1.0 train one perturbation, so they name one cache entry
            settings = {"method": self.name, "metric": module_digest(metric), "epochs": self.epochs,
                        "lr": float(self.lr), "batch_size": self.batch_size, "n_train": self.n_train,
                        "seed": context.seed}
            base = Path(context.cache) / f"{self.name}-{content_key(settings)}"
            if base.with_suffix(".pt").is_file():
                self.delta = load_cache_entry(base.with_suffix(".pt"), settings, (3, SIZE, SIZE))
            else:
                images = uap_images(None, split="train", size=SIZE, limit=self.n_train)
                Console(stderr=True).print(f"[dim]training {self.name} on {len(images)} photo crops, "
                                           f"{self.epochs} epoch(s)[/dim]")
                with user_metric_failures(metric, getattr(metric, "name", type(metric).__name__),
                                          f"training {self.name} on {len(images)} photo crops"):
                    self.delta = self._train(metric, images, context)
                save_uap(self.delta, base, settings)
        return {"uap": tensor_digest(self.delta)}

    def run(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor) -> Attacked:
        if self.delta is None:
            raise AdvbenchError(f"{self.name}: prepare() loads or trains the perturbation before run()")
        x_adv = torch.empty_like(x)
        for amplitude in eps.unique().tolist():
            rows = eps == amplitude
            x_adv[rows] = apply_uap(x[rows], self.delta.to(x), amplitude)
        return Attacked(x_adv, final_scores(metric, x_adv), 0)


class CumulativeUniversal(Universal):
    name = "cumulative_uap"

    def __init__(self, *, file: str | None = None, epochs: int = 5, lr: float = 1.0, batch_size: int = 8,
                 n_train: int | None = None) -> None:
        super().__init__(file=file, epochs=epochs, lr=lr, batch_size=batch_size, n_train=n_train)

    def _train(self, metric: QualityMetric, images: Any, context: PrepareContext) -> torch.Tensor:
        return train_cumulative_uap(metric, images, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                    seed=context.seed, device=context.device)
