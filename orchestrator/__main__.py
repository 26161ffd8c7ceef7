"""``python -m orchestrator`` is the ``fleet`` command."""

from orchestrator.cli._fast import main

main()
