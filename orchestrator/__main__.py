"""``python -m orchestrator`` is the ``fleet`` command."""

from orchestrator._cli import main

main()
