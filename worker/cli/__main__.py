"""``python -m worker.cli``: the same as the ``memworker`` command."""

from worker.cli.app import main

main()
