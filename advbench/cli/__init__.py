"""The command line: click groups, Hydra forwarding, one-line errors; the only layer that sees both halves."""
