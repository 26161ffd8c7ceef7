"""``python -m orchestrator`` is the ``fleet`` command."""

from orchestrator.cli._main import main

main()
