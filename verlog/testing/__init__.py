"""Test doubles for verlog's own tests, benchmarks and users' tests of their graphs: nothing in
the training, evaluation or serving path imports this package."""

from verlog.testing.scripted_engine import ScriptedEngine

__all__ = ["ScriptedEngine"]
