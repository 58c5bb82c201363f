"""`python -m vigil`: the `vigil` command."""

from vigil.cli import main

main()
