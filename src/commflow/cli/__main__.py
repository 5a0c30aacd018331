"""``python -m commflow.cli``: the same as the ``commflow`` command."""

from commflow.cli import main

main()
