"""The builtin agent: a model decides, fleet's own loop runs the tools for real.

``_loop`` is the backend (:class:`BuiltinBackend`); ``_model`` is what every model offers it (a
conversation in, one step out); the models are ``_scripted`` (a file of model turns:
deterministic, for tests and the demo) and ``_openai`` (any OpenAI-compatible endpoint). The
loop imports a model's module only when the loadout names that model.

Layering: imports ``child.tools``, ``ipc``, the rest of ``child.backends`` (the interface, the
host tools, line splitting) and itself. Nothing else in ``child.backends`` imports it; the
runtime does, for a ``builtin`` loadout.
"""

from child.backends.builtin._loop import BuiltinBackend

__all__ = ["BuiltinBackend"]
