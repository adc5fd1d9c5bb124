"""Fetching the published weights the metrics and ImageNet models need, checking and locking them.

Where each metric's file comes from is declared beside the metrics (`quality.metrics.published`);
torchvision's files are listed here. Each entry names the file as its authors publish it, where
the config expects it (the metric YAML's weights option, or the weights folder for torchvision
models and NIQE's parameters), and how to check it: the file must load into advbench's replica
of the architecture with every key and shape matching, and torchvision files must match the
SHA-256 prefix in their names (torchvision's own check).
Files the authors publish only behind a web page (Google Drive, a repository README) cannot be
fetched by a program; `fetch` says where to get them and where to put them instead.

Downloads go to `<file>.part` first and resume with an HTTP Range request, so an interrupted
fetch continues where it stopped; the file takes its final name only after it is verified.
`advbench.core.download` bounds what a server can do (size, pace, redirects, links). Every
installed file's SHA-256 and how it was checked go into a lock file in the weights folder
(`LOCK_FILE`), which `advbench weights list` reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlsplit

from omegaconf import OmegaConf

from advbench.cli.option_targets import target_of
from advbench.core.download import CHUNK, Limits, check_url, download, open_no_follow
from advbench.core.errors import AdvbenchError
from advbench.core.paths import location
from advbench.quality.metrics.published import PUBLISHED, PublishedWeights

LOCK_FILE = "advbench-weights.lock.json"
""""name -> {file, sha256, checked}" of every file `fetch` installed, in the weights folder."""


@dataclass(frozen=True, kw_only=True)
class Published(PublishedWeights):
    """One file `advbench weights` fetches, by `name`: a metric's (`metric`, its entry in
    `quality.metrics.published`) or a torchvision ImageNet classifier's (`model`).

    A metric's file goes where its YAML's `option` points (the architecture that verifies it
    comes from there too); a file without an option goes to the weights folder.
    """

    name: str
    metric: str | None = None
    model: str | None = None

    def target(self) -> Path:
        """Where the config looks for the file."""
        if self.option is None:
            return Path(location("weights")) / self.published_name
        from advbench.cli.options import load_option  # the YAML alone: listing needs no torch

        return Path(os.path.expanduser(str(OmegaConf.select(load_option("metric", self.metric), self.option))))

    def sha256_prefix(self) -> str | None:
        """The published checksum: a full SHA-256, or torchvision's `<arch>-<first 8 hex>.pth` name."""
        if self.sha256 is not None:
            return self.sha256
        if self.model is None:
            return None
        return Path(self.published_name).stem.rsplit("-", 1)[-1]

    def limits(self, mirror: str | None) -> Limits:
        """Size cap from the catalogue; redirects within the publisher's hosts, or the mirror's only."""
        hosts = {urlsplit(mirror).hostname} if mirror else {urlsplit(self.url).hostname, *self.hosts}
        return Limits.for_size(frozenset(h for h in hosts if h), None if self.size_mb is None else self.size_mb * 1e6)

    def verify(self, path: Path) -> None:
        """Load `path` into the architecture with strict keys; AdvbenchError on any mismatch."""
        if self.reader is not None:
            target_of(self.reader)(path)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the other weight options stay random on purpose
            if self.model is not None:
                from advbench.robustness.models.torchvision_nets import torchvision_net

                torchvision_net(self.model, 1000, 3, weights_path=str(path))
            else:
                from advbench.cli.metrics import build_metric, metric_config

                node = metric_config(self.metric)
                others = {k: None for k in ("weights", "backbone_weights") if k in node and k != self.option}
                build_metric(self.metric, **{self.option: str(path)}, **others)


TORCHVISION = {
    "resnet50": ("https://download.pytorch.org/models/resnet50-0676ba61.pth", 97.781),
    "resnet152": ("https://download.pytorch.org/models/resnet152-394f9c45.pth", 230.434),
    "inception_v3": ("https://download.pytorch.org/models/inception_v3_google-0cc3c7bd.pth", 103.903),
}
"""torchvision's IMAGENET1K_V1 files (URL, MB), written out so that `advbench weights list` starts
without importing torch; `tests/test_weights.py` checks them against torchvision's own table."""


def catalogue() -> dict[str, Published]:
    """Every published file advbench knows, by the name `advbench weights fetch` takes: each metric's
    (`quality.metrics.published.PUBLISHED`), then torchvision's."""
    entries = [Published(name=metric, metric=metric, **{f.name: getattr(weights, f.name) for f in fields(weights)})
               for metric, weights in PUBLISHED.items()]
    entries += [Published(name=arch, url=url, source=f"torchvision's ImageNet {arch}", size_mb=size_mb, option=None,
                          model=arch) for arch, (url, size_mb) in TORCHVISION.items()]
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
    return check_url(mirror, "--mirror").rstrip("/") + "/" + entry.published_name


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def check_and_install(entry: Published, part: Path, target: Path) -> None:
    """Checksum (where published) and strict-key load, then give the file its final name and lock it."""
    prefix = entry.sha256_prefix()
    digest = sha256_of(part)
    if prefix is not None and not digest.startswith(prefix):
        part.unlink()
        expected = f"is not the pinned {prefix}" if entry.pinned else f"does not start with {prefix} as its published name says"
        raise AdvbenchError(f"{entry.name}: the downloaded file's SHA-256 {expected}; it was deleted, run the command again")
    try:
        entry.verify(part)
    except AdvbenchError as exc:
        part.unlink()
        raise AdvbenchError(f"{entry.name}: the downloaded file does not fit the architecture ({exc}); it was deleted") from None
    if target.is_symlink():
        raise AdvbenchError(f"'{target}' is a symbolic link; advbench installs only regular files there: remove it")
    os.replace(part, target)
    checked = "sha256 (pinned)" if entry.pinned else "sha256 (published)" if prefix is not None and len(prefix) == 64 else \
        "sha256 prefix (published) + keys and shapes" if prefix is not None else "keys and shapes only"
    _lock(entry.name, {"file": str(target), "sha256": digest, "checked": checked})


def _lock_path() -> Path:
    return Path(location("weights")) / LOCK_FILE


def locked() -> dict[str, dict[str, str]]:
    """The lock file's entries (empty when nothing was fetched)."""
    try:
        return json.loads(_lock_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _lock(name: str, record: dict[str, str]) -> None:
    entries = {**locked(), name: record}
    path = _lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with os.fdopen(open_no_follow(tmp, append=False), "w", encoding="utf-8") as out:
        json.dump(entries, out, indent=1, sort_keys=True)
    os.replace(tmp, path)


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
    download(source_url(entry, mirror), part, progress, entry.limits(mirror))
    check_and_install(entry, part, target)
    return target


def rows() -> Iterator[tuple[Published, Path, bool, str]]:
    """(entry, target, present, how it was checked) for `advbench weights list`.

    A present file is "verified" only if the lock file holds its current SHA-256; a file put
    there by hand, or changed since, shows as not checked; a missing one as not yet (checked).
    """
    lock = locked()
    for entry in catalogue().values():
        target = entry.target()
        present = target.is_file()
        record = lock.get(entry.name, {})
        current = present and record.get("file") == str(target) and record.get("sha256") == sha256_of(target)
        yield entry, target, present, record.get("checked", "") if current else ("not checked" if present else NOT_YET)


NOT_YET = "not yet"
"""The "checked" column of a file that is not there: `advbench weights fetch` checks it when it arrives."""
CHECKED_NOTE = (
    'checked: what `advbench weights fetch` verified of the file now present: its published SHA-256 '
    "(or torchvision's prefix of it) or, where the authors publish no checksum, "
    '"keys and shapes only"; "not checked": put there by hand or '
    'changed since; "not yet": no file yet, it is checked when fetched.'
)
"""The footer of `advbench weights list` that says what its "checked" column means."""


ROBUSTBENCH = "robustbench:"
"""`advbench weights fetch robustbench:<name>`: a RobustBench zoo entry rather than a catalogue name."""


def fetch_robustbench(spec: str, dataset: str, threat: str, force: bool) -> list[Path]:
    """RobustBench's file(s) for `robustbench:<name>` through its own downloader, into the layout
    `model=robustbench` reads (`model_dir` of conf/model/robustbench.yaml)."""
    from advbench.cli.options import load_option
    from advbench.robustness.models import robustbench_zoo

    model_dir = OmegaConf.select(load_option("model", "robustbench"), "model_dir")
    return robustbench_zoo.fetch(spec[len(ROBUSTBENCH):], dataset, threat, model_dir, force)
