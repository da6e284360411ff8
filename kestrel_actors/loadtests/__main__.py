"""``python -m kestrel_actors.loadtests <scenario> [options]``: see ``kestrel_actors.loadtests.cli``."""

from .cli import main

main(prog_name="python -m kestrel_actors.loadtests")
