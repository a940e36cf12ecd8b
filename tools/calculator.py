"""A safe arithmetic calculator tool (no ``eval``: a tiny AST interpreter)."""

from __future__ import annotations

import ast
import math
import operator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64
_MAX_LENGTH = 200


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: the expression to evaluate, e.g. "(3 + 4) * 12".
    """
    if len(expression) > _MAX_LENGTH:
        return f"Error: expression longer than {_MAX_LENGTH} characters"
    try:
        value = _eval(ast.parse(expression.strip(), mode="eval"))
    except ZeroDivisionError:
        return "Error: division by zero"
    except (SyntaxError, ValueError, TypeError, OverflowError) as exc:
        return f"Error: {exc}"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return str(value)
