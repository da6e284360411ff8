"""``python -m loadtests <scenario> [options]``: see ``loadtests.cli``."""

from .cli import main

main(prog_name="python -m loadtests")
