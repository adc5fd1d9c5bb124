"""How records and console lines name things: the goals, a model's row, an attack, a defense's category.

The engine writes these names into records and prints them while a cell runs; the readers
(`report/`, `audit/`) group and label by the same rules. They live below both, free of torch
and pandas, so that the engine needs nothing from the readers and `advbench plot` no model stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GOALS = ("untargeted", "targeted")
"""An attack's goals, as the threat and the records' `goal` column spell them."""
NORM_AT = "norm_at_"
"""Prefix of the records' query checkpoints: `norm_at_<q>` = the smallest norm (threat units) an
attack had found after at most q queries (decision-based attacks)."""
PLAIN = ("natural", "none")
"""Defenses a row does not name: natural training and a model object as given (`models.given.AS_GIVEN`)
add nothing to the network, so one network is one row name from `advbench run` and the Python API."""


def row_name(label: str, defense: str) -> str:
    """A cell's model row, in tables, figures and on the console: the label, with `+<defense>` where
    the defense is not the label and adds something to the network ('mine+pgd_at', 'resnet18+jpeg')."""
    return label if defense == label or defense in PLAIN else f"{label}+{defense}"


def attack_label(name: str, params: Mapping[str, Any]) -> str:
    """An attack as figures, tables and messages name it: with its `version` where it has one
    ('autoattack-standard'), so that the numbers of two versions never read as one attack's."""
    version = params.get("version")
    return name if version is None else f"{name}-{version}"


def category_label(category: object) -> str:
    """One label for a defense's `category:` (a list of the seed's categories, or one name)."""
    if category is None:
        return ""
    if isinstance(category, (list, tuple)):
        return ", ".join(map(str, category))
    return str(category)
