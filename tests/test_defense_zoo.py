"""The defense zoo as presets: the seed presets list the seed's 16 defense rows with its
architectures, `advbench list defense` shows every seed defense, and the digits preset
`experiment=defenses` composes every cell against every defense with the intended knowledge."""

from __future__ import annotations

from functools import lru_cache

from click.testing import CliRunner
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.core.catalog import conf_dir, group_options
from advbench.robustness.defenses.recipes import Recipe

# The seed's Table 1 rows with Table 4's architectures (advbench's stand-ins where it ships no
# such net: ResNet-56 for DeepDefense's 5-layer CNN, Gowal's IBP CNN for Convex's ResNet).
SEED_DEFENSES = {
    "cifar10": {"natural": "resnet56", "pgd_at": "wrn34_10", "deepdefense": "resnet56", "trades": "wrn34_10",
                "convex": "ibp_large", "jpeg": "resnet56", "rse": "vgg16", "adp": "resnet110"},
    "imagenet": {"natural": "inception_v3", "ens_at": "inception_v3", "alp": "resnet50", "fd": "resnet152",
                 "jpeg": "inception_v3", "bit_red": "inception_v3", "rp": "inception_v3", "randmix": "inception_v3"},
}


def _sweep(preset: str) -> dict[str, list[str]]:
    params = OmegaConf.load(conf_dir() / "experiment" / f"{preset}.yaml").hydra.sweeper.params
    return {k: [v.strip() for v in str(value).split(",")] for k, value in params.items()}


@lru_cache(maxsize=None)
def _row(name: str):
    """A seed preset composed with one of its defense rows (composed once per module)."""
    return compose_config("config", [f"experiment=seed_{name.split('_')[0]}", f"+experiment/seed_defense={name}"])


def test_seed_presets_list_the_seeds_16_defenses_with_its_architectures() -> None:
    rows = 0
    for dataset, expected in SEED_DEFENSES.items():
        found = {}
        for row in _sweep(f"seed_{dataset}")["+experiment/seed_defense"]:
            cfg = _row(row)
            assert cfg.dataset.name == dataset and cfg.defense.name in group_options("defense"), row
            Recipe.from_config(cfg.defense.recipe)
            found[cfg.defense.name] = cfg.model.name
            rows += 1
        assert found == expected
    assert rows == 16


def test_seed_rows_carry_the_seeds_settings_where_digits_differs() -> None:
    assert _row("cifar10_pgd_at").defense.recipe.eps == _row("cifar10_trades").defense.recipe.eps == 8 / 255
    assert _row("imagenet_alp").defense.recipe.eps == _row("imagenet_fd").defense.recipe.eps == 16 / 255
    assert _row("imagenet_bit_red").defense.wrapper.bits == 4 and _row("cifar10_rse").defense.wrapper.ensemble == 50
    natural = _row("cifar10_natural").defense.recipe
    assert _row("cifar10_jpeg").defense.recipe == natural, "JPEG reuses the natural ResNet-56's checkpoint"
    assert natural != compose_config("config", ["defense=natural"]).defense.recipe


def test_advbench_list_defense_shows_every_seed_defense_with_its_metadata() -> None:
    out = CliRunner().invoke(main, ["list", "defense"], env={"COLUMNS": "400"}).output
    seed = set(SEED_DEFENSES["cifar10"]) | set(SEED_DEFENSES["imagenet"])
    assert len(seed) == 14 and seed <= set(group_options("defense"))
    lines = {line.split("│")[2].strip(): line for line in out.splitlines() if line.count("│") >= 4}
    for name in seed:
        assert "intended threat" in lines[name], name


def test_the_digits_defenses_preset_covers_every_defense_and_knowledge() -> None:
    sweep = _sweep("defenses")
    assert sorted(sweep["defense"]) == group_options("defense")
    knowledge = set()
    for row in sweep["+experiment/defenses_row"]:
        cfg = compose_config("config", ["experiment=defenses", f"+experiment/defenses_row={row}", "defense=rse"])
        assert cfg.dataset.name == "digits" and cfg.threat.goal == "untargeted"
        knowledge.add((cfg.threat.knowledge, cfg.attack.name))
    assert knowledge == {("white", "bim"), ("white", "pgd"), ("score", "square"), ("decision", "hsj")}


def test_a_one_panel_figure_of_the_whole_zoo_keeps_its_legend_inside() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from test_plot import records

    from advbench.robustness.report.curves import budget_curve
    from advbench.robustness.report.plot import budget_figure

    names = group_options("defense")
    categories = {d: ("input transformation, randomization" if i % 3 else "robust training") for i, d in enumerate(names)}
    fig = budget_figure(budget_curve(records(defenses=names, attacks=["square"], goals=("untargeted",))),
                        categories=categories)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    shown = [text for text in legend.get_texts() if text.get_text()]  # columns are padded with blank entries
    assert len(shown) == len(names) + 2 + 1, "defenses, two headings and the budget line"
    assert box.y0 >= 0 and box.x1 <= fig.bbox.x1 + 1, (box, fig.bbox)


def test_six_defenses_of_one_category_are_told_apart_by_colour() -> None:
    """Robust training has six defenses: each gets its own colour, and neighbours in the legend
    also differ in line style, so no two lines of a category look alike."""
    from advbench.robustness.report.plot import defense_styles

    names = [f"d{i}" for i in range(6)]
    styles = list(defense_styles(names, {d: "robust training" for d in names}).values())
    assert len({str(s["color"]) for s in styles}) == 6
    assert all(a["linestyle"] != b["linestyle"] for a, b in zip(styles, styles[1:]))
