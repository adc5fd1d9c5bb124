"""A data set option becomes its class and the arguments it gives, bound to the class's parameters where the options are read."""

from __future__ import annotations

import pytest

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec, dataset_spec
from advbench.core.errors import AdvbenchError
from advbench.robustness.data.digits import Digits

DIGITS = "advbench.robustness.data.digits.Digits"


def test_the_option_is_its_class_and_its_arguments() -> None:
    spec = cell_spec(compose_config("config", ["dataset.n_samples=40"])).dataset
    assert (spec.name, spec.builder.source, spec.builder.factory) == ("digits", DIGITS, Digits)
    assert spec.builder.given["n_samples"] == 40 and spec.builder.given["split_seed"] == 0
    assert spec.identity(evaluation=True) == {"_target_": DIGITS, "n_samples": 40, "test_fraction": 0.3, "split_seed": 0}
    assert "n_samples" not in spec.identity(evaluation=False)  # training uses the whole split
    assert len(spec.build().eval_set()) == 40
    assert len(spec.build(n_samples=None).eval_set()) > 40


def test_a_key_the_class_does_not_take_is_refused_where_the_option_is_read() -> None:
    with pytest.raises(AdvbenchError, match=f"^{DIGITS}: got an unexpected keyword argument 'nsamples'$"):
        dataset_spec({"_target_": DIGITS, "name": "digits", "nsamples": 3})
    with pytest.raises(AdvbenchError, match="^dataset option 'mine' has no _target_: nothing says what to build$"):
        dataset_spec({"name": "mine"})
    with pytest.raises(AdvbenchError, match="^_target_ 'no_such_module.Data': cannot import no_such_module"):
        dataset_spec({"_target_": "no_such_module.Data", "name": "mine"})


def test_a_class_taking_keywords_gives_them_spread_out(tmp_path, monkeypatch) -> None:
    """A class of one's own with `**options` is keyed by each option it is given, as its YAML says them."""
    (tmp_path / "mydata.py").write_text("def Data(name, **options):\n    return (name, options)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = dataset_spec({"_target_": "mydata.Data", "name": "mine", "root": "/data", "n_samples": 5})
    assert spec.builder.given == {"name": "mine", "root": "/data", "n_samples": 5}
    assert spec.identity(evaluation=True) == {"_target_": "mydata.Data", "root": "/data", "n_samples": 5}
    assert spec.build() == ("mine", {"root": "/data", "n_samples": 5})
