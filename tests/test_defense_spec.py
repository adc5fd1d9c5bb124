"""A defense option typed where the options are read keys its cells and checkpoints as the YAML did.

`DefenseSpec` holds a checked `Recipe` and `WrapperSpec`; the cell key's `defense_config` and the
checkpoint key's recipe still hash the option as written, so a finished record or a trained
checkpoint stays found. The keys pinned here were computed from the YAML mappings before the
defense was typed; a new option joins the table with the keys it gets.
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import defense_spec, target_spec
from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key, defense_identity
from advbench.robustness.defenses.checkpoint_cache import checkpoint_key
from advbench.robustness.defenses.wrappers import JPEG, RandomResizePad

KEYS = [  # overrides of `advbench train`, content_key(defense_config), checkpoint key
    (["defense=adp"], "fb926f15baad", "dbff6cccf39b"),
    (["defense=alp"], "2c5e79217b76", "a9bd2c564ed2"),
    (["defense=bit_red"], "47a8037960be", "e3bdd0a2a887"),
    (["defense=convex"], "b8fb72a6780b", "001e34bf8fb5"),
    (["defense=deepdefense"], "4bb87ed8709f", "698246e5840c"),
    (["defense=ens_at"], "01ab6f4b82e6", "291df12ed0fe"),
    (["defense=fd"], "b3038b484ee1", "002cb4e5b3ae"),
    (["defense=jpeg"], "7fe10bb56e43", "e3bdd0a2a887"),
    (["defense=natural"], "78e6c3a1415b", "e3bdd0a2a887"),
    (["defense=pgd_at"], "b3038b484ee1", "1ada9a815344"),
    (["defense=randmix"], "23e7e422e44c", "e3bdd0a2a887"),
    (["defense=rp"], "8334cd5c13cd", "e3bdd0a2a887"),
    (["defense=rse"], "662a99b427a6", "130be63d2fc3"),
    (["defense=trades"], "1f28c035540f", "fb7cb05c7957"),
    # Whole numbers where the schema takes a float: typed as floats, keyed as written.
    (["defense=natural", "defense.recipe.lr=1"], "ad5f4e19403d", "b87e020abd88"),
    (["defense=pgd_at", "defense.recipe.eps=1", "defense.recipe.steps=3"], "4bdc6c2c8962", "486f97fd8773"),
    (["defense=rp", "defense.wrapper.rate=1"], "e0d6fa28e1ef", "e3bdd0a2a887"),
    (["defense=trades", "defense.recipe.beta=6"], "e0115b554687", "56510fc0f531"),
    (["defense=adp", "defense.recipe.alpha=2"], "57401aed3ef7", "deb0e9b5e24c"),
    (["defense=rse", "defense.wrapper.ensemble=3", "defense.recipe.init_noise=0"], "fade21c1cc26", "e5d6d9b339cf"),
]


def test_every_defense_option_is_pinned() -> None:
    assert {overrides[0].split("=")[1] for overrides, _, _ in KEYS} == set(group_options("defense"))


@pytest.mark.parametrize(("overrides", "identity_key", "checkpoint"), KEYS, ids=[" ".join(o) for o, _, _ in KEYS])
def test_a_typed_defense_keys_its_cells_and_checkpoints_as_its_yaml_did(overrides: list[str], identity_key: str,
                                                                         checkpoint: str) -> None:
    cfg = compose_config("train", [*overrides, "cache_dir=unused"])
    written = OmegaConf.to_container(cfg.defense, resolve=True)
    target = target_spec(cfg)
    defense = target.defense
    assert json.dumps(defense.identity(), sort_keys=True) == json.dumps(defense_identity(written), sort_keys=True)
    assert json.dumps(defense.recipe_identity(), sort_keys=True) == json.dumps(written.get("recipe"), sort_keys=True)
    assert content_key(defense.identity()) == identity_key
    assert checkpoint_key(target) == checkpoint


def test_the_recipe_is_typed_and_its_key_keeps_the_number_as_written() -> None:
    defense = target_spec(compose_config("train", ["defense=natural", "defense.recipe.lr=1", "cache_dir=unused"])).defense
    assert defense.recipe is not None and defense.recipe.lr == 1.0 and isinstance(defense.recipe.lr, float)
    assert defense.recipe.members == 1 and defense.recipe.lr_milestones == []
    written = defense.recipe_identity()["lr"]
    assert written == 1 and isinstance(written, int)
    assert "momentum" not in defense.recipe_identity(), "a default the option does not write is not keyed"


def test_a_wrapper_is_its_class_and_its_checked_arguments() -> None:
    jpeg = target_spec(compose_config("config", ["defense=jpeg", "cache_dir=unused"])).defense
    assert jpeg.wrapper is not None and (jpeg.wrapper.kind, jpeg.wrapper.transform) == ("jpeg", JPEG)
    assert jpeg.wrapper.arguments == (("quality", 75),) and not jpeg.wrapper.randomized
    assert (jpeg.trained, jpeg.base, jpeg.category) == ("natural", "natural", ("input transformation",))
    assert jpeg.recipe is not None and jpeg.recipe.type == "natural"
    rp = target_spec(compose_config("config", ["defense=rp", "cache_dir=unused"])).defense
    assert rp.wrapper is not None and rp.wrapper.transform is RandomResizePad and rp.wrapper.randomized
    assert rp.wrapper.written() == {"type": "random_resize_pad", "rate": 0.9033, "eot_samples": 10}
    natural = target_spec(compose_config("config", ["cache_dir=unused"])).defense
    assert (natural.wrapper, natural.base, natural.trained) == (None, None, "natural")


@pytest.mark.parametrize(("changes", "expected"), [
    ({"wrapper": {"type": "blur"}}, "defense.wrapper.type is 'blur'; valid: jpeg"),
    ({"wrapper": {"type": "jpeg", "quality": "high"}}, "defense.wrapper.quality must be a whole number, got 'high'"),
    ({"wrapper": "jpeg"}, "defense.wrapper must be a mapping with a type: key, got 'jpeg'"),
    ({"recipe": {"type": "natural", "epochs": 0, "batch_size": 64, "lr": 0.001}}, "recipe needs epochs >= 1"),
    ({"recipe": {"type": "natural", "epochs": 1, "batch_size": 64, "lr": 0.001, "lr_typo": 1}},
     "bad training recipe: Key 'lr_typo' not in 'Recipe'"),
])
def test_a_bad_recipe_or_wrapper_is_refused_where_the_option_is_read(changes: dict, expected: str) -> None:
    option = {"name": "mine", "category": ["input transformation"], "wrapper": None,
              "recipe": {"type": "natural", "epochs": 1, "batch_size": 64, "lr": 0.001}}
    with pytest.raises(AdvbenchError, match=expected):
        defense_spec({**option, **changes})
