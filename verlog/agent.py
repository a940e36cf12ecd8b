"""Assembling an agent from a config: tokenizer, engine, chat model and the graph file.

``load_agent(config)`` is what ``verlog rollout`` (and later training and evaluation) start
from: the same graph file, built around verlog's chat model on the configured engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from verlog.backends.base import Engine
from verlog.config import ConfigError, VerlogConfig
from verlog.graph_file import GraphFile, GraphFileError, load_graph_file
from verlog.llm.chat_model import VerlogChatModel
from verlog.models.safe_load import first_line
from verlog.rollout import Episode, run_episodes
from verlog.rollout.interrupts import InterruptResponder


def pick_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_engine(config: VerlogConfig, tokenizer: Any, model: Any = None) -> Engine:
    """The engine named by ``config.engine`` (the embedded one loads ``config.model`` unless a
    model object is given, e.g. the trainer's actor)."""
    eng = config.engine
    if eng.kind == "sglang":
        from verlog.backends.sglang import SGLangEngine

        eos = getattr(tokenizer, "eos_token_id", None)
        return SGLangEngine(
            eng.sglang.url,
            timeout_s=eng.sglang.timeout_s,
            max_retries=eng.sglang.max_retries,
            eos_token_ids=(eos,) if isinstance(eos, int) else (),
        )
    from verlog.models import load_causal_lm
    from verlog.weights.precision import autocast_dtype

    if model is None:
        model = load_causal_lm(config.model.path, dtype=config.model.dtype, device=pick_device(config.model.device))
    return embedded_engine(config, model, tokenizer, autocast=autocast_dtype(config.model.autocast))


def embedded_engine(config: VerlogConfig, model: Any, tokenizer: Any, *, autocast: Any = None) -> Engine:
    """The embedded engine on ``model`` with ``config.engine``'s settings: on a thread of this
    process, or in a process of its own (``engine.process``; CPU only)."""
    from verlog.backends.embedded import EmbeddedEngine

    eng = config.engine
    options = {
        "max_batch_size": eng.max_batch_size,
        "batch_wait_ms": eng.batch_wait_ms,
        "seed": config.rollout.seed,
        "prefix_cache_bytes": int(eng.prefix_cache_mb * 2**20),
        "autocast": autocast,
    }
    if not eng.process:
        return EmbeddedEngine(model, tokenizer, **options)
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(
            f"engine.process: the engine runs in a process of its own only on the CPU (the model is on {device}); "
            "set engine.process: false (on a GPU its forward passes leave the interpreter free anyway)"
        )
    from verlog.backends.engine_process import EngineProcess

    return EngineProcess(model, tokenizer, **options)


def build_chat_model(config: VerlogConfig, engine: Engine, tokenizer: Any) -> VerlogChatModel:
    """verlog's chat model with the config's sampling defaults and chat-template options (and a
    vision-language model's processor: its messages may hold images)."""
    from verlog.models import load_processor

    s = config.sampling
    processor = load_processor(config.model.path, tokenizer)
    return VerlogChatModel(
        engine=engine,
        tokenizer=tokenizer,
        processor=processor,
        model_name=config.model.path,
        chat_template_kwargs=config.multi_turn.chat_template_kwargs,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_tokens=s.max_tokens,
        stop=s.stop or None,
    )


def judge_chat_models(config: VerlogConfig, policy: VerlogChatModel | None = None) -> Callable[[str], Any]:
    """``chat_model_for(name)`` for judges with ``embedded``: ``policy`` is ``policy`` (verlog's chat
    model on the engine being trained: its calls run outside any episode, so they are never
    training turns); any other name is a model (``tiny``, ``smollm2``, a folder) loaded once on an
    embedded engine of its own."""
    loaded: dict[str, VerlogChatModel] = {}

    def chat_model_for(name: str) -> Any:
        if name == "policy":
            if policy is None:
                raise ConfigError(
                    "reward.judges: embedded: policy needs the policy's engine (training, eval "
                    "with --checkpoint); give a model path or an endpoint instead"
                )
            return policy
        if name not in loaded:
            from verlog.models import load_tokenizer

            judge_config = config.model_copy(update={"model": config.model.model_copy(update={"path": name})})
            tokenizer = load_tokenizer(name)
            loaded[name] = build_chat_model(judge_config, build_engine(judge_config, tokenizer), tokenizer)
        return loaded[name]

    return chat_model_for


@dataclass
class Agent:
    """A graph file built around verlog's chat model, ready to run episodes."""

    config: VerlogConfig
    tokenizer: Any
    engine: Engine
    chat_model: VerlogChatModel
    graph_file: GraphFile
    graph: Any

    async def rollout(
        self,
        episodes: int,
        *,
        first_seed: int | None = None,
        keep_messages: bool = False,
        on_episode=None,
        split: str = "train",
        on_start: Callable[[str, Any], None] | None = None,
        concurrency: int | None = None,
    ) -> list[Episode]:
        """Run ``episodes`` episodes and score them with the reward section: seeds ``first_seed``,
        ``first_seed + 1``, ... (default ``rollout.seed``); with a data section, rows
        ``first_seed``, ``first_seed + 1``, ... (default 0) of ``split`` in file order. An episode
        a reward function fails on is recorded as failed. ``on_start(episode_id, task)`` is told
        each episode's task (a ``verlog.data.tasks.Task``: its seed or row) before any runs;
        ``concurrency``: episodes at once (default ``rollout.concurrency``)."""
        from verlog.episodes import EpisodePlan, build_scorer
        from verlog.rewards import RewardError

        r = self.config.rollout
        rows = self.config.data is not None
        start = (0 if rows else r.seed) if first_seed is None else first_seed
        plan = EpisodePlan(
            self.config,
            self.graph_file,
            split,
            scorer=build_scorer(self.config, chat_model_for=judge_chat_models(self.config, self.chat_model)),
            in_order=True,
        )
        if plan.size is not None:
            episodes = max(0, min(episodes, plan.size - start))
        tasks = range(start, start + episodes)
        ids = [f"{split}-row{i}" if rows else f"seed{i}" for i in tasks]
        task_of = dict(zip(ids, tasks))

        async def scored(episode: Episode) -> None:
            if not episode.failed:
                try:
                    await plan.score(episode, task_of[episode.episode_id])
                except RewardError as exc:
                    episode.status, episode.error = "error", str(exc)
            if on_episode is not None:
                maybe = on_episode(episode)
                if hasattr(maybe, "__await__"):
                    await maybe

        inputs = []
        for i, episode_id in zip(tasks, ids):
            try:
                task = plan.tasks.task(i)
                inputs.append(task.input)
            except Exception as exc:  # the graph file's make_input, or the config's data.input mapping
                source = "data.input" if rows else f"make_input({i}) of {self.graph_file.path}"
                raise GraphFileError(f"the input of episode {episode_id} failed ({source}): {first_line(exc)}") from exc
            if on_start is not None:
                on_start(episode_id, task)
        langgraph = self.config.multi_turn.langgraph
        return await run_episodes(
            self.graph,
            inputs,
            episode_ids=ids,
            concurrency=concurrency or r.concurrency,
            graph_config=self.config.multi_turn.langgraph.graph_config,
            timeout_s=r.episode_timeout_s,
            keep_messages=keep_messages,
            on_episode=scored,
            interrupts=InterruptResponder.from_config(langgraph),
            keep_discarded=langgraph.train_discarded_calls,
        )

    async def aclose(self) -> None:
        await self.engine.aclose()


def load_agent(config: VerlogConfig, *, engine: Engine | None = None, model: Any = None) -> Agent:
    """Load tokenizer and engine, build the chat model and the configured graph.

    A graph file that fails to import, lacks ``make_input`` or whose ``build_graph`` raises is a
    ``GraphFileError`` (checked before the model's weights are loaded where possible)."""
    from verlog.models import load_tokenizer

    graph_file = load_graph_file(config.multi_turn.langgraph.path)  # fail fast, before loading weights
    if config.data is None:
        graph_file.require_make_input()  # an agent runs episodes: a file without make_input stops here
    tokenizer = load_tokenizer(config.model.path)
    engine = engine or build_engine(config, tokenizer, model)
    chat_model = build_chat_model(config, engine, tokenizer)
    graph = graph_file.build(chat_model, **config.multi_turn.langgraph.graph_kwargs)
    return Agent(config, tokenizer, engine, chat_model, graph_file, graph)
