"""Token masks that hold a response to a :class:`~verlog.backends.base.Constraint` (llguidance).

An in-process engine asks, before choosing each token of a constrained request, which tokens
keep the response inside the grammar, sets the others' logits to ``-inf``, and tells the matcher
the token it chose. Once the grammar is complete only end-of-sequence tokens are allowed.

llguidance was chosen over xgrammar (both pip-install here next to the pinned CPU torch): it has
no dependencies (xgrammar pulls in triton, useless on a CPU), needs no per-schema compilation
(xgrammar: 0.2 s per JSON schema on SmolLM2's 49k vocabulary), and computes a mask in about the
same time (mean 15 us on the tiny model's 1.5k vocabulary, 43 us on SmolLM2's, measured over
random walks through a tool-call schema). It reads JSON schemas, regular expressions and Lark
grammars, and Lark may embed JSON schemas (``%json {...}``): what a Hermes tool call needs.
A tokenizer that writes a space between its tokens (WordPiece's decoder, or none: verlog's
word-level models), which llguidance cannot read, is given to it as a table of each token's
bytes (:class:`_WordTable`); such a model takes regex constraints. In the engine a constrained
token costs about 0.13 ms more on SmolLM2's vocabulary (mask 0.08, applying it to the logits
0.04, advancing the matcher 0.005; one CPU thread), against about 10 ms for a decode step of 8
rows on a 2-core machine.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from verlog.backends.base import Constraint, EngineError, InvalidConstraintError

__all__ = ["JSON_STYLE", "ConstraintMatcher", "GrammarCompiler", "fill_masks"]

#: how constrained JSON is laid out unless a schema says otherwise (its ``x-guidance`` key): as
#: ``json.dumps`` writes it, ``{"a": 1, "b": [2, 3]}``, with no other whitespace. A grammar that let
#: whitespace run freely would let a weak model fill its token budget with blanks.
JSON_STYLE: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError as exc:  # a dependency of verlog: only a broken install lacks it
        raise EngineError(
            "constrained decoding needs the llguidance package (a verlog dependency): pip install llguidance"
        ) from exc
    return llguidance


class GrammarCompiler:
    """Makes a :class:`ConstraintMatcher` for each constrained request of one tokenizer.

    Args:
        tokenizer: the model's (fast) Hugging Face tokenizer.
        vocab_size: the width of the model's logits (may exceed the tokenizer's vocabulary:
            the extra ids are never allowed).
        eos_token_ids: the ids that may end a response once its grammar is complete.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._grammars: dict[Constraint, str] = {}
        #: the tokenizer's decoder writes a space between tokens (see :class:`_WordTable`)
        self.words_joined = _joins_words(tokenizer)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its settings (a learner sent to the update process): its caches are rebuilt there."""
        return (type(self), (self.tokenizer, self.vocab_size, self.eos_token_ids))

    @property
    def token_count(self) -> int:
        """The ids llguidance knows (the tokenizer's whole vocabulary)."""
        return len(self.tokenizer)

    def _tokenizer(self) -> Any:
        """llguidance's view of the tokenizer (built once: about a second for a large vocabulary)."""
        with self._lock:
            if self._ll_tokenizer is None:
                ll = _llguidance()
                if len(self.tokenizer) > self.vocab_size:
                    raise EngineError(
                        f"the tokenizer has {len(self.tokenizer)} ids but the model's logits only "
                        f"{self.vocab_size}: they do not belong together"
                    )
                eos = list(self.eos_token_ids) or None
                if self.words_joined:
                    table = ll.TokenizerWrapper(_WordTable(self.tokenizer))
                    self._ll_tokenizer = ll.LLTokenizer(table, n_vocab=len(self.tokenizer), eos_token=eos)
                else:
                    self._ll_tokenizer = ll.hf.from_tokenizer(
                        self.tokenizer, n_vocab=len(self.tokenizer), eos_token=eos
                    )
            return self._ll_tokenizer

    def _grammar(self, constraint: Constraint) -> str:
        """llguidance's grammar for ``constraint`` (kept: graphs repeat the same few)."""
        grammar = self._grammars.get(constraint)
        if grammar is None and self.words_joined and constraint.kind != "regex":
            raise InvalidConstraintError(
                f"a {constraint.kind} constraint cannot hold this tokenizer's answers: its decoder writes a space "
                "between tokens (a word-level model), which would break the text a grammar describes; "
                "allowed for such a model: regex"
            )
        if grammar is None:
            ll = _llguidance()
            try:
                if constraint.kind == "json_schema":
                    grammar = ll.LLMatcher.grammar_from_json_schema(constraint.grammar, defaults=dict(JSON_STYLE))
                elif constraint.kind == "regex" and self.words_joined:  # the text, then the table's last space
                    grammar = ll.LLMatcher.grammar_from_regex(f"(?:{constraint.grammar}) ")
                elif constraint.kind == "regex":
                    grammar = ll.LLMatcher.grammar_from_regex(constraint.grammar)
                else:
                    grammar = ll.LLMatcher.grammar_from_lark(constraint.grammar)
            except Exception as exc:  # llguidance's parse errors (ValueError, RuntimeError)
                raise InvalidConstraintError(f"invalid {constraint.kind} constraint: {exc}") from None
            ok, problem = self._validate(grammar)
            if not ok:
                raise InvalidConstraintError(f"invalid {constraint.kind} constraint: {problem}")
            if len(self._grammars) > 256:
                self._grammars.clear()
            self._grammars[constraint] = grammar
        return grammar

    def _validate(self, grammar: str) -> tuple[bool, str]:
        ll = _llguidance()
        is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer())
        return (not is_error), "; ".join(messages)

    def matcher(self, constraint: Constraint) -> "ConstraintMatcher":
        """A fresh matcher for one response under ``constraint`` (raises
        :class:`~verlog.backends.base.InvalidConstraintError` if the grammar is invalid)."""
        ll = _llguidance()
        inner = ll.LLMatcher(self._tokenizer(), self._grammar(constraint), log_level=0)
        if inner.is_error():
            raise InvalidConstraintError(f"invalid {constraint.kind} constraint: {inner.get_error()}")
        return ConstraintMatcher(inner, self.token_count, constraint)


def _joins_words(tokenizer: Any) -> bool:
    """Whether a fast tokenizer writes its tokens with a space between them, which llguidance
    cannot read: WordPiece's decoder, or no decoder at all (the backend then joins the tokens
    with spaces). verlog's word-level models are such tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = backend.decoder
    return decoder is None or type(decoder).__name__ == "WordPiece"


class _WordTable:
    """A tokenizer that writes a space between its tokens (:func:`_joins_words`) as llguidance's
    ``TokenizerWrapper`` reads one: each token's bytes, a response being their concatenation.

    Such a tokenizer writes a space *between* tokens, so each token is given its text followed by a
    space: the table's text of a response is the decoded text plus one space, and a regex
    constraint is compiled followed by one space (:meth:`GrammarCompiler._grammar`). A token is
    then allowed only where a word may end: ``do`` is not a way into ``down``. Pieces the decoder
    glues on (``##``) would break this; such a vocabulary (BERT's) is refused."""

    def __init__(self, tokenizer: Any):
        decoder = tokenizer.backend_tokenizer.decoder
        prefix = str(getattr(decoder, "prefix", "##")) if decoder is not None else ""
        special = set(tokenizer.all_special_ids)
        pieces = [str(p) for p in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
        glued = [p for i, p in enumerate(pieces) if i not in special and prefix and p.startswith(prefix)]
        if glued:
            raise EngineError(
                f"constrained decoding cannot read this tokenizer: its WordPiece vocabulary has pieces glued "
                f"on with {prefix!r} ({glued[0]!r}, ...), which llguidance has no way to spell"
            )
        self._tokenizer = tokenizer
        self.tokens = [p.encode("utf-8") if i in special else p.encode("utf-8") + b" " for i, p in enumerate(pieces)]
        self.special_token_ids = sorted(special)
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = None

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=False)["input_ids"]


class ConstraintMatcher:
    """Where one response stands in its grammar: the tokens allowed next, and the token taken."""

    def __init__(self, inner: Any, token_count: int, constraint: Constraint):
        self._inner = inner
        self._token_count = token_count
        self.constraint = constraint
        self._bitmask = torch.zeros((1, (token_count + 31) // 32), dtype=torch.int32)

    def allowed(self, width: int) -> torch.Tensor:
        """A boolean row of ``width`` (the logits' width): which tokens may come next."""
        import llguidance.torch as lt

        lt.fill_next_token_bitmask(self._inner, self._bitmask, 0)
        if self._inner.is_error():
            raise EngineError(f"the {self.constraint.kind} constraint failed: {self._inner.get_error()}")
        # bit j of 32-bit word i is token 32 i + j: little-endian bytes, bits unpacked lowest first
        # (numpy, single-threaded: a torch op over the vocabulary would wake its thread pool)
        bits = np.unpackbits(self._bitmask.numpy().view(np.uint8), bitorder="little")
        row = np.zeros(width, dtype=bool)
        n = min(width, self._token_count)
        row[:n] = bits[:n]
        if not row.any():
            raise EngineError(f"the {self.constraint.kind} constraint allows no token at this point")
        return torch.from_numpy(row)

    def accept(self, token: int) -> None:
        """Advance past the chosen ``token`` (one the last :meth:`allowed` permitted)."""
        if not self._inner.consume_token(token):
            raise EngineError(f"token {token} breaks the {self.constraint.kind} constraint: {self._inner.get_error()}")

    @property
    def complete(self) -> bool:
        """Whether the grammar can take nothing more (only an end-of-sequence token may follow)."""
        return bool(self._inner.is_stopped())


_EXECUTOR: Any = None


def fill_masks(matchers: list[ConstraintMatcher]) -> tuple[torch.Tensor, list[EngineError | None]]:
    """The tokens each matcher allows next, packed as llguidance writes them (``[n, words]``
    int32 on the host: bit ``j`` of word ``i`` is token ``32 i + j``), filled in parallel by
    llguidance's executor; and each matcher's error (its grammar failed, or allows nothing).
    One engine step's masks for all its constrained rows."""
    global _EXECUTOR
    ll = _llguidance()
    bitmask = torch.zeros((len(matchers), matchers[0]._bitmask.shape[1]), dtype=torch.int32)
    if len(matchers) == 1:
        ll.torch.fill_next_token_bitmask(matchers[0]._inner, bitmask, 0)
    else:
        if _EXECUTOR is None:
            _EXECUTOR = ll.LLExecutor()
        ll.torch.fill_next_token_bitmask_par(_EXECUTOR, [(m._inner, i) for i, m in enumerate(matchers)], bitmask)
    any_allowed = bitmask.numpy().any(axis=1)
    errors: list[EngineError | None] = []
    for m, allowed in zip(matchers, any_allowed.tolist()):
        if m._inner.is_error():
            errors.append(EngineError(f"the {m.constraint.kind} constraint failed: {m._inner.get_error()}"))
        elif not allowed:
            errors.append(EngineError(f"the {m.constraint.kind} constraint allows no token at this point"))
        else:
            errors.append(None)
    return bitmask, errors
