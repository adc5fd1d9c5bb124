"""`python -m advbench` is the same as the `advbench` command."""

from advbench.cli.main import main

main()
