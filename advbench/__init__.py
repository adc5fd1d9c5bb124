"""advbench: adversarial-robustness benchmark and NR quality-metric stability tool."""

__version__ = "0.1.0"
