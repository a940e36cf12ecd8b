"""The model version a server has in service, and putting a new one in without dropping requests.

:class:`PolicyVersions` holds the version in service (:class:`ServedPolicy`: its engine, its id,
the requests generating on it); :meth:`PolicyVersions.swap` sends new requests to a new engine at
once while those in flight finish on the old one, which is closed after them;
:meth:`PolicyVersions.reload` is ``POST /v1/admin/reload``'s work: the reloader's newest
checkpoint, checked by a canary (:func:`canary`: a model that cannot answer is not served), then
swapped in.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Awaitable, Callable

from verlog.backends.base import Engine, SamplingParams
from verlog.serve.openai_protocol import APIError

__all__ = [
    "PolicyVersions",
    "Reloaded",
    "ServedPolicy",
    "UnservableModelError",
    "canary",
    "close_engine",
    "same_tokenizer",
]

log = logging.getLogger(__name__)

#: what a server's reloader returns: the new engine (``None`` when the newest version is the one
#: in service), its tokenizer, its version id
Reloaded = tuple["Engine | None", Any, str]


class UnservableModelError(ValueError):
    """A model version fails its canary (:func:`canary`): it is not served."""


class ServedPolicy:
    """A model version in service: its engine, its id, and the requests generating on it (a
    version swapped out is closed once they have finished)."""

    def __init__(self, engine: Engine, version: str):
        self.engine, self.version = engine, version
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


#: under uniform logits over V >= 2 tokens every chosen token's logprob is -log(V) <= -log(2): the
#: canary's tokens all at one such logprob are a model that cannot choose (a sure model's are ~0)
UNIFORM_MIN_NATS = math.log(2) - 1e-9


async def canary(engine: Engine, prompt_ids: list[int], version: str, timeout_s: float | None) -> None:
    """A greedy and a sampled 4-token answer to ``prompt_ids``, each logprob finite, from logits
    that are not constant. Raises :class:`UnservableModelError` naming ``version`` and what went
    wrong (weights with NaN or inf, a model that cannot sample, one whose every token is equally
    likely: a tensor overwritten with a huge value reads as a uniform model, not as NaN)."""
    chosen: list[float] = []
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature, max_new_tokens=4, seed=0)
        try:
            generation = await asyncio.wait_for(engine.generate(prompt_ids, sampling), timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise UnservableModelError(
                f"model version {version!r} cannot answer a canary request: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            ) from None
        bad = [lp for lp in generation.logprobs if not math.isfinite(lp) or lp > 1e-6]
        if bad or any(i < 0 for i in generation.token_ids):
            raise UnservableModelError(
                f"model version {version!r} answers a canary request with invalid "
                f"logprobs ({bad[:3]}): its weights are not fit to serve (NaN or inf?)"
            )
        chosen += generation.logprobs
    # uniform logits: every token, greedy or sampled, has the same logprob -log(vocabulary)
    if len(chosen) > 1 and max(chosen) < -UNIFORM_MIN_NATS and max(chosen) - min(chosen) < 1e-6 * abs(min(chosen)):
        raise UnservableModelError(
            f"model version {version!r} answers a canary request from constant logits (every token equally likely: "
            f"logprob {chosen[0]:.4f} for each): its weights are not fit to serve (a tensor overwritten?)"
        )


def close_engine(engine: Engine) -> None:
    """Close ``engine`` if it can be closed (frees its weights and threads)."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers have the same vocabulary and chat template (prompts render alike)."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


class PolicyVersions:
    """The version in service (``current``) of a model served with ``tokenizer``, and its swaps.

    Args:
        engine, version: the first version in service.
        tokenizer: the served tokenizer (every version must share its vocabulary and template).
        reloader: loads the newest checkpoint (:meth:`reload`); ``None``: nothing to reload.
        on_swap: called with each new engine as it goes into service.
    """

    def __init__(
        self,
        engine: Engine,
        version: str,
        tokenizer: Any,
        *,
        reloader: Callable[[], Reloaded] | None = None,
        on_swap: Callable[[Engine], None] = lambda engine: None,
    ):
        self.current = ServedPolicy(engine, version)
        self.tokenizer, self.reloader = tokenizer, reloader
        self._on_swap = on_swap
        self._swapping = asyncio.Lock()

    async def swap(self, engine: Engine, version: str, *, tokenizer: Any = None, close_old: bool = True) -> str:
        """Serve ``engine`` (model version ``version``) from now on; returns the version it replaces.

        New requests go to ``engine`` at once; requests in flight finish on the old one, which is
        then closed (``close_old``). The new model must share the served tokenizer's vocabulary
        and chat template (a ``ValueError`` otherwise): prompts are rendered once, for both.
        """
        if tokenizer is not None and not same_tokenizer(tokenizer, self.tokenizer):
            raise ValueError(
                f"version {version!r} has another tokenizer (vocabulary or chat template) than the "
                f"served {self.current.version!r}: serve it with its own server"
            )
        old, self.current = self.current, ServedPolicy(engine, version)
        self._on_swap(engine)
        log.info(
            "model version %s in service (was %s; %d requests finishing on it)", version, old.version, old.in_flight
        )
        if close_old:
            asyncio.get_running_loop().create_task(self._retire(old))
        return old.version

    async def _retire(self, old: ServedPolicy) -> None:
        await old.idle.wait()
        await asyncio.to_thread(close_engine, old.engine)

    async def reload(self, check: Callable[[Engine, str], Awaitable[None]]) -> dict[str, Any]:
        """Put the reloader's newest checkpoint in service once ``check`` (the canary) passes on
        it; returns ``POST /v1/admin/reload``'s answer (:class:`APIError` 404 without a reloader,
        409 when there is nothing to load, it fails its canary or its tokenizer differs)."""
        if self.reloader is None:
            raise APIError(404, "this server has no checkpoint to reload from", code="not_reloadable")
        async with self._swapping:
            try:
                engine, tokenizer, version = await asyncio.to_thread(self.reloader)
            except (FileNotFoundError, ValueError) as exc:  # no checkpoint yet, one the loader refuses
                raise APIError(409, f"cannot reload: {exc}", code="reload_failed") from None
            if version == self.current.version or engine is None:
                if engine is not None:
                    await asyncio.to_thread(close_engine, engine)
                return {"object": "reload", "version": version, "swapped": False}
            try:  # the new weights answer a canary before any request sees them
                await check(engine, version)
            except UnservableModelError as exc:
                await asyncio.to_thread(close_engine, engine)
                raise APIError(
                    409, f"cannot reload: {exc}; still serving {self.current.version!r}", code="reload_failed"
                ) from None
            try:
                previous = await self.swap(engine, version, tokenizer=tokenizer)
            except ValueError as exc:
                await asyncio.to_thread(close_engine, engine)
                raise APIError(409, str(exc), code="incompatible_checkpoint") from None
        return {"object": "reload", "version": version, "previous": previous, "swapped": True}
