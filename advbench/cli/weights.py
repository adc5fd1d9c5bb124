"""Published weights the metrics and ImageNet models need: where they come from, fetching them.

Each entry names the file as its authors publish it, where the config expects it (the metric
YAML's weights option, or the weights folder for torchvision models), and how to check it: the
file must load into advbench's replica of the architecture with every key and shape matching,
and torchvision files must match the SHA-256 prefix in their names (torchvision's own check).
Files the authors publish only behind a web page (Google Drive, a repository README) cannot be
fetched by a program; `fetch` says where to get them and where to put them instead.

Downloads go to `<file>.part` first and resume with an HTTP Range request, so an interrupted
fetch continues where it stopped; the file takes its final name only after it is verified.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from omegaconf import OmegaConf

from advbench.core.errors import AdvbenchError
from advbench.core.paths import location

CHUNK = 1 << 20
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Published:
    """One weights file as its authors publish it.

    `metric`/`option` tie the file to a metric YAML key (the target path and the architecture
    that verifies it come from there); `model` names a torchvision ImageNet classifier
    instead. `direct=False` marks a link to a web page rather than to the file; `filename`
    is then the published file's name (a mirror serves it under that name).
    """

    name: str
    url: str
    source: str
    size_mb: float | None = None
    direct: bool = True
    filename: str | None = None
    metric: str | None = None
    option: str = "weights"
    model: str | None = None

    @property
    def published_name(self) -> str:
        return self.filename or Path(urlsplit(self.url).path).name

    def target(self) -> Path:
        """Where the config looks for the file."""
        if self.metric is None:
            return Path(location("weights")) / self.published_name
        from advbench.quality.metrics.registry import metric_config

        return Path(os.path.expanduser(str(OmegaConf.select(metric_config(self.metric), self.option))))

    def sha256_prefix(self) -> str | None:
        """torchvision names files `<arch>-<first 8 hex of SHA-256>.pth`; others publish no sum."""
        if self.model is None:
            return None
        return Path(self.published_name).stem.rsplit("-", 1)[-1]

    def verify(self, path: Path) -> None:
        """Load `path` into the architecture with strict keys; AdvbenchError on any mismatch."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the other weight options stay random on purpose
            if self.model is not None:
                from advbench.robustness.models.torchvision_nets import torchvision_net

                torchvision_net(self.model, 1000, 3, weights_path=str(path))
            else:
                from advbench.quality.metrics.registry import (
                    build_metric,
                    metric_config,
                )

                node = metric_config(self.metric)
                others = {k: None for k in ("weights", "backbone_weights") if k in node and k != self.option}
                build_metric(self.metric, **{self.option: str(path)}, **others)


def _torchvision(arch: str) -> Published:
    from torchvision import models

    weights = models.get_model_weights(arch).IMAGENET1K_V1
    return Published(arch, weights.url, f"torchvision's ImageNet {arch}", weights.meta.get("_file_size"), model=arch)


def catalogue() -> dict[str, Published]:
    """Every published file advbench knows, by the name `advbench weights fetch` takes."""
    entries = [
        Published("paq2piq", "https://github.com/baidut/FBIQA/releases/download/1.0/RoIPoolModel-fit.10.bs.120.pth",
                  "RoIPoolModel-fit.10.bs.120.pth of baidut/paq2piq", metric="paq2piq"),
        Published("linearity", "https://github.com/lidq92/LinearityIQA#test-demo",
                  "p1q2.pth of lidq92/LinearityIQA", direct=False, filename="p1q2.pth", metric="linearity"),
        Published("vsfa", "https://github.com/lidq92/VSFA/raw/master/models/VSFA.pt",
                  "models/VSFA.pt of lidq92/VSFA", metric="vsfa"),
        Published("mdtvsfa", "https://github.com/lidq92/MDTVSFA/raw/master/models/MDTVSFA.pt",
                  "models/MDTVSFA.pt of lidq92/MDTVSFA", metric="mdtvsfa"),
        Published("koncept", "https://github.com/ZhengyuZhao/koniq-PyTorch",
                  "the KonCept512 state dict of ZhengyuZhao/koniq-PyTorch", direct=False, filename="KonCept512.pth",
                  metric="koncept"),
        Published("nima", "https://s3-us-west-1.amazonaws.com/models-nima/pretrain-model.pth",
                  "pretrain-model.pth of truskovskiyk/nima.pytorch v1", metric="nima"),
        Published("spaq", "https://drive.google.com/file/d/1pXjXAIItViTFs7qUBY-b11WY50mzoVM2/view",
                  "BL_release.pt of h4nwei/SPAQ", direct=False, filename="BL_release.pt", metric="spaq"),
    ]
    entries += [_torchvision(arch) for arch in ("resnet50", "resnet152", "inception_v3")]
    return {e.name: e for e in entries}


def lookup(names: tuple[str, ...]) -> list[Published]:
    known = catalogue()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise AdvbenchError(f"unknown weights '{unknown[0]}'; valid: {', '.join(known)}")
    return [known[n] for n in names]


def source_url(entry: Published, mirror: str | None) -> str:
    """The published URL, or the same file name under a mirror (an internal server, a test)."""
    if mirror is None:
        return entry.url
    return mirror.rstrip("/") + "/" + entry.published_name


def _offline(url: str, exc: BaseException) -> AdvbenchError:
    reason = getattr(exc, "reason", None) or exc
    return AdvbenchError(f"cannot reach {urlsplit(url).netloc}: {reason}; "
                         f"fetch it where there is a network and copy the file, or pass --mirror URL")


def _open(url: str, offset: int) -> http.client.HTTPResponse:
    request = urllib.request.Request(url, headers={"User-Agent": "advbench"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the partial file is already complete
            raise
        raise AdvbenchError(f"{url}: the server answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, socket.timeout, ConnectionError) as exc:
        raise _offline(url, exc) from None


def download(url: str, part: Path, progress: Callable[[int, int | None], None]) -> None:
    """Fill `part` with the file at `url`, continuing an earlier partial download.

    `progress(done, total)` is called as bytes arrive. A server that ignores Range restarts
    the file from zero; a connection that drops leaves `part` for the next call to resume.
    """
    offset = part.stat().st_size if part.is_file() else 0
    try:
        response = _open(url, offset)
    except urllib.error.HTTPError:
        return  # 416: nothing left to fetch
    with response:
        if "text/html" in (response.headers.get("Content-Type") or ""):
            raise AdvbenchError(f"{url} sent a web page, not the file: download it in a browser")
        resumed = offset > 0 and response.status == 206
        if not resumed:
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        done = offset
        progress(done, total)
        try:
            with open(part, "ab" if resumed else "wb") as out:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    done += len(block)
                    progress(done, total)
        except (http.client.IncompleteRead, ConnectionError, socket.timeout, urllib.error.URLError) as exc:
            raise AdvbenchError(f"download of {url} stopped after {done / 1e6:.1f} MB ({type(exc).__name__}); "
                                f"run the same command again to resume") from None
    if total is not None and done < total:
        raise AdvbenchError(f"download of {url} stopped after {done / 1e6:.1f} of {total / 1e6:.1f} MB; "
                            f"run the same command again to resume")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def check_and_install(entry: Published, part: Path, target: Path) -> None:
    """Checksum (where published) and strict-key load, then give the file its final name."""
    prefix = entry.sha256_prefix()
    if prefix is not None and not sha256_of(part).startswith(prefix):
        part.unlink()
        raise AdvbenchError(f"{entry.name}: the downloaded file's SHA-256 does not start with {prefix} "
                            f"as its published name says; it was deleted, run the command again")
    try:
        entry.verify(part)
    except AdvbenchError as exc:
        part.unlink()
        raise AdvbenchError(f"{entry.name}: the downloaded file does not fit the architecture ({exc}); it was deleted") from None
    os.replace(part, target)


def fetch(entry: Published, mirror: str | None, force: bool,
          progress: Callable[[int, int | None], None]) -> Path:
    """Download, verify and install one entry; a present file is kept unless `force`."""
    target = entry.target()
    if target.is_file() and not force:
        return target
    if not entry.direct and mirror is None:
        raise AdvbenchError(f"{entry.name}: {entry.source} is published behind {entry.url}; "
                            f"download it there and save it as {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    if force:
        part.unlink(missing_ok=True)
    download(source_url(entry, mirror), part, progress)
    check_and_install(entry, part, target)
    return target


def rows() -> Iterator[tuple[Published, Path, bool]]:
    """(entry, target, present) for `advbench weights list`."""
    for entry in catalogue().values():
        target = entry.target()
        yield entry, target, target.is_file()
