"""What the Python API costs beyond the attack: `import advbench; advbench.evaluate` against
`import torch`, and one `evaluate` call against a plain torchattacks PGD loop on the same model.

Both sides attack the same digits CNN (trained by the script) with PGD (ℓ∞, ε = 0.1, 10 steps of ε/4, one random
start) on the same samples; advbench runs without its minimum-ε search (`search.enabled=false`)
so both do the same gradient work, and its fixed cost (config, keys, records) is the
difference. Rounds are interleaved so that load on the machine hits both sides alike; prints
medians and each size's ratio.

    python scripts/bench_api.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

IMPORTS = {
    "import torch": "import torch",
    "import advbench; advbench.evaluate": "import advbench; advbench.evaluate",
}
EPS, STEPS = 0.1, 10


def import_seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def digits_model():
    """A small CNN trained here on scikit-learn's digits (plain torch, seconds), and the digits:
    nothing of advbench's internals, so the script times any version of its API alike."""
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(digits.target)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(5):
        for batch in torch.randperm(len(y)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval().requires_grad_(False), x, y


def advbench_seconds(model, x, y) -> float:
    import advbench

    start = time.perf_counter()
    advbench.evaluate(model, (x, y), attack="pgd", attack_params={"steps": STEPS, "rel_stepsize": 0.25}, eps=EPS,
                      overrides=["search.enabled=false"])
    return time.perf_counter() - start


def torchattacks_seconds(model, x, y) -> float:
    import torchattacks

    attack = torchattacks.PGD(model, eps=EPS, alpha=EPS / 4, steps=STEPS, random_start=True)
    start = time.perf_counter()
    adversarial = attack(x, y)
    (model(adversarial).argmax(1) == y).float().mean().item()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at least 5 for a median)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512], help="samples per call")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    imports: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(args.rounds):
        for name, code in IMPORTS.items():
            imports[name].append(import_seconds(code))
    for name, seconds in imports.items():
        print(f"{name:40s} {statistics.median(seconds):6.2f} s")
    ratio = statistics.median(imports["import advbench; advbench.evaluate"]) / statistics.median(imports["import torch"])
    print(f"{'ratio':40s} {ratio:6.2f}x")

    import torch

    torch.set_num_threads(1)
    model, x, y = digits_model()
    advbench_seconds(model, x[:8], y[:8])  # the first call imports what evaluate needs
    for size in args.sizes:
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(advbench_seconds(model, x[:size], y[:size]))
            theirs.append(torchattacks_seconds(model, x[:size], y[:size]))
        a, t = statistics.median(ours), statistics.median(theirs)
        print(f"{size:4d} samples: advbench.evaluate {a:6.3f} s, torchattacks PGD {t:6.3f} s, ratio {a / t:5.2f}x, "
              f"fixed cost {a - t:+.3f} s")


if __name__ == "__main__":
    main()
