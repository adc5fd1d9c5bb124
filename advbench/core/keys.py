"""Content keys: what a cached checkpoint or a cell's records depend on, hashed.

A key must change whenever an input that changes the numbers changes (a data root, a split,
a recipe, the bytes of a checkpoint), and must not change with labels or settings that leave
the numbers alone, so that finished work is reused exactly when it is still valid.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Dataset keys that never change an image, a label or a sample id: the option name (a label),
# the default budgets (the cell key holds the budget actually used) and the download switch.
_DATASET_LABELS = ("name", "budgets", "download", "description")
_PATH_KEYS = ("root", "train_root")
_HASH_BLOCK = 1 << 20


def content_key(value: Any, length: int = 12) -> str:
    """Short sha256 of a JSON-able value, independent of dict order."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:length]


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes: a checkpoint's identity, whatever its name or location."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def plain(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """A plain dict of a mapping, nested mappings and sequences made plain too (empty for None)."""
    return {} if cfg is None else plain_value(cfg)


def plain_value(value: Any) -> Any:
    """Nested mappings as dicts and sequences (not strings) as lists; any other value as it is.

    Configs arrive as read-only mappings of mappings; records, keys and messages need plain ones.
    """
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain_value(v) for v in value]
    return value


def dataset_identity(source: str, arguments: Mapping[str, Any], *, evaluation: bool) -> dict[str, Any]:
    """What decides a data set's images: its class (`source`, keyed as `_target_`, the option's name
    for it), roots (absolute), split, subset.

    `evaluation=False` drops `n_samples` (training always uses the whole split).
    """
    out = {k: v for k, v in {"_target_": source, **plain(arguments)}.items() if k not in _DATASET_LABELS}
    for k in _PATH_KEYS:
        if out.get(k) is not None:
            out[k] = os.path.abspath(os.path.expanduser(str(out[k])))
    if not evaluation:
        out.pop("n_samples", None)
    return out


DEFENSE_LABELS = ("name", "description", "category", "threat_model")
"""Keys of a `conf/defense` YAML that describe it and never change a number (not in any key)."""


def defense_identity(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The defense config minus its labels: the recipe and wrapper that decide the numbers.

    The one filter for targets and substitutes alike, so relabelling a defense keys nothing anew.
    """
    return {k: v for k, v in plain(cfg).items() if k not in DEFENSE_LABELS}


NEWER_MODEL_KEYS = ("eot_samples",)
"""Model keys added after cells were keyed: left out of a deterministic model's identity while null
(their default), so its cells keep their keys. A randomized model keeps them: its cells were
computed with its dropout switched off and no EOT before, and must not be reused."""


def model_identity(source: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a model's network: its builder (`source`, keyed as `_target_`, the option's name for it)
    and arguments, minus the option's name and description (and a deterministic model's newer keys left null)."""
    spec = {"_target_": source, **plain(arguments)}
    return {k: v for k, v in spec.items() if k not in ("name", "description")
            and not (k in NEWER_MODEL_KEYS and v is None and not spec.get("randomized"))}
