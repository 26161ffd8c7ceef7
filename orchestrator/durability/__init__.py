"""Durability: the session journal a later supervisor reads to know what this one knew.

The journal (:mod:`orchestrator.durability._journal`) is an append-only JSONL file per session
(``journal.jsonl``, 0600) of versioned records — spawns, backend resume ids, state changes,
questions and answers, settled reports, handoffs — written in batches and fsynced on every
state change. Reading folds the records into each child's facts (:func:`fold`), which is how a
new supervisor finds the children its predecessor left *lost*, and what rotation keeps when the
file passes its size cap. Each ``fleet map`` keeps its own ledger beside it
(:mod:`orchestrator.durability._mapbook`, ``maps/<id>.jsonl``): the rows and each row's one
final outcome, which is what ``fleet map --resume`` reads.

Import rule: the foundation (``orchestrator._errors``, ``_config``, ``_records``), ``ipc``
(its private-file helpers), the standard library, trio, attrs and orjson; never ``core``, which
receives the journal as a small protocol (``core._host.Journal``) from ``control``.
"""

from orchestrator.durability._format import (
    JOURNAL_VERSION,
    ChildFacts,
    JournalRecord,
    ReadResult,
    fold,
    last_supervisor,
    parse_journal,
)
from orchestrator.durability._journal import Journal, keep_journal
from orchestrator.durability._mapbook import MapBook, MapState

__all__ = [
    "JOURNAL_VERSION",
    "ChildFacts",
    "Journal",
    "JournalRecord",
    "MapBook",
    "MapState",
    "ReadResult",
    "fold",
    "keep_journal",
    "last_supervisor",
    "parse_journal",
]
