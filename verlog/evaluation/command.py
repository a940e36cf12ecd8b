"""``verlog eval``: evaluate a checkpoint or any OpenAI-compatible endpoint on one or more configs.

    verlog eval CONFIG [CONFIG ...] [key=value ...] [--suite balrog]
                [--checkpoint DIR | --base-url URL --model NAME [--api-key KEY]]
                [--episodes N] [--concurrency N] [--temperature T] [--max-tokens N]
                [--graph-kwargs JSON] [--balrog PATH] [--vision] [--out DIR] [--fresh] [--json FILE] [--no-chart]

Every finished episode is appended to ``OUT/episodes.jsonl``. Run the same command again after
an interruption and the finished episodes are read back, not played again; episodes that ended
with an ``error`` (most often the model endpoint failing) are played again, while those that
ended normally, at their recursion limit, at their timeout or at an unanswered ``interrupt()``
(``interrupted``: left out of the scores, counted apart) are final. At the end:
a table of progression (0-100), win rate and return as mean ± standard error per task, per
environment and overall, ``OUT/summary.json`` and ``OUT/progression.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement

from verlog.config import json_object
from verlog.evaluation.players import EndpointModel, EngineModel
from verlog.evaluation.progress import EvalProgress
from verlog.evaluation.report import plot_progression, require_matplotlib, summary_table, write_json
from verlog.evaluation.results import EpisodeRecord, TaskResult, summarize
from verlog.evaluation.runner import EpisodeLog, EvalError, episode_seeds, play_tasks, task_spec
from verlog.evaluation.suite_protocol import (
    NO_BALROG_SOURCE,
    balrog_tasks,
    protocol_differences,
    vision_report,
    with_vision,
    wording_report,
)
from verlog.evaluation.tasks import EvalTask, plan_tasks
from verlog.rollout.interrupts import InterruptResponder

__all__ = ["run_eval"]

#: this many episodes ending in ``error`` one after another stop the run (the model is down)
MAX_CONSECUTIVE_ERRORS = 10
SUMMARY_FILE = "summary.json"
CHART_FILE = "progression.png"


def split_targets(targets: Sequence[str]) -> tuple[list[str], list[str]]:
    """Positional arguments -> (config files, ``key=value`` overrides)."""
    configs, overrides = [], []
    for item in targets:
        (overrides if "=" in item and not Path(item).is_file() else configs).append(item)
    return configs, overrides


def graph_kwargs_option(raw: str | None) -> dict[str, Any]:
    """``--graph-kwargs``: a JSON object of keyword arguments (``{}`` when not given)."""
    try:
        return json_object(raw, "--graph-kwargs (build_graph's keyword arguments)") if raw else {}
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def _balrog_source(path: str | None, tasks: list[EvalTask], console: Console) -> Any:
    """The user's BALROG (``--balrog``, else ``$VERLOG_BALROG``) for the BALROG-protocol tasks,
    which then read their wording (and TextWorld its games) from it; ``None`` without one. The
    run says which wording its BALROG-protocol tasks use."""
    from verlog.envs.balrog_source import BalrogSourceError, open_source

    playing = balrog_tasks(tasks)
    try:
        source = open_source(path, fresh=True)
    except BalrogSourceError as exc:
        raise EvalError(f"--balrog: {exc}") from None
    if not playing:
        return source
    if source is None:
        console.print(
            "[yellow]wording: verlog's (its paraphrase of BALROG's instructions, answer rule and invalid-answer "
            "note; TextWorld plays verlog's regenerated games): give --balrog PATH (or $VERLOG_BALROG) to "
            "use BALROG's own[/]",
            soft_wrap=True,
        )
        return None
    provenance = source.provenance()
    for t in playing:  # in the graph settings, so resuming never mixes episodes of other texts
        t.graph_kwargs.setdefault("balrog_source", {"path": provenance["path"], "sha256": provenance["sha256"]})
    console.print(
        f"wording: BALROG's own, read from {provenance['path']} (sha256 {provenance['sha256'][:12]})", soft_wrap=True
    )
    return source


def _vision(tasks: list[EvalTask], console: Console) -> None:
    """``--vision``: BALROG's vision protocol in the BALROG-protocol tasks (an ``EvalError`` when
    there are none); the run says so."""
    from verlog.envs.balrog_vision import IMAGE_HISTORY, SETTING

    playing = with_vision(tasks)
    if not playing:
        raise EvalError(
            "--vision is BALROG's vision protocol: no task here plays BALROG's protocol (give --suite balrog, "
            "or configs whose graph_kwargs set protocol: balrog)"
        )
    played = sorted({t.graph_kwargs[SETTING] for t in playing})  # --graph-kwargs may set its own
    history = "/".join(map(str, played))
    note = "" if played == [IMAGE_HISTORY] else f"; BALROG's is {IMAGE_HISTORY}"
    console.print(
        f"images: BALROG's vision protocol in {len(playing)} task(s), the latest observations' images "
        f"(max_image_history {history}{note}) after their text: the model must read images",
        soft_wrap=True,
    )


#: where ``verlog eval`` keeps the provenance of the BALROG files its episodes were played with
BALROG_SOURCE_FILE = "balrog_source.json"


def write_provenance(out: Path, provenance: dict[str, Any]) -> None:
    """Keep the BALROG files' provenance in the output folder, so that a later run can name the
    files that changed since (:func:`_balrog_change`)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / BALROG_SOURCE_FILE).write_text(json.dumps(provenance, indent=1))


def _balrog_change(
    out: Path, stale: list[EpisodeRecord], planned: dict[str, EvalTask], specs: dict, model: Any, source: Any
) -> str | None:
    """Why finished episodes no longer match when the BALROG files are the reason: those files
    changed since (named, from the provenance the earlier run kept), or the episodes were played
    with another wording (with or without ``--balrog``); ``None`` when it is something else."""
    from verlog.envs.balrog_source import changed_files

    record = stale[0]
    task = planned[record.episode_id]
    sampling = model.sampling(task.config)
    kept = out / BALROG_SOURCE_FILE
    earlier = json.loads(kept.read_text()) if kept.is_file() else None

    def spec_with(balrog_source: Any) -> str:
        kwargs = {k: v for k, v in task.graph_kwargs.items() if k != "balrog_source"}
        if balrog_source is not None:
            kwargs["balrog_source"] = balrog_source
        saved, task.graph_kwargs = task.graph_kwargs, kwargs
        try:
            return task_spec(task, model.label, sampling)
        finally:
            task.graph_kwargs = saved

    if task.graph_kwargs.get("protocol") != "balrog":
        return None
    played_with_earlier = earlier is not None and record.spec == spec_with(
        {"path": earlier["path"], "sha256": earlier["sha256"]}
    )
    if source is None:
        if played_with_earlier:
            return (
                f"(BALROG's own wording and games, read from {earlier['path']}; this run has no --balrog, so verlog's)"
            )
        return None
    if played_with_earlier and earlier["sha256"] != source.provenance()["sha256"]:
        names = changed_files(earlier.get("files", {}), source.provenance()["files"])
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return (
            f"(the BALROG files at {source.root} changed since they were played: {shown}; BALROG's texts or "
            "games would mix two versions)"
        )
    if record.spec == spec_with(None):
        return "(verlog's wording, without --balrog; this run reads BALROG's own)"
    return None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name or name).strip("_") or "model"


def run_eval(args: argparse.Namespace, console: Console) -> list[TaskResult]:
    """Plan, play what is not finished yet, report; returns the per-task results."""
    _check_arguments(args)
    configs, overrides = split_targets(args.targets)
    graph_kwargs = graph_kwargs_option(getattr(args, "graph_kwargs", None))
    tasks = plan_tasks(configs, overrides, suite=args.suite, split=getattr(args, "split", None))
    for t in tasks:
        if t.split is not None and t.split != t.config.eval.split:  # the config's only evaluation split
            console.print(
                f"{t.label}: data.{t.config.eval.split} is not set: playing the rows of data.{t.split}, the "
                "config's only evaluation split",
                soft_wrap=True,
            )
    # --graph-kwargs win over the suite's and the configs' own
    for t in tasks:
        t.graph_kwargs = {**t.graph_kwargs, **graph_kwargs}
    vision = bool(getattr(args, "vision", False))
    if vision:
        _vision(tasks, console)
    source = _balrog_source(getattr(args, "balrog", None), tasks, console)
    # every setting that differs from the suite's protocol is named, whatever changed it
    changed = protocol_differences(tasks, args.suite, args.episodes, vision=vision) if args.suite else []
    if changed:
        why = (
            " (balrog_source: no --balrog, so verlog's wording and regenerated TextWorld games, not BALROG's)"
            if NO_BALROG_SOURCE in changed
            else ""
        )
        console.print(
            f"[yellow]not the suite's protocol: {', '.join(changed)} differ from it{why}, so these scores are not "
            "the suite's[/]",
            soft_wrap=True,
        )
    if not args.no_chart:
        require_matplotlib()
    first = tasks[0].config
    model, out = _model_and_folder(args, tasks)

    seeds = {t.key: episode_seeds(t, args.episodes) for t in tasks}
    for task in tasks:  # a responder that cannot be loaded stops here, in one line, before any episode
        InterruptResponder.from_config(task.config.multi_turn.langgraph)
    specs = {t.key: task_spec(t, model.label, model.sampling(t.config)) for t in tasks}
    planned = {t.episode_id(s): t for t in tasks for s in seeds[t.key]}
    log = EpisodeLog(out)
    if args.fresh:
        log.clear()
    on_disk = {i: r for i, r in log.read().items() if i in planned}
    # an episode that failed with an error is played again anyway; the others must match
    stale = [r for i, r in on_disk.items() if r.status != "error" and r.spec != specs[planned[i].key]]
    if stale:
        why = _balrog_change(out, stale, planned, specs, model, source) or "(model, sampling or graph)"
        raise EvalError(
            f"{log.path} holds {len(stale)} episodes of {stale[0].label} played with other settings "
            f"{why}: use another --out folder, or --fresh to discard them"
        )
    if source is not None and balrog_tasks(tasks):
        write_provenance(out, source.provenance())
    finished = {i: r for i, r in on_disk.items() if r.status != "error"}
    retried = len(on_disk) - len(finished)
    todo = len(planned) - len(finished)
    console.print(
        f"evaluating [bold]{model.label}[/] on {len(tasks)} task(s): {len(planned)} episodes, {len(finished)} "
        f"finished earlier, {todo} to play{f' ({retried} that failed with an error are played again)' if retried else ''}"
        f"; results in {out}",
        soft_wrap=True,  # paths stay whole (and findable) when the output is not a terminal
    )
    if log.skipped_lines:
        console.print(f"[yellow]{log.skipped_lines} unreadable line(s) in {log.path} were skipped[/]")

    new = _play(model, tasks, seeds, specs, finished, log, args.concurrency or first.eval.concurrency, console)
    records = {**on_disk, **{r.episode_id: r for r in new}}
    about = _about(model, tasks, seeds, graph_kwargs, changed if args.suite else None, source, log)
    return _report(args, about, tasks, list(records.values()), out, console)


def _check_arguments(args: argparse.Namespace) -> None:
    """The options that exclude or need each other, and the episode count."""
    if args.base_url and args.checkpoint:
        raise EvalError("--checkpoint and --base-url exclude each other: evaluate one model per run")
    if bool(args.base_url) != bool(args.model):
        raise EvalError("--base-url and --model go together: the endpoint and the model name it serves")
    if args.episodes is not None and args.episodes < 1:
        raise EvalError(f"--episodes must be at least 1, got {args.episodes}")


def _model_and_folder(args: argparse.Namespace, tasks: list[EvalTask]) -> tuple[Any, Path]:
    """The model evaluated (an endpoint's, or a checkpoint on the embedded engine) and the folder
    its results go to."""
    first = tasks[0].config
    if args.base_url:
        model: Any = EndpointModel(
            args.base_url, args.model, api_key=args.api_key, temperature=args.temperature, max_tokens=args.max_tokens
        )
        out = Path(args.out or Path("runs") / "eval" / _slug(args.model))
    else:
        paths = sorted({t.config.model.path for t in tasks})
        if len(paths) > 1:
            raise EvalError(
                f"the configs name different models ({', '.join(paths)}): one model is evaluated per "
                "run; give all of them the same one, e.g. model.path=..."
            )
        try:
            model = EngineModel(first, args.checkpoint, temperature=args.temperature, max_tokens=args.max_tokens)
        except FileNotFoundError as exc:
            raise EvalError(str(exc)) from None
        out = (
            Path(args.out)
            if args.out
            else (model.folder / "eval" if model.folder else Path("runs") / "eval" / _slug(model.label))
        )

    return model, out


def sent_sampling(model: Any, task: EvalTask) -> dict[str, Any]:
    """The sampling settings the task's model calls are sent: the player's, with ``max_tokens``
    the graph's own where its ``graph_kwargs`` give one (verlog's graphs bind it to their policy
    calls, over the player's: BALROG's protocol sends 8192, whatever ``sampling.max_tokens`` says)."""
    sampling = dict(model.sampling(task.config))
    bound = task.graph_kwargs.get("max_tokens")
    if isinstance(bound, int) and not isinstance(bound, bool) and bound > 0:
        sampling["max_tokens"] = bound
    return sampling


def _about(
    model: Any,
    tasks: list[EvalTask],
    seeds: dict[Any, list[int]],
    graph_kwargs: dict[str, Any],
    changed: list[str] | None,
    source: Any,
    log: EpisodeLog,
) -> dict[str, Any]:
    """What the summary says of the run: the model, episodes, seeds or rows, sampling, settings off
    the suite's protocol (``changed``: ``None`` without a suite), BALROG's wording and the log."""
    about = {
        "model": model.label,
        "episodes": {t.label: len(seeds[t.key]) for t in tasks},
        "seeds": {t.label: [seeds[t.key][0], seeds[t.key][-1]] for t in tasks if t.split is None},
        **(
            {
                "rows": {
                    t.label: {
                        "split": t.split,
                        "source": t.config.data.split(t.split).path,
                        "rows": [seeds[t.key][0], seeds[t.key][-1]],
                    }
                    for t in tasks
                    if t.split is not None
                }
            }
            if any(t.split is not None for t in tasks)
            else {}
        ),
        "sampling": {t.label: sent_sampling(model, t) for t in tasks},
        **({"graph_kwargs_override": graph_kwargs} if graph_kwargs else {}),
        **({"not_the_suites_protocol": changed} if changed is not None else {}),
        **(wording_report(source) if balrog_tasks(tasks) else {}),
        **(vision_report(tasks) if balrog_tasks(tasks) else {}),
        "episodes_file": str(log.path),
    }
    return about


def _play(
    model: Any,
    tasks: list[EvalTask],
    seeds: dict,
    specs: dict,
    finished: dict[str, EpisodeRecord],
    log: EpisodeLog,
    concurrency: int,
    console: Console,
) -> list[EpisodeRecord]:
    totals: dict[str, int] = {}
    for t in tasks:
        totals[t.env] = totals.get(t.env, 0) + len(seeds[t.key])
    new: list[EpisodeRecord] = []

    async def run() -> None:
        try:
            with console.status(f"loading {model.label}..."):
                await model.start()
            with EvalProgress(console, totals, finished.values()) as progress:

                def on_record(record: EpisodeRecord) -> None:
                    log.append(record)
                    new.append(record)
                    progress.add(record)

                await play_tasks(
                    tasks,
                    model.chat_model,
                    seeds,
                    concurrency=concurrency,
                    skip=finished,
                    specs=specs,
                    on_record=on_record,
                    max_consecutive_errors=MAX_CONSECUTIVE_ERRORS,
                )
        finally:
            log.close()
            await model.aclose()

    saved = f"the finished episodes are saved in {log.path}: run the same command again to go on"
    if len(finished) == sum(totals.values()):
        return new
    try:
        asyncio.run(run())
    except EvalError as exc:
        if not new:
            raise
        ok = sum(r.status != "error" for r in new)
        raise EvalError(
            f"{exc}\n{len(finished) + ok} of {sum(totals.values())} episodes finished; {saved} "
            "(episodes that failed with an error are played again)"
        ) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted after {len(new)} new episodes;[/] {saved}")
        raise
    return new


def print_wide(console: Console, renderable: Any) -> None:
    """Print ``renderable``; into a file or a pipe, as wide as it needs (rich would assume 80
    columns and cut the task names: ``print(width=...)`` cannot exceed the console's width)."""
    if console.is_terminal:
        console.print(renderable)
        return
    width = Measurement.get(console, console.options.update(max_width=10_000), renderable).maximum
    saved = console.width
    console.width = max(saved, width)
    try:
        console.print(renderable)
    finally:
        console.width = saved


def _report(
    args: argparse.Namespace,
    about: dict[str, Any],
    tasks: list[EvalTask],
    records: list[EpisodeRecord],
    out: Path,
    console: Console,
) -> list[TaskResult]:
    label = about["model"]
    summary = summarize(records, [t.key for t in tasks])
    print_wide(console, summary_table(summary, f"evaluation of {label}", about.get("not_the_suites_protocol") or ()))
    written = [write_json(out / SUMMARY_FILE, summary, **about)]
    if args.json:
        written.append(write_json(args.json, summary, **about))
    if not args.no_chart:
        written.append(plot_progression(summary, out / CHART_FILE, f"{label}: progression (mean ± s.e.)"))
    console.print(f"results written to {', '.join(str(p) for p in written)}")
    errors = [r for r in records if r.status == "error"]
    paused = [r for r in records if r.status == "interrupted"]
    if paused and len(paused) + len(errors) == len(records):  # nothing scored: the graph waits for a person
        raise EvalError(
            f"every episode ({len(records)}) stopped at interrupt() or failed, nothing was scored "
            f"(first: {paused[0].error_line}); results so far in {out}"
        )
    if errors and len(errors) == len(records):  # nothing scored: a broken graph, input or engine, not a result
        raise EvalError(
            f"every episode ({len(errors)}) ended with an error, nothing was scored (first: "
            f"{errors[0].error_line}); results so far in {out}"
        )
    if paused:
        console.print(
            f"[yellow]{len(paused)} episode(s) stopped at interrupt() and are left out of the scores[/] "
            f"(first: {escape(paused[0].error_line)})"
        )
    if errors:
        console.print(
            f"[yellow]{len(errors)} episode(s) ended with an error and are left out of the scores[/] (first: "
            f"{escape(errors[0].error_line)}); run the same command again to play them again"
        )
    return summary.tasks
