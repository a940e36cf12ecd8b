"""The ``verlog`` command line.

    verlog rollout CONFIG [key=value ...] [--episodes N] [--seed S] [--show-messages] [--json FILE]
    verlog train CONFIG [key=value ...] [--resume] [--init-from RUN] [--engine embedded|verl] [--dry-run]
    verlog sft CONFIG [key=value ...] [--resume]
    verlog eval CONFIG [CONFIG ...] [key=value ...] [--suite balrog] [--checkpoint DIR | --base-url URL --model NAME]
    verlog play ENV [--seed S] [--agent human|bot|random]
    verlog serve-model CHECKPOINT [--port P] [--api-key K]
    verlog serve GRAPH --base-url URL --model NAME
    verlog models build {tiny,toy,smollm2}

A user's mistake (a bad config key, a ``model.path`` that names no model, a graph file that fails
to import or build or lacks ``make_input``, a ``make_input`` that raises, a graph whose episodes
keep failing, an unreachable engine, a checkpoint verlog will not load, ``--resume`` without a
checkpoint) prints one ``error: ...`` line on stderr and exits 2, without a traceback; each is
listed with what to do in docs/troubleshooting.md. ``verlog rollout`` whose every episode failed
prints its turns and summary, then one ``error:`` line naming the first failure, and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from verlog.models import MODEL_SPECS

if TYPE_CHECKING:
    from verlog.config import VerlogConfig
    from verlog.rollout import Episode

# Heavier modules (torch, transformers, LangChain, the engines) are imported by the command that
# needs them, so that ``verlog --help`` and a bad argument answer at once.

#: the exceptions that mean the user must change something, by module and name: a module's error
#: counts once the module is loaded (an error of a module never loaded cannot have been raised)
USER_ERRORS = (
    ("verlog.config", "ConfigError"),
    ("verlog.graph_file", "GraphFileError"),
    ("verlog.backends.base", "EngineError"),
    ("verlog.rollout.slots", "SlotFailureError"),
    ("verlog.models.safe_load", "CheckpointError"),
    ("verlog.evaluation.runner", "EvalError"),
    ("verlog.algo.estimators.registry", "EstimatorInputError"),
)


#: the modules of verlog's optional extras (pyproject.toml), by extra: a missing one is named with its extra
OPTIONAL_MODULES = {
    "envs": ("minigrid", "crafter", "numba", "textworld", "nle", "minihack", "cv2"),
    "verl": ("verl", "transfer_queue", "cachetools", "fastapi", "uvicorn", "msgspec", "zmq"),
    "gpu": ("vllm",),
    "lora": ("peft",),
    "serve": ("langgraph_cli", "langgraph_sdk", "psycopg"),
    "eval": ("langchain_openai", "openai", "matplotlib"),
    "rewards": ("math_verify",),
}


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the user must change something (a config, a graph file, a run
    folder): reported as one ``error:`` line and exit status 2. Anything else is a bug and keeps
    its traceback. Read from the modules loaded so far (no import for it)."""
    errors = []
    for module, name in USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            errors.append(getattr(loaded, name))
    return tuple(errors)


class CommandParser(argparse.ArgumentParser):
    """A sub-command's parser whose arguments may come from a heavier module, added on first use
    (``populate``): the top-level ``--help`` lists the command without importing it."""

    populate: Callable[[argparse.ArgumentParser], None] | None = None

    def _ready(self) -> None:
        populate, self.populate = self.populate, None
        if populate is not None:
            populate(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._ready()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._ready()
        return super().format_help()


def _load_config(args: argparse.Namespace) -> VerlogConfig:
    """The config of ``args`` with ``model.path`` made a full model's folder where it names a run,
    a checkpoint or a Hugging Face hub id (``verlog.weights.policy.full_model_path``)."""
    from verlog.config import ConfigError, load_config
    from verlog.weights.policy import full_model_path

    config = load_config(args.config, args.overrides)
    try:
        config.model.path = full_model_path(config.model.path)
    except FileNotFoundError as exc:
        raise ConfigError(f"model.path: {exc}") from None
    return config


def _rollout(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from verlog.agent import load_agent
    from verlog.console import console

    config = _load_config(args)
    episodes_n = args.episodes or config.rollout.episodes
    with console.status("loading model and graph..."):
        agent = load_agent(config)
    console.print(
        f"[bold]{Path(config.multi_turn.langgraph.path).name}[/] on [bold]{config.model.path}[/] "
        f"({config.engine.kind} engine): {episodes_n} episodes"
    )

    async def run() -> list[Episode]:
        try:
            return await agent.rollout(episodes_n, first_seed=args.seed, keep_messages=args.show_messages)
        finally:
            await agent.aclose()

    episodes = asyncio.run(run())
    for episode in episodes:
        _print_episode(episode, agent.tokenizer, show_messages=args.show_messages)
    _print_summary(episodes)
    if args.json:
        Path(args.json).write_text(json.dumps([_episode_json(e) for e in episodes], indent=1))
        console.print(f"turns written to {args.json}")
    # nothing played: a script must not read it as a success (an interrupt waits for its human: not a failure)
    if episodes and all(e.failed and e.status != "interrupted" for e in episodes):
        from verlog.console import print_error

        first = episodes[0]
        reason = (first.error or first.status).strip().splitlines()[0]
        print_error(f"every episode failed ({len(episodes)} of {len(episodes)}); the first ({first.status}): {reason}")
        return 1
    return 0


def _episode_json(episode: Episode) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(episode)
    data.pop("output", None)
    for turn in data["turns"]:
        turn.pop("messages", None)
    return data


def _print_episode(episode: Episode, tokenizer: Any, *, show_messages: bool) -> None:
    from verlog.console import console

    colour = "green" if not episode.failed else "red"
    console.rule(
        f"[{colour}]episode {episode.episode_id}: {episode.status}[/] · {len(episode.turns)} turns · "
        f"return {episode.total_reward:.2f} · {episode.seconds:.1f} s"
        + (
            f" · [yellow]{episode.uncaptured_calls} model calls not captured (no verlog token data, or made outside the episode's context)[/]"
            if episode.uncaptured_calls
            else ""
        )
        + (f" · {episode.resumes} interrupts answered" if episode.resumes else "")
        + (f" · {episode.discarded_calls} calls of attempts that raised discarded" if episode.discarded_calls else "")
    )
    if episode.error:
        console.print(f"[red]{episode.error}[/]")
    for turn in episode.turns:
        flags = "terminated" if turn.terminated else "truncated" if turn.truncated else ""
        mean_lp = sum(turn.logprobs) / max(len(turn.logprobs), 1)
        console.print(
            f"[bold]turn {turn.turn_index}[/] node={turn.node} prompt={len(turn.prompt_ids)} tok "
            f"response={len(turn.response_ids)} tok mean logprob={mean_lp:.2f} "
            f"reward={turn.reward:g} {flags} ({turn.finish_reason})"
        )
        if show_messages and turn.messages:
            for m in turn.messages:
                console.print(f"  [dim]{m.type}:[/] {str(m.content)[:300]!r}")
        text = tokenizer.decode(turn.response_ids, skip_special_tokens=False)
        console.print(f"  [cyan]{text[:400]!r}[/]")


def _print_summary(episodes: list[Episode]) -> None:
    from rich.table import Table

    from verlog.console import console
    from verlog.step_info import episode_outcomes

    table = Table(title="rollout summary")
    for col in ("episodes", "failed", "turns", "mean return", "success"):
        table.add_column(col)
    ok = [e for e in episodes if not e.failed]
    successes = episode_outcomes(e.info for e in ok)
    table.add_row(
        str(len(episodes)),
        str(len(episodes) - len(ok)),
        str(sum(len(e.turns) for e in episodes)),
        f"{sum(e.total_reward for e in ok) / max(len(ok), 1):.3f}",
        f"{sum(successes)}/{len(successes)}" if successes else "-",
    )
    console.print(table)


def _train(args: argparse.Namespace) -> int:
    if args.engine == "verl":
        return _train_verl(args)
    from verlog.config import ConfigError
    from verlog.console import console

    if args.dry_run:
        raise ConfigError("--dry-run composes a verl config: use it with --engine verl")
    from verlog.train import train

    config = _load_config(args)
    if args.init_from:
        config.trainer.init_from = args.init_from
    result = train(config, resume=args.resume, console=console)
    console.print(f"{result.updates} updates in {result.seconds:.0f} s; run folder: {result.run_dir}")
    return 0


def _sft(args: argparse.Namespace) -> int:
    from verlog.console import console
    from verlog.sft import sft

    config = _load_config(args)
    result = sft(config, resume=args.resume, console=console)
    kept = sum(c.get("kept", 0) for c in result.demonstrations.values())
    console.print(
        f"{result.steps} fine-tuning steps on {kept} demonstrations in {result.seconds:.0f} s; run folder: "
        f"{result.run_dir} (verlog train CONFIG --init-from {result.run_dir})"
    )
    return 0


def _train_verl(args: argparse.Namespace) -> int:
    """Train with verl (Ray, FSDP/Megatron, SGLang/vLLM): see docs/verl.md."""
    from verlog.config import ConfigError
    from verlog.console import console

    try:
        from verlog.integrations.verl.launch import launch
    except ImportError as exc:
        raise ConfigError(f"--engine verl needs verl: pip install 'verlog[verl]' ({exc})") from exc
    overrides = [*args.overrides, *(["trainer.resume_mode=auto"] if args.resume else [])]
    return launch(args.config, overrides, dry_run=args.dry_run, echo=print if args.dry_run else console.print)


def _models(args: argparse.Namespace) -> int:
    from verlog.console import console
    from verlog.models import resolve_model_path

    path = resolve_model_path(args.name)
    console.print(f"{args.name}: {path}")
    return 0


def _play(args: argparse.Namespace) -> int:
    from verlog.console import print_error
    from verlog.envs.play import play

    try:
        play(args.env, seed=args.seed, agent=args.agent, max_steps=args.max_steps, protocol=args.protocol)
    except ValueError as exc:  # an unknown game or task, no bot for it
        print_error(str(exc))
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verlog", description="Multi-turn RL for LangGraph agents")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    p = sub.add_parser("rollout", help="run episodes of a config's graph and print every captured turn")
    p.add_argument("config", help="a YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. sampling.temperature=0")
    p.add_argument("--episodes", type=int, default=None, help="episodes to run (default: rollout.episodes)")
    p.add_argument("--seed", type=int, default=None, help="seed of the first episode (default: rollout.seed)")
    p.add_argument("--show-messages", action="store_true", help="print the messages each call received")
    p.add_argument("--json", default=None, help="also write the episodes and turns to this JSON file")
    p.set_defaults(func=_rollout)

    p = sub.add_parser("train", help="train the config's graph with multi-turn PPO (embedded engine, or verl at scale)")
    p.add_argument("config", help="a YAML config file (see configs/; configs/verl_*.yaml for --engine verl)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. trainer.total_updates=10")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in trainer.run_dir from its latest checkpoint"
    )
    p.add_argument(
        "--init-from",
        default=None,
        metavar="RUN",
        help="start from this run's latest policy (a verlog sft run's, say), and its critic if it saved one",
    )
    p.add_argument(
        "--engine",
        choices=["embedded", "verl"],
        default="embedded",
        help="embedded: one process, CPU or one GPU (default); verl: verl's Ray trainer on many GPUs",
    )
    p.add_argument("--dry-run", action="store_true", help="with --engine verl: print the composed verl config and stop")
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "sft", help="fine-tune the config's policy on demonstrations of its graph (a warm start before RL)"
    )
    p.add_argument("config", help="a YAML config file with an sft section (see docs/warm_start.md)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. sft.epochs=2")
    p.add_argument("--resume", action="store_true", help="continue the run in sft.run_dir from its latest checkpoint")
    p.set_defaults(func=_sft)

    p = sub.add_parser(
        "eval", help="evaluate a checkpoint or an OpenAI-compatible endpoint: progression, win rate, return ± s.e."
    )
    _eval_arguments(p)

    p = sub.add_parser("play", help="play a text environment in the terminal, seeing what the model sees")
    p.add_argument("env", help="an environment name, e.g. babyai:goto, babaisai:two_room-goto_win, crafter")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--agent",
        choices=["human", "bot", "random"],
        default="human",
        help="bot: an oracle or scripted player; random: random valid actions",
    )
    p.add_argument("--max-steps", type=int, default=None)
    p.populate = _play_protocol  # the protocols live with the environments: only for `verlog play`
    p.set_defaults(func=_play)

    from verlog.serve.commands import add_serve_commands

    add_serve_commands(sub)  # serve-model (OpenAI-compatible server), serve (a graph over HTTP)

    p = sub.add_parser("models", help="prepare the offline models")
    msub = p.add_subparsers(dest="models_command", required=True)
    b = msub.add_parser("build", help="build (or find) an offline model and print its folder")
    b.add_argument("name", choices=list(MODEL_SPECS))
    b.set_defaults(func=_models)
    return parser


def _play_protocol(parser: argparse.ArgumentParser) -> None:
    from verlog.envs import PROTOCOLS

    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=PROTOCOLS[0],
        help="verlog: the training variant; balrog: BALROG's levels, text and answer rule",
    )


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    """``verlog eval``'s description and arguments (here, not beside the evaluation stack, so that
    ``verlog eval --help`` answers without loading torch)."""
    from verlog.config import EVAL_SPLITS

    p.description = (
        "Play seeded episodes of one or more configs' graphs (or a --suite) with a checkpoint or "
        "any OpenAI-compatible endpoint. Finished episodes are saved as they end; the same command "
        "resumes an interrupted run."
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="CONFIG|key=value",
        help="config files (see configs/) and key.path=value overrides applied to every config",
    )
    p.add_argument("--suite", default=None, help="a suite of configs, e.g. balrog (configs/suites/NAME.yaml) or a path")
    p.add_argument("--checkpoint", default=None, help="a run folder (its latest checkpoint) or a checkpoint folder")
    p.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None, help="the model name the endpoint serves (with --base-url)")
    p.add_argument("--api-key", default=None, help="the endpoint's key (default: $VERLOG_API_KEY, $OPENAI_API_KEY)")
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per task (default: eval.episodes; with a data section, every row of the split)",
    )
    p.add_argument(
        "--split",
        choices=EVAL_SPLITS,
        default=None,
        help="with a data section: the split whose rows are played (default: eval.split, test)",
    )
    p.add_argument("--concurrency", type=int, default=None, help="episodes at once (default: eval.concurrency)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (default: eval.temperature, else sampling.temperature)",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="most tokens per answer (default: sampling.max_tokens)")
    p.add_argument(
        "--graph-kwargs",
        default=None,
        metavar="JSON",
        help="keyword arguments of every task's build_graph, applied last (they win over the suite's "
        'and the configs\'), e.g. \'{"max_steps": 10, "max_tokens": 32}\' for a smoke run; changing '
        "a suite's settings makes its scores not its protocol's (the run says so)",
    )
    p.add_argument(
        "--balrog",
        default=None,
        metavar="PATH",
        help="your BALROG (a checkout of github.com/balrog-ai/BALROG or its installed package; default "
        "$VERLOG_BALROG): BALROG-protocol tasks use its own instructions, answer rule and invalid-answer "
        "note, and TextWorld its games; without it the wording is verlog's (the run says so)",
    )
    p.add_argument(
        "--vision",
        action="store_true",
        help="BALROG's vision protocol (its VLM leaderboard's setting, agent.max_image_history 1): "
        "BALROG-protocol tasks also show the model an image of the current observation, a PNG "
        "image_url part after its text, so the model must read images (a vision-language model)",
    )
    p.add_argument("--out", default=None, help="output folder (default: CHECKPOINT/eval, else runs/eval/MODEL)")
    p.add_argument("--fresh", action="store_true", help="discard the episodes already in the output folder")
    p.add_argument("--json", default=None, help="also write the summary JSON to this file")
    p.add_argument("--no-chart", action="store_true", help="do not draw the PNG chart (no matplotlib needed)")
    p.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    """``verlog eval``: an ``EvalError`` reaches :func:`main`, which prints it as one ``error:`` line."""
    from verlog.console import console
    from verlog.evaluation.command import run_eval

    run_eval(args, console)
    return 0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``, taking ``key=value`` overrides (and ``verlog eval``'s config files) after
    options too: ``verlog rollout CONFIG --episodes 2 sampling.temperature=0``."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        dest = next((d for d in ("overrides", "targets") if isinstance(getattr(args, d, None), list)), None)

        def positional(arg: str) -> bool:
            return not arg.startswith("-") and ("=" in arg or (dest == "targets" and Path(arg).is_file()))

        if dest is None or not all(positional(a) for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        getattr(args, dest).extend(extra)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(build_parser(), argv)
    try:
        return args.func(args)
    except user_errors() as exc:
        from verlog.console import print_error

        message = str(exc).strip()
        if type(exc).__name__ == "SlotFailureError":  # the episode's error may carry LangGraph's multi-line context
            message = message.splitlines()[0]
        print_error(message)
        return 2
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.split(".")[0] == "verlog":
            raise  # verlog's own module missing is a broken install: keep the traceback
        from verlog.console import print_error

        module = exc.name.split(".")[0]
        extra = next((e for e, modules in OPTIONAL_MODULES.items() if module in modules), None)
        where = f"pip install 'verlog[{extra}]'" if extra else f"install the package that provides {module!r}"
        print_error(
            f"this command needs the Python module {module!r}, which is not installed here ({where}; an "
            "offline GPU bundle leaves some packages out on purpose: docs/gpu.md names them)"
        )
        return 2
    except KeyboardInterrupt:
        from verlog.console import console

        console.print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
