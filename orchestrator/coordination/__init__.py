"""Coordination: how children and the parent decide together without flooding context.

Owns the bounded discussion paper (``_paper``, ``_paper_file``), strict-majority democracy
rounds (``_democracy`` runs them through the ``Electorate`` the supervisor provides; the pure
rules are ``_ballots``, the result ``_outcome``) and the moderator brief (``_brief``).

Imports: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_sync``) only.
"""
