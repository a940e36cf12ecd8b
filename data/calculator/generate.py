"""How ``train.jsonl``, ``validation.jsonl`` and ``test.jsonl`` were made (run once, committed).

Arithmetic questions of four shapes, easy to hard for a small model without a calculator:
``a + b``, ``a - b``, ``a * b`` with two-digit numbers, and ``(a op b) * c``. Each row is
``{"prompt": question, "answer": exact result as text, "kind": shape}``. The three splits hold
distinct questions (no test question is a training question); the test split is fixed: change
this script and the splits together, never the test file alone.

    python data/calculator/generate.py     # rewrites the three files (same content: seeded)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"train": 1000, "validation": 64, "test": 200}
SEED = 20261126


def question(rng: random.Random) -> tuple[str, int, str]:
    """One question: its text, exact answer and shape."""
    kind = rng.choice(["add", "subtract", "multiply", "compound"])
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if kind == "add":
        return f"What is {a} + {b}?", a + b, kind
    if kind == "subtract":
        return f"What is {a} - {b}?", a - b, kind
    if kind == "multiply":
        return f"What is {a} * {b}?", a * b, kind
    c, op = rng.randint(2, 9), rng.choice(["+", "-"])
    value = (a + b if op == "+" else a - b) * c
    return f"What is ({a} {op} {b}) * {c}?", value, kind


def main() -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    for split, size in SIZES.items():
        rows = []
        while len(rows) < size:
            text, answer, kind = question(rng)
            if text in seen:
                continue
            seen.add(text)
            rows.append({"prompt": text, "answer": str(answer), "kind": kind})
        (HERE / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{split}: {len(rows)} rows")


if __name__ == "__main__":
    main()
