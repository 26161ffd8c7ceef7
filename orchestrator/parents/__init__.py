"""Parents: fleet installed into the agents that drive it (Pi's extension, the MCP installers).

Imports: the foundation (``orchestrator._errors``) and the standard library only.
"""
