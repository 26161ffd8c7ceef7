"""Agent definitions: what an agent is (its tools, mode, backend, limits, system prompt) and where
a fleet finds them.

:mod:`._format` is one definition: the :class:`AgentDefinition` record and its parser (a
Markdown file with YAML front matter; a Claude Code or Pi file read leniently). :mod:`._load`
finds them: the bundled ones (the top-level ``agents`` package, data only), the ``--agent-dirs``
of Claude Code and Pi, the user's and the project's directories, by scope (``docs/agents.md``).
The core plans each spawn from a definition; nothing here knows of a run.

Imports: the foundation (``orchestrator._errors``, ``_schemafile``), ``orchestrator.governance``
(a result schema's check) and ``orchestrator.spend`` (a definition's limits), the standard
library, attrs and PyYAML; never ``core``, ``control`` or ``cli``.
"""

from orchestrator.definitions._format import EFFORTS, MUTATING_TOOLS
from orchestrator.definitions._load import (
    SCOPES,
    AgentDefinition,
    AgentDefinitionError,
    expand_agent_dirs,
    load_agents,
    parse_agent,
)

__all__ = [
    "EFFORTS",
    "MUTATING_TOOLS",
    "SCOPES",
    "AgentDefinition",
    "AgentDefinitionError",
    "expand_agent_dirs",
    "load_agents",
    "parse_agent",
]
