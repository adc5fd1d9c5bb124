"""Recipe `convex`: certified training with interval bound propagation (Gowal et al. 2018).

The loss and its ε/κ schedule live with the bounds they train in `defenses.certify`
(`ibp_loss`, which also checks the recipe's kappa and ramp settings at the first step).
"""

from __future__ import annotations

from advbench.robustness.defenses.certify import ibp_loss
from advbench.robustness.defenses.recipes.base import RecipeSpec, register

SPEC = register(RecipeSpec("convex", ibp_loss))
