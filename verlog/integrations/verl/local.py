"""Running verl's agent-loop machinery in one process, without GPUs (tests, debugging a graph).

* ``EngineServerClient`` stands in for verl's ``LLMServerClient``: ``generate`` is served by any
  verlog ``Engine`` (e.g. the embedded engine on a small model) and answers verl's
  ``TokenOutput``; it records the request ids it saw. As verl's SGLang server (the default), it
  refuses what that server cannot take: ``stop`` strings (SGLang runs without a tokenizer under
  verl) and keys SGLang's sampling parameters do not have (``seed``: SGLang's is ``sampling_seed``).
  It takes a prompt's images as verl's servers do (``image_data``: ``PIL.Image`` objects) and hands
  them to the engine as ``ImageInputs`` made by the model's ``processor``; a client without one
  (a text model's server) refuses them, as it refuses video and audio.
* ``MemoryTransferQueue`` stands in for verl's TransferQueue (the key-value store between verl's
  agent-loop workers and its trainer): ``patch()`` swaps its functions into the
  ``transfer_queue`` module, so verl's real ``AgentLoopWorkerTQ`` and trainer code write and read
  plain in-memory rows. Variable-length tensors come back as jagged nested tensors, as from the
  real queue.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Iterator, Sequence

import torch

from verlog.backends.base import Engine, ImageInputs, SamplingParams

__all__ = ["EngineServerClient", "MemoryTransferQueue"]

_STOP_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
#: the ``sampling_params`` keys verl's SGLang server passes to SGLang that a tokenizer-less
#: SGLang accepts (``logprobs`` is taken by verl itself)
SGLANG_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop_token_ids",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "logit_bias",
        "sampling_seed",
        "logprobs",
    }
)


class EngineServerClient:
    """verl's ``LLMServerClient`` interface served by a verlog ``Engine``.

    Args:
        engine: the engine that generates.
        global_steps: reported as the weights' version (``TokenOutput.extra_fields``).
        server: the server verl would run: ``sglang`` (checks the keys as above) or ``vllm``.
        processor: a vision-language model's processor: ``image_data`` becomes the engine's
            ``ImageInputs`` (the images as PNG files and the processor's pixel inputs from them).
    """

    def __init__(self, engine: Engine, *, global_steps: int = 0, server: str = "sglang", processor: Any = None):
        self.engine = engine
        self.global_steps = global_steps
        self.server = server
        self.processor = processor
        #: every ``generate`` call, in order: request id, prompt ids, token ids, logprobs, image_data
        self.calls: list[dict[str, Any]] = []

    @property
    def request_ids(self) -> list[str]:
        """The request id of every ``generate`` call, in order."""
        return [c["request_id"] for c in self.calls]

    def image_inputs(self, image_data: Sequence[Any]) -> ImageInputs:
        """verl's ``image_data`` (``PIL.Image`` objects) as the engine's ``ImageInputs``."""
        import io

        from verlog.llm.prompt import PromptRenderer

        if self.processor is None or not self.engine.accepts_images:
            raise ValueError("this server's model takes no images (a text model's server)")
        files = []
        for image in image_data:
            out = io.BytesIO()
            image.save(out, format="PNG")  # lossless: the same pixels come back
            files.append(out.getvalue())
        renderer = PromptRenderer(self.processor.tokenizer, processor=self.processor)
        return ImageInputs(tuple(files), renderer.image_inputs(files))

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Sequence[Any] | None = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if video_data is not None or audio_data is not None:
            raise ValueError("this server takes no video or audio")
        if mm_processor_kwargs:
            raise ValueError(
                f"this server processes images with its processor's own settings, not {mm_processor_kwargs}"
            )
        images = None if image_data is None else self.image_inputs(image_data)
        params = dict(sampling_params)
        if self.server == "sglang":
            unknown = sorted(set(params) - SGLANG_KEYS)
            if "stop" in params:
                raise ValueError("SGLang under verl runs without a tokenizer (skip_tokenizer_init): no stop strings")
            if unknown:
                raise ValueError(f"SGLang's sampling parameters have no {unknown}")
        seed = params.get("sampling_seed", params.get("seed"))
        top_k = int(params.get("top_k", -1))
        sampling = SamplingParams(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else -1,
            max_new_tokens=int(params.get("max_new_tokens", params.get("max_tokens", 256))),
            stop=tuple(params.get("stop") or ()),
            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
            seed=None if seed is None else int(seed),
        )
        with_images = {} if images is None else {"images": images}
        gen = await self.engine.generate(list(prompt_ids), sampling, request_id=request_id, **with_images)
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "token_ids": list(gen.token_ids),
                "logprobs": list(gen.logprobs),
                "image_data": None if image_data is None else list(image_data),
            }
        )
        step = self.global_steps
        return TokenOutput(
            token_ids=list(gen.token_ids),
            log_probs=list(gen.logprobs) if params.get("logprobs") else None,
            stop_reason=_STOP_REASONS.get(gen.finish_reason, "stop"),
            extra_fields={"global_steps": step, "min_global_steps": step, "max_global_steps": step},
        )


def _rows(values: Any, n: int) -> list[Any]:
    """A batched TensorDict entry as one value per row."""
    if isinstance(values, torch.Tensor):
        return list(values.unbind(0))
    tolist = getattr(values, "tolist", None)
    items = tolist() if tolist is not None else list(values)
    if len(items) != n:
        raise ValueError(f"field has {len(items)} rows, expected {n}")
    return [getattr(item, "data", item) for item in items]


def _batched(values: list[Any]) -> Any:
    from tensordict import NonTensorStack

    if values and all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return torch.stack(values)
        return torch.nested.as_nested_tensor([v.contiguous() for v in values], layout=torch.jagged)
    return NonTensorStack(*values)


class MemoryTransferQueue:
    """An in-memory stand-in for verl's TransferQueue (the functions verl's v1 code calls)."""

    def __init__(self) -> None:
        #: partition -> key -> field -> value (one row's)
        self.rows: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        #: partition -> key -> tag
        self.tags: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)

    # ---------------------------------------------------------------- TransferQueue's API
    def init(self, *args: Any, **kwargs: Any) -> None:
        return None

    def kv_batch_put(
        self, keys: Sequence[str], partition_id: str, fields: Any = None, tags: Sequence[dict] | None = None, **_: Any
    ) -> Any:
        from transfer_queue import KVBatchMeta

        keys = list(keys)
        if fields is not None:
            for name in fields.keys():
                for key, value in zip(keys, _rows(fields.get(name), len(keys)), strict=True):
                    self.rows[partition_id].setdefault(key, {})[name] = value
        for i, key in enumerate(keys):
            self.rows[partition_id].setdefault(key, {})
            tag = self.tags[partition_id].setdefault(key, {})
            if tags is not None:
                tag.update(tags[i])
        names = sorted({n for k in keys for n in self.rows[partition_id][k]})
        return KVBatchMeta(
            keys=keys, tags=[dict(self.tags[partition_id][k]) for k in keys], partition_id=partition_id, fields=names
        )

    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: dict | None = None, **_: Any) -> Any:
        for name, value in (dict(fields.items()) if fields is not None else {}).items():
            self.rows[partition_id].setdefault(key, {})[name] = getattr(value, "data", value)
        return self.kv_batch_put([key], partition_id, tags=[tag or {}])

    def kv_batch_get(self, keys: Sequence[str] | str, partition_id: str, select_fields: Any = None) -> Any:
        from tensordict import TensorDict

        keys = [keys] if isinstance(keys, str) else list(keys)
        stored = [self.rows[partition_id][k] for k in keys]
        if select_fields is None:
            names = list(stored[0]) if stored else []
        else:
            names = [select_fields] if isinstance(select_fields, str) else list(select_fields)
        data = {}
        for name in names:
            missing = [k for k, row in zip(keys, stored) if name not in row]
            if missing:
                raise ValueError(f"field {name!r} missing for keys {missing[:3]}")
            data[name] = _batched([row[name] for row in stored])
        return TensorDict(data, batch_size=[len(keys)])

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, Any]]:
        parts = [partition_id] if partition_id is not None else list(self.tags)
        return {p: {k: dict(t) for k, t in self.tags[p].items()} for p in parts}

    def kv_clear(self, keys: Sequence[str] | str, partition_id: str) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            self.rows[partition_id].pop(key, None)
            self.tags[partition_id].pop(key, None)

    async def async_kv_batch_put(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_batch_put(*args, **kwargs)

    async def async_kv_put(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_put(*args, **kwargs)

    async def async_kv_batch_get(self, *args: Any, **kwargs: Any) -> Any:
        return self.kv_batch_get(*args, **kwargs)

    async def async_kv_clear(self, *args: Any, **kwargs: Any) -> None:
        self.kv_clear(*args, **kwargs)

    # ---------------------------------------------------------------- helpers
    def trajectory_keys(self, partition_id: str = "train") -> list[str]:
        """The keys of stored samples (``{uid}_{session}_{index}``), not prompt status entries."""
        return [k for k, row in self.rows[partition_id].items() if "prompts" in row]

    @contextlib.contextmanager
    def patch(self) -> Iterator["MemoryTransferQueue"]:
        """Swap this store's functions into the ``transfer_queue`` module for the duration."""
        import transfer_queue

        names = [
            "init",
            "kv_batch_put",
            "kv_put",
            "kv_batch_get",
            "kv_list",
            "kv_clear",
            "async_kv_batch_put",
            "async_kv_put",
            "async_kv_batch_get",
            "async_kv_clear",
        ]
        saved = {n: getattr(transfer_queue, n) for n in names}
        try:
            for n in names:
                setattr(transfer_queue, n, getattr(self, n))
            yield self
        finally:
            for n, fn in saved.items():
                setattr(transfer_queue, n, fn)
