"""Reward functions of the calculator agent (``graphs/calculator.py``), used by training only.

The graph stays production code: these read its final answer (the last AI message) and the
dataset row's ``answer`` column. ``math-verify`` (a maintained verifier of mathematical answers)
extracts the last number or expression of the answer and compares it with the reference.

**The answer must state a number.** math-verify also extracts and evaluates expressions, so an
answer that only restates the question ("To calculate 91 * 38 you can...") would be scored
correct: a policy trained on that reward learned within ten updates to restate every question and
stop (it "answered" 82 % of the test questions without a single result). An extracted answer that
is not a number literal therefore scores 0.

math-verify's own time limits use ``signal.alarm``, which only works in the main thread: verlog runs
sync reward functions in worker threads (bounded by the entry's ``timeout_s``), so they are off here.
"""

from __future__ import annotations

import logging

from math_verify import parse, verify

# math-verify warns on every call made without its signal-based timeouts: said once above
logging.getLogger("math_verify").setLevel(logging.ERROR)


def stated_number(completion: str) -> list:
    """math-verify's reading of the answer's last number (``[value, text]``), or ``[]`` when the
    answer ends on no number: nothing, or an expression it leaves for the reader to work out."""
    found = parse(completion, parsing_timeout=None) if completion.strip() else []
    return found if found and getattr(found[0], "is_Number", False) else []


def correct(completion: str, answer: str) -> bool:
    """Whether the final answer states the row's ``answer`` as its last number (reward 1 and
    success, else 0)."""
    found = stated_number(completion)
    return bool(found) and bool(verify(parse(answer, parsing_timeout=None), found, timeout_seconds=None))


def answered(completion: str, messages: list) -> float:
    """1 when the episode ends with a plain answer (not a pending tool call), else 0: a small
    shaping term for ``max_tool_rounds`` runs that never answer."""
    last = messages[-1] if messages else None
    return float(
        getattr(last, "type", None) == "ai" and not getattr(last, "tool_calls", None) and bool(completion.strip())
    )
