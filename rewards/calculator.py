"""Reward functions of the calculator agent (``graphs/calculator.py``), used by training only.

The graph stays production code: these read its final answer (the last AI message) and the
dataset row's ``answer`` column. ``math-verify`` (a maintained verifier of mathematical answers)
extracts the last number or expression of the answer and compares it with the reference. Its own
time limits use ``signal.alarm``, which only works in the main thread: verlog runs sync reward
functions in worker threads (and bounds them with the entry's ``timeout_s``), so they are off here.
"""

from __future__ import annotations

import logging

from math_verify import parse, verify

# math-verify warns on every call made without its signal-based timeouts: said once above
logging.getLogger("math_verify").setLevel(logging.ERROR)


def correct(completion: str, answer: str) -> bool:
    """Whether the final answer's last number equals the row's ``answer`` (reward 1 and success,
    else 0)."""
    if not completion.strip():
        return False
    gold = parse(answer, parsing_timeout=None)
    return bool(verify(gold, parse(completion, parsing_timeout=None), timeout_seconds=None))


def answered(completion: str, messages: list) -> float:
    """1 when the episode ends with a plain answer (not a pending tool call), else 0: a small
    shaping term for ``max_tool_rounds`` runs that never answer."""
    last = messages[-1] if messages else None
    return float(getattr(last, "type", None) == "ai" and not getattr(last, "tool_calls", None) and bool(completion.strip()))
