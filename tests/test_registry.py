"""The one registration mechanism (`core.registry.Registry`) and the three registries built on it."""

from __future__ import annotations

import functools
import inspect

import pytest

from advbench.core.errors import AdvbenchError
from advbench.core.registry import Registry
from advbench.robustness.defenses.recipes import REGISTRY
from advbench.robustness.defenses.wrappers import WRAPPERS
from advbench.robustness.models import ARCHITECTURES


def _fresh() -> Registry:
    things: Registry = Registry("thing")

    @things.register("b")
    def b() -> str:
        return "b"

    @things.register("a")
    class A:
        pass

    return things


def test_register_returns_the_object_and_keeps_registration_order():
    things = _fresh()
    assert list(things) == ["b", "a"] and len(things) == 2
    assert things["b"]() == "b" and things["a"].__name__ == "A"
    assert "a" in things and "c" not in things and things.get("c") is None
    assert sorted(things) == ["a", "b"] and dict(things.items())["b"] is things["b"]


def test_a_name_registered_twice_is_refused():
    things = _fresh()
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.register("a")(object)
    assert list(things) == ["b", "a"]


def test_unknown_name_is_a_one_line_error_naming_the_valid_ones():
    with pytest.raises(AdvbenchError) as err:
        _fresh().lookup("c")
    assert str(err.value) == "unknown thing 'c'; valid: a, b"
    with pytest.raises(KeyError):
        _fresh()["c"]


def test_registry_is_read_only():
    things = _fresh()
    with pytest.raises(TypeError):
        things["c"] = object  # type: ignore[index]
    with pytest.raises(TypeError):
        del things["a"]  # type: ignore[attr-defined]
    assert not hasattr(things, "update") and not hasattr(things, "pop")


def test_make_builds_the_entry_and_extra_arguments_need_it():
    specs: Registry = Registry("spec", lambda name, obj, *args, **kwargs: (name, obj, args, kwargs))

    @specs.register("x", 1, flag=True)
    def f() -> None:
        pass

    assert specs["x"] == ("x", f, (1,), {"flag": True})
    with pytest.raises(TypeError, match="no arguments beyond the name"):
        _fresh().register("c", 1)


def test_the_three_registries_keep_their_order():
    assert list(WRAPPERS) == ["jpeg", "bit_depth", "random_resize_pad", "rse", "randmix"]
    assert list(ARCHITECTURES) == ["small_cnn", "resnet56", "resnet110", "wrn34_10", "wrn28_10", "preact_resnet18",
                                   "ibp_large", "vgg16", "inception_v3", "resnet50", "resnet152"]
    assert list(REGISTRY) == ["natural", "pgd_at", "trades", "deepdefense", "alp", "ens_at", "adp", "rse", "convex"]


def _registered_in(obj: object) -> str:
    """The module whose source carries the `register(...)` decorator of `obj`."""
    obj = obj.func if isinstance(obj, functools.partial) else obj
    source = inspect.getsource(inspect.getmodule(obj))
    assert f"\nclass {obj.__name__}(" in source or f"\ndef {obj.__name__}(" in source
    return obj.__module__


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_each_wrapper_is_registered_beside_its_class(name):
    cls = WRAPPERS[name]
    assert _registered_in(cls) == "advbench.robustness.defenses.wrappers"
    assert f'@WRAPPERS.register("{name}")\nclass {cls.__name__}(' in inspect.getsource(inspect.getmodule(cls))


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_each_architecture_is_registered_beside_its_builder(name):
    build = ARCHITECTURES[name].build
    build = build.func if isinstance(build, functools.partial) else build
    assert _registered_in(build).startswith("advbench.robustness.models.")
    lines = inspect.getsource(inspect.getmodule(build)).split("\n")
    at = lines.index(next(line for line in lines if line.startswith(f"def {build.__name__}(")))
    above = lines[:at][::-1]
    decorators = above[:next(i for i, line in enumerate(above) if not line.startswith(("@", "#")))]
    assert any(line.startswith(f'@ARCHITECTURES.register("{name}",') for line in decorators)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_recipe_is_registered_beside_its_loss_in_its_own_module(name):
    loss = REGISTRY[name].loss
    assert REGISTRY[name].name == name
    assert _registered_in(loss) == f"advbench.robustness.defenses.recipes.{name}"
    assert f'@REGISTRY.register("{name}"' in inspect.getsource(inspect.getmodule(loss)).split(f"\ndef {loss.__name__}(")[0][-120:]
