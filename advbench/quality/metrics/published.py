"""Where each metric's published weights come from: the authors' files, declared beside the metrics.

One entry per metric whose file `advbench weights fetch <metric>` installs or says where to get
(`PUBLISHED`, in the order `advbench weights list` shows them). The entries are data: fetching,
checking and locking the files is the command line's (`advbench.cli.weights`), and the metrics
read what it installed (`author_weights.FETCHED`, `niqe_pristine.FETCHED_FILE` come from here).
Nothing heavy is imported, so `advbench weights list` starts without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

GITHUB_HOSTS = ("github.com", "raw.githubusercontent.com", "objects.githubusercontent.com",
                "release-assets.githubusercontent.com")
"""Where GitHub sends a release asset or a raw file (its CDN)."""


@dataclass(frozen=True)
class PublishedWeights:
    """One weights file as its authors publish it.

    `direct=False` marks a link to a web page rather than to the file; `filename` is then the
    published file's name (a mirror serves it under that name).
    """

    url: str
    source: str
    size_mb: float | None = None
    direct: bool = True
    filename: str | None = None
    option: str | None = "weights"
    """The metric YAML key that names where the file goes; None: the weights folder, under its published name."""
    hosts: tuple[str, ...] = ()
    """Hosts the publisher's server may redirect to (its own host is always allowed)."""
    sha256: str | None = None
    """The full SHA-256 where the publisher gives one, or the one advbench pins (`pinned`)."""
    pinned: bool = False
    """`sha256` is advbench's pin of a known copy of the file rather than one the publisher gives."""
    reader: str | None = None
    """The dotted path of what checks a file that is no network's weights (NIQE's parameters): it must
    read the file without error. A path, not the function: its module loads numpy and torch."""

    @property
    def published_name(self) -> str:
        return self.filename or Path(urlsplit(self.url).path).name


PUBLISHED: dict[str, PublishedWeights] = {
    "paq2piq": PublishedWeights("https://github.com/baidut/FBIQA/releases/download/1.0/RoIPoolModel-fit.10.bs.120.pth",
                                "RoIPoolModel-fit.10.bs.120.pth of baidut/paq2piq", hosts=GITHUB_HOSTS),
    "linearity": PublishedWeights("https://github.com/lidq92/LinearityIQA#test-demo", "p1q2.pth of lidq92/LinearityIQA",
                                  direct=False, filename="p1q2.pth"),
    "vsfa": PublishedWeights("https://github.com/lidq92/VSFA/raw/master/models/VSFA.pt", "models/VSFA.pt of lidq92/VSFA",
                             hosts=GITHUB_HOSTS),
    "mdtvsfa": PublishedWeights("https://github.com/lidq92/MDTVSFA/raw/master/models/MDTVSFA.pt",
                                "models/MDTVSFA.pt of lidq92/MDTVSFA", hosts=GITHUB_HOSTS),
    "koncept": PublishedWeights("https://github.com/ZhengyuZhao/koniq-PyTorch",
                                "the KonCept512 state dict of ZhengyuZhao/koniq-PyTorch", direct=False,
                                filename="KonCept512.pth"),
    "nima": PublishedWeights("https://s3-us-west-1.amazonaws.com/models-nima/pretrain-model.pth",
                             "pretrain-model.pth of truskovskiyk/nima.pytorch v1"),
    "spaq": PublishedWeights("https://drive.google.com/file/d/1pXjXAIItViTFs7qUBY-b11WY50mzoVM2/view",
                             "BL_release.pt of h4nwei/SPAQ", direct=False, filename="BL_release.pt"),
    # basicsr 1.4.2's copy of NIQE's pristine parameters (the file its PyPI release installs), read by metric=niqe
    "niqe": PublishedWeights("https://github.com/XPixelGroup/BasicSR/raw/v1.4.2/basicsr/metrics/niqe_pris_params.npz",
                             "basicsr/metrics/niqe_pris_params.npz of XPixelGroup/BasicSR v1.4.2 "
                             "(the authors' NIQE parameters)", 0.012, option=None, hosts=GITHUB_HOSTS,
                             sha256="2a7c182a68c9e7f1b2e2e5ec723279d6f65d912b6fcaf37eb2bf03d7367c4296", pinned=True,
                             reader="advbench.quality.metrics.niqe_pristine.check_fetched_file"),
}
"""Metric name -> its published file: the name `advbench weights fetch` takes is the metric's."""
