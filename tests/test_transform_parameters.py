"""A transform's parameters are declared once (`core.transforms.PARAMETERS`) for both halves' defenses:
a classifier's wrapper and a metric's defense refuse the same values in the same words, each naming
its own option key."""

from __future__ import annotations

import pytest
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.transforms import PARAMETERS, check_parameters
from advbench.quality.metrics.defended import KINDS, MetricDefense
from advbench.robustness.defenses.wrappers import WRAPPERS

SHARED = ("jpeg", "bit_depth")
"""The transforms both halves deploy: a classifier wrapper of the same name and a metric defense kind."""


@pytest.mark.parametrize("transform", SHARED)
def test_both_halves_refuse_what_the_declaration_refuses(transform: str) -> None:
    (name, valid), = PARAMETERS[transform].items()
    for bad in valid.bad():
        if bad is None:
            continue
        with pytest.raises(AdvbenchError) as wrapper:
            WRAPPERS[transform](nn.Identity(), **{name: bad})
        with pytest.raises(AdvbenchError) as metric:
            KINDS[transform].params(**{name: bad}).check()
        said = str(wrapper.value).removeprefix("defense.wrapper.")
        assert said == str(metric.value).removeprefix("defense.params."), (said, str(metric.value))
        assert said.startswith(f"{name} must be ") and "\n" not in said


def test_every_metric_defense_kind_is_declared_in_core() -> None:
    declared = {kind.params.transform for kind in KINDS.values()} - {None}
    assert declared == set(PARAMETERS), "a metric defense's parameters are the shared declaration's"
    assert set(SHARED) <= set(WRAPPERS) & set(KINDS)


def test_the_ends_of_each_range_are_valid() -> None:
    assert check_parameters("jpeg", {"quality": 1}, "k") == {"quality": 1}
    assert check_parameters("jpeg", {"quality": 100}, "k") == {"quality": 100}
    assert check_parameters("median", {"k": 15}, "k") == {"k": 15}
    with pytest.raises(AdvbenchError, match=r"^k\.k must be an odd whole number in \[1, 15\], got 14$"):
        check_parameters("median", {"k": 14}, "k")
    with pytest.raises(AdvbenchError, match=r"^defense\.params\.sigma must be a number in \(0, 10\], got 0$"):
        MetricDefense("blur", KINDS["blur"].params(sigma=0))
