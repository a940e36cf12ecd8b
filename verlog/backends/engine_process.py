"""The embedded engine in a process of its own, beside the graphs' event loop.

In one Python process the graphs' event loop and the embedded engine's decode thread take turns at
the interpreter's lock: a small model's forward pass is mostly Python (transformers' modules), the
graphs' supersteps, chat templates and turn records are Python too, so the two hardly ever run at
once (a process running both keeps about one core busy). :class:`EngineProcess` runs an
:class:`~verlog.backends.embedded.EmbeddedEngine` in a spawned child process instead, with its own
interpreter, on the same model tensors:

* the model's parameters and buffers move to shared memory before the child starts, so whoever
  changes them in place here (an optimizer step, ``publish_weights``) changes what the child decodes
  with. Hold :meth:`EngineProcess.weights_lock` meanwhile: the child takes the same lock (across
  processes) around each batch step, and at its first step after the lock was released it drops its
  prefix cache (the KV of the weights before);
* requests go to the child through a pipe (prompt ids, sampling settings, images) and come back as
  the very :class:`~verlog.backends.base.Generation` the engine made (ids and logprobs, streamed
  tokens as they are chosen): nothing is re-tokenized;
* a request's seed gives the same tokens as in process; the child's stream for unseeded requests is
  :attr:`EngineProcess.sampling_generator` (its state is read and set through the pipe, for a
  trainer's checkpoints).

The child starts with ``spawn``: it imports the main script again, so a script that builds one must
do so under ``if __name__ == "__main__":``. CPU only (the forward pass of a model on a GPU leaves the
interpreter free while its kernels run).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import pickle
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator

import torch
import torch.multiprocessing as mp

from verlog.backends.base import (
    CONSTRAINT_KINDS,
    EngineError,
    Generation,
    ImageInputs,
    SamplingParams,
)
from verlog.backends.embedded import (
    EmbeddedEngine,
    EngineStats,
    TokenStreamingEngine,
    _image_model_problem,
    _set_exception,
    _set_result,
)
from verlog.tokens import eos_token_ids
from verlog.weights.shared_memory import share_models

__all__ = ["EngineProcess"]

#: how long the child may take to import torch and build its engine
START_TIMEOUT_S = 300.0


class EngineProcess(TokenStreamingEngine):
    """An :class:`~verlog.backends.embedded.EmbeddedEngine` on ``model`` in a child process (see the
    module doc); ``options`` are the embedded engine's keyword arguments (``max_batch_size``,
    ``seed``, ``cpu_threads``, ...). Raises :class:`~verlog.backends.base.EngineError` if the child
    cannot start."""

    constraint_kinds = frozenset(CONSTRAINT_KINDS)

    def __init__(self, model: torch.nn.Module, tokenizer: Any, **options: Any):
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"the engine runs in a process of its own only on the CPU (the model is on {device})")
        share_models(model, purpose="engine.process")
        self.model, self.tokenizer = model, tokenizer
        self.eos_token_ids = eos_token_ids(tokenizer, model)
        self._image_problem = _image_model_problem(model)
        context = mp.get_context("spawn")
        self._step_lock = context.Lock()
        self._weights_version = context.Value("q", 0, lock=False)
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child, model, tokenizer, options, self._step_lock, self._weights_version),
            name="verlog-engine",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._closed = False
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        #: requests in flight: id -> (their loop, their future, their token callback)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future, Callable | None]] = {}
        #: sync calls waiting for the child's answer
        self._calls: dict[int, concurrent.futures.Future] = {}
        try:
            ready = self._conn.poll(START_TIMEOUT_S) and self._conn.recv()
        except (EOFError, ConnectionResetError):
            ready = None
        if not ready or ready[0] != "ready":
            self._stop()
            why = ready[2] if ready and ready[0] == "error" else f"exit code {self._process.exitcode}"
            raise EngineError(
                f"the engine process did not start ({why}). It starts by importing the main script: a script "
                'that builds one must do so under `if __name__ == "__main__":`'
            )
        self.max_context = ready[2]
        self._reader = threading.Thread(target=self._read, name="verlog-engine-replies", daemon=True)
        self._reader.start()

    @property
    def accepts_images(self) -> bool:  # type: ignore[override]
        """Whether the model takes images (as :attr:`EmbeddedEngine.accepts_images`)."""
        return self._image_problem is None

    # ------------------------------------------------------------------ requests
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        on_token: Callable[[int, float], Any] | None = None,
        images: ImageInputs | None = None,
    ) -> Generation:
        """Generate one response in the child (see :meth:`EmbeddedEngine.generate`; the same
        arguments, errors and result). Cancelling the call frees its batch row there."""
        if self._closed:
            raise EngineError("the engine process is closed")
        if images is not None and self._image_problem is not None:
            raise EngineError(f"this request has images, and {self._image_problem}")
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        future = loop.create_future()
        self._pending[rid] = (loop, future, on_token)
        self._send(("generate", rid, (list(prompt_ids), sampling, images, on_token is not None)))
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None:
                self._send(("cancel", rid, None))
            raise

    def validate_constraint(self, constraint: Any) -> None:
        """Compile ``constraint`` in the child (see :meth:`EmbeddedEngine.validate_constraint`)."""
        super().validate_constraint(constraint)
        self._call("validate_constraint", constraint)

    # ------------------------------------------------------------------ the weights and the child's state
    @contextlib.contextmanager
    def weights_lock(self) -> Iterator[None]:
        """Hold this while changing the model's weights: the child runs no batch step meanwhile,
        and drops its prefix cache at its next one."""
        with self._step_lock:
            try:
                yield
            finally:
                self._weights_version.value += 1

    @property
    def sampling_generator(self) -> "_ChildGenerator":
        """The child's random stream of unseeded sampling (``get_state`` / ``set_state``)."""
        return _ChildGenerator(self)

    @property
    def stats(self) -> EngineStats:
        """A copy of the child engine's counters, now."""
        return self._call("stats")

    # ------------------------------------------------------------------ the pipe
    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise EngineError(f"the engine process is gone ({self._exit()})") from exc

    def _call(self, kind: str, payload: Any = None, timeout: float = 120.0) -> Any:
        """A request answered at once by the child's event loop (its state, not a generation)."""
        if self._closed:
            raise EngineError("the engine process is closed")
        rid = next(self._ids)
        answer = self._calls[rid] = concurrent.futures.Future()
        self._send(("call", rid, (kind, payload)))
        try:
            return answer.result(timeout)
        except concurrent.futures.TimeoutError:
            self._calls.pop(rid, None)
            raise EngineError(f"the engine process did not answer {kind!r} within {timeout:.0f} s") from None

    def _read(self) -> None:
        """The reader thread: hands each answer of the child to the loop (or thread) awaiting it."""
        while True:
            try:
                kind, rid, payload = self._conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                break
            if kind == "token":
                entry = self._pending.get(rid)
                if entry is not None and entry[2] is not None:
                    _on_loop(entry[0], entry[2], *payload)
            elif kind in ("done", "error"):
                entry = self._pending.pop(rid, None)
                if entry is not None:
                    _on_loop(entry[0], _set_result if kind == "done" else _set_exception, entry[1], payload)
            elif kind == "answer" and (answer := self._calls.pop(rid, None)) is not None:
                answer.set_result(payload)
            elif kind == "failed" and (answer := self._calls.pop(rid, None)) is not None:
                answer.set_exception(payload)
        gone = EngineError(f"the engine process stopped ({self._exit()})")
        self._closed = True
        for loop, future, _ in list(self._pending.values()):
            _on_loop(loop, _set_exception, future, gone)
        self._pending.clear()
        for answer in list(self._calls.values()):
            answer.set_exception(gone)
        self._calls.clear()

    def _exit(self) -> str:
        """How the child ended (waiting a little for it to end)."""
        self._process.join(timeout=5)
        code = self._process.exitcode
        return "still running" if code is None else f"exit code {code}: killed or out of memory" if code else "closed"

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Stop the child (requests in flight fail with :class:`EngineError`)."""
        if not self._closed:
            self._closed = True
            self._stop()

    def _stop(self) -> None:
        if self._process.is_alive():
            try:
                with self._send_lock:
                    self._conn.send(None)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=10)
        self._conn.close()


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable, *args: Any) -> None:
    """``callback(*args)`` on ``loop``; nothing if that loop is closed (its caller is gone)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class _ChildGenerator:
    """The child engine's ``sampling_generator``, as far as a checkpoint needs it."""

    def __init__(self, engine: EngineProcess):
        self._engine = engine

    def get_state(self) -> torch.Tensor:
        return self._engine._call("get_rng_state")

    def set_state(self, state: torch.Tensor) -> "_ChildGenerator":
        self._engine._call("set_rng_state", state)
        return self


class _SharedStepLock:
    """The child's step lock: the parent's weights lock, and the prefix cache dropped at the first
    step after the parent changed the weights."""

    def __init__(self, lock: Any, version: Any):
        self._lock, self._version = lock, version
        self._seen = version.value
        self.engine: EmbeddedEngine | None = None

    def __enter__(self) -> None:
        self._lock.acquire()
        if self._version.value != self._seen:
            self._seen = self._version.value
            if self.engine is not None:
                self.engine.prefix_cache.clear()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def _serve(conn: Connection, model: torch.nn.Module, tokenizer: Any, options: dict, lock: Any, version: Any) -> None:
    """The child: an embedded engine serving the parent's requests until told to stop (``None``)
    or its parent goes."""
    try:
        step_lock = _SharedStepLock(lock, version)
        engine = EmbeddedEngine(model, tokenizer, step_lock=step_lock, **options)
        step_lock.engine = engine
    except BaseException:
        conn.send(("error", None, traceback.format_exc(limit=3)))
        return
    conn.send(("ready", None, engine.max_context))
    try:
        asyncio.run(_answer_requests(conn, engine))
    finally:
        engine.close()


async def _answer_requests(conn: Connection, engine: EmbeddedEngine) -> None:
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()
    tasks: dict[int, asyncio.Task] = {}

    def send(message: tuple) -> None:
        try:
            conn.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError):  # the parent is gone
            if not stopped.done():
                stopped.set_result(None)

    async def generate(rid: int, prompt_ids: list[int], sampling: SamplingParams, images: Any, streams: bool) -> None:
        on_token = (lambda token, logprob: send(("token", rid, (token, logprob)))) if streams else None
        try:
            generation = await engine.generate(prompt_ids, sampling, on_token=on_token, images=images)
        except asyncio.CancelledError:  # the caller cancelled: it awaits nothing more
            return
        except BaseException as exc:
            send(("error", rid, _picklable(exc)))
        else:
            send(("done", rid, generation))
        finally:
            tasks.pop(rid, None)

    def answer(kind: str, payload: Any) -> Any:
        if kind == "stats":
            return engine.stats
        if kind == "get_rng_state":
            return engine.sampling_generator.get_state()
        if kind == "set_rng_state":
            engine.sampling_generator.set_state(payload)
            return None
        if kind == "validate_constraint":
            return engine.validate_constraint(payload)
        raise ValueError(f"unknown request {kind!r}")

    def receive() -> None:
        while not stopped.done() and conn.poll():
            try:
                message = conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                message = None
            if message is None:  # told to stop, or the parent is gone
                stopped.set_result(None)
                return
            kind, rid, payload = message
            if kind == "generate":
                tasks[rid] = loop.create_task(generate(rid, *payload))
            elif kind == "cancel":
                if (task := tasks.pop(rid, None)) is not None:
                    task.cancel()
            elif kind == "call":
                try:
                    send(("answer", rid, answer(*payload)))
                except BaseException as exc:
                    send(("failed", rid, _picklable(exc)))

    loop.add_reader(conn.fileno(), receive)
    try:
        await stopped
    finally:
        loop.remove_reader(conn.fileno())
        for task in list(tasks.values()):
            task.cancel()


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it crosses the pipe, else an :class:`EngineError` with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return EngineError(f"{type(exc).__name__}: {exc}")
