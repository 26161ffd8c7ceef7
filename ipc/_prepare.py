"""Every codec function generated up front, for a fork server's children to inherit.

The converter (:mod:`ipc._messages`) generates a class's (un)structure function on first use.
This module sits above the two modules whose classes it prepares, the envelope codec and the
loadout (which reads its file with that codec), so neither has to import the other back.
"""

from ipc._loadout import Loadout
from ipc._messages import _RawEnvelope, converter
from ipc._types import MESSAGE_TYPES


def prepare_codecs() -> None:
    """Build every (un)structure function the converters generate lazily, now.

    A fork server calls this once so that its children inherit the generated code instead of
    compiling it again each (~3 ms a child). Twice: generating one class's hooks may register
    another's and clear the converters' dispatch caches; the second pass finds them all.
    """
    for _ in range(2):
        for cls in [*MESSAGE_TYPES.values(), Loadout, _RawEnvelope]:
            converter.get_structure_hook(cls)
            converter.get_unstructure_hook(cls)
