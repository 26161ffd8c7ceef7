"""Turning an argv into a sandboxed argv for a policy, and probing the launchers.

Layering: ``sandbox`` uses the standard library (plus attrs) only and imports nothing of ours.
"""
