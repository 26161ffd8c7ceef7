"""Spend: what a fleet's children may spend on models, what they spent, and which model pays.

Owns usage limits, prices and how a spawn may lower a limit (``_limits``), the usage ledger
(``_ledger``: per child, per tree, per definition, per session; never negative), the
supervisor's budgets and caps — every usage report into the ledger, what a reached limit does,
which spawn or turn a cap refuses (``_budgets``) —,
the quota-error classifier (``_quota``), model roles and their candidates (``_roles``, chosen
per spawn in ``_modelroles``) and the move to a fallback model (``_fallback``).

Imports: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_yamlfile``),
``ipc`` (the usage a child reports) and ``orchestrator.notify`` (the ``budget`` event) only —
nothing of the core, the launchers or the CLI; the core passes its notes in through a protocol.
"""
