"""What verlog changes in TextWorld's game generator, in the process that generates games only.

**1. A faster, exactly equivalent constraint check.** TextWorld builds a quest by chaining
actions backwards from the goal (``textworld.generator.chaining``, a depth-first search). Every
candidate state is checked twice against the game's *constraints*, rules whose only effect is
``fail()``: ``open(c) & closed(c) -> fail()``, or "no room has five doors", ``link(r, d1, r1) &
... & link(r, d5, r5) -> fail()``. A state is rejected when some constraint can be instantiated
in it.

TextWorld answers that question by listing every instantiation of every constraint over the
whole state, sorting the state's facts at each precondition. For a level-30 treasure hunter (20
rooms, 20 distractors, a 20-step quest) this check is over 90 % of the generation time, and the
search can check hundreds of thousands of states. Two facts make it cheap without changing its
answer:

* whether *some* instantiation exists does not depend on the order facts are tried in, and the
  check draws no random numbers;
* the search only checks a state built from a state that already passed the check (or the
  initial state): ``S' = S + pre(a)``, then ``S'`` after ``a``. Constraints are conjunctions of
  facts, so an instantiation true in the new state but not in ``S`` must use one of the facts it
  gained, which are among ``a``'s pre- and postconditions.

:func:`violates_a_constraint` therefore looks only at instantiations anchored on a new fact (or,
without a known-valid parent, at all of them, in the state's own order) and stops at the first.
It answers exactly what TextWorld's ``_Chainer.check_state`` answers for every state, so the
generator makes the same game, byte for byte, from the same seed; the tests compare the two
checks on random states and on whole generated games.

**2. A bound on the walkthrough search.** While a game is made, TextWorld flattens the quest's
dependency tree into a walkthrough (``ActionDependencyTree.flatten``), which can cycle forever
between an action and its reverse (the level-30 treasure hunter of seed 21 yields over 100,000
commands; finished games yield 20-55). Past :data:`MAX_WALKTHROUGH_SEARCH` commands it raises
``QuestGenerationError``, so the game builder rejects the candidate seed as one that admits no
quest; being a count, the bound rejects the same candidates on every machine.

:func:`install` applies both to TextWorld's classes (written against the pinned
``textworld==1.7.0``: it relies on ``_Chainer.apply(node, action)``,
``_Chainer.check_state(state)`` and ``ActionDependencyTree.flatten()``, which the tests
exercise). Only the child process that generates games calls it
(:mod:`verlog.envs.textworld.games`): TextWorld's classes are shared by the whole process.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Iterator, Sequence

#: more commands than this from TextWorld's walkthrough search means it never ends
MAX_WALKTHROUGH_SEARCH = 10_000


@functools.cache
def _fail_fact() -> Any:
    """TextWorld's ``fail()`` fact, what every constraint adds."""
    from textworld.logic import Proposition

    return Proposition("fail", [])


def violates_a_constraint(state: Any, constraints: Iterable[Any], new_facts: Sequence[Any] | None = None) -> bool:
    """Whether some constraint rule (``... -> fail()``) can be instantiated in ``state``.

    ``new_facts``: when given, facts of ``state`` without which it is known to violate no
    constraint, so only instantiations that use one of them are searched. ``None`` searches all.
    """
    fail = _fail_fact()
    for rule in constraints:
        for mapping in _matches(state, rule, new_facts):
            after = state.apply_on_copy(rule.instantiate(mapping))
            if after is not None and after.is_fact(fail):
                return True
    return False


_FREE: dict[Any, list] = {}  # rule -> its placeholders that appear only in its effects


def _matches(state: Any, rule: Any, new_facts: Sequence[Any] | None) -> Iterator[dict]:
    """Assignments that make every precondition of ``rule`` a fact of ``state`` (distinct
    placeholders get distinct variables); with ``new_facts``, only those that map some
    precondition to one of them."""
    free = _FREE.get(rule)
    if free is None:
        free = _FREE[rule] = [ph for ph in rule.placeholders if all(ph not in p.parameters for p in rule.preconditions)]
    if new_facts is None or free:
        yield from _extend(state, rule, list(range(len(rule.preconditions))), {}, set(), free)
        return
    types = state._logic.types
    for i, pred in enumerate(rule.preconditions):
        allowed = _signatures(types, pred)
        rest = [j for j in range(len(rule.preconditions)) if j != i]
        for fact in new_facts:
            if fact.signature not in allowed:
                continue
            mapping: dict = {}
            used: set = set()
            if _bind(pred, fact, mapping, used, []):
                yield from _extend(state, rule, rest, mapping, used, free)


_SIGNATURES: dict[tuple[Any, Any], frozenset] = {}  # (type hierarchy, signature) -> signatures


def _signatures(types: Any, pred: Any) -> frozenset:
    """The fact signatures a precondition matches: its own and its types' subtypes' (cached per
    type hierarchy and signature)."""
    key = (types, pred.signature)  # the hierarchy itself (hashed by identity), kept alive here
    found = _SIGNATURES.get(key)
    if found is None:
        signature_type = type(pred.signature)
        found = _SIGNATURES[key] = frozenset(
            signature_type(pred.signature.name, [t.name for t in subtypes])
            for subtypes in types.multi_subtypes([types.get(t) for t in pred.signature.types])
        )
    return found


def _bind(pred: Any, fact: Any, mapping: dict, used: set, bound: list) -> bool:
    """Extend ``mapping`` so ``pred`` names ``fact``; False when it conflicts (the placeholders
    bound on the way are listed in ``bound`` for the caller to undo)."""
    for ph, var in zip(pred.parameters, fact.arguments):
        current = mapping.get(ph)
        if current is None:
            if var in used:
                return False
            mapping[ph] = var
            used.add(var)
            bound.append(ph)
        elif current != var:
            return False
    return True


def _extend(state: Any, rule: Any, todo: list[int], mapping: dict, used: set, free: list) -> Iterator[dict]:
    if not todo:
        # placeholders that appear only in the effects range over every variable of their type
        yield from state._all_assignments(free, mapping, used, False)
        return
    pred = rule.preconditions[todo[0]]
    for signature in _signatures(state._logic.types, pred):
        for fact in state.facts_with_signature(signature):
            bound: list = []
            if _bind(pred, fact, mapping, used, bound):
                yield from _extend(state, rule, todo[1:], mapping, used, free)
            for ph in bound:
                used.discard(mapping.pop(ph))


def install() -> None:
    """Apply verlog's constraint check and walkthrough bound to TextWorld's classes in this
    process (see the module docstring); calling it again changes nothing."""
    from textworld.generator import chaining
    from textworld.generator import game as tw_game

    textworld_apply = chaining._Chainer.apply

    def apply(self: Any, node: Any, action: Any) -> Any:
        """TextWorld's apply, telling check_state the parent state when it is known to pass: a
        node's state passed when the node was made; the root's (the initial state) is checked
        in full once per chainer."""
        valid_parent = node.action is not None
        if not valid_parent:
            if not hasattr(self, "_verlog_root_valid"):
                self._verlog_root_valid = not violates_a_constraint(node.state, self.constraints)
            valid_parent = self._verlog_root_valid
        self._verlog_check = (node.state, action.preconditions + action.postconditions) if valid_parent else None
        try:
            return textworld_apply(self, node, action)
        finally:
            self._verlog_check = None

    def check_state(self: Any, state: Any) -> bool:
        """TextWorld's constraint check, answered by :func:`violates_a_constraint`."""
        known = getattr(self, "_verlog_check", None)
        if known is None:
            return not violates_a_constraint(state, self.constraints)
        parent, touched = known
        new_facts = [fact for fact in touched if state.is_fact(fact) and not parent.is_fact(fact)]
        return not violates_a_constraint(state, self.constraints, new_facts)

    textworld_flatten = tw_game.ActionDependencyTree.flatten

    def flatten(self: Any) -> Any:
        """TextWorld's walkthrough search, stopped past :data:`MAX_WALKTHROUGH_SEARCH` commands."""
        from textworld.generator import QuestGenerationError

        for count, action in enumerate(textworld_flatten(self), 1):
            if count > MAX_WALKTHROUGH_SEARCH:
                raise QuestGenerationError(
                    f"TextWorld's walkthrough search did not end ({MAX_WALKTHROUGH_SEARCH:,} commands)"
                )
            yield action

    _replace(chaining._Chainer, "apply", apply)
    _replace(chaining._Chainer, "check_state", check_state)
    _replace(tw_game.ActionDependencyTree, "flatten", flatten)


def _replace(cls: type, name: str, method: Callable) -> None:
    """Set ``cls.name`` to ``method`` unless verlog's version is already there."""
    if not getattr(getattr(cls, name), "_verlog", False):
        method._verlog = True  # type: ignore[attr-defined]
        setattr(cls, name, method)
