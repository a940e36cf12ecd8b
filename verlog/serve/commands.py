"""The ``serve-model`` and ``serve`` commands (registered on verlog's CLI by :func:`add_serve_commands`).

    verlog serve-model CHECKPOINT [--port 8000] [--api-key K] [--served-model-name NAME] [--record DIR|URL] ...
    verlog serve GRAPH --base-url URL --model NAME [--api-key K] [--port 2024] ...

Also runnable on their own: ``python -m verlog.serve serve-model tiny``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from verlog.config import json_object

_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _json_object(text: str) -> dict[str, Any]:
    try:
        return json_object(text, "the value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ serve-model
def _fail(message: str) -> int:
    _say(f"error: {message}")
    return 2


def _serve_model(args: argparse.Namespace) -> int:
    try:
        return _run_serve_model(args)
    except FileNotFoundError as exc:  # an unknown checkpoint
        return _fail(str(exc))
    except OSError as exc:  # the port is taken (the store's and the checkpoint's errors are named above)
        return _fail(f"cannot serve on {args.host}:{args.port}: {exc}")
    except ValueError as exc:  # bad limits or dtype, a checkpoint verlog will not load (CheckpointError)
        return _fail(str(exc))
    except RuntimeError as exc:  # the trace store cannot be opened (TraceStoreError)
        return _fail(str(exc))


def _run_serve_model(args: argparse.Namespace) -> int:
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.models import MODEL_SPECS, load_processor
    from verlog.serve.openai_server import OpenAIServer, ServerLimits, run_server
    from verlog.weights.policy import find_policy, load_policy

    api_key = args.api_key or os.environ.get("VERLOG_API_KEY") or None
    admin_key = args.admin_key or os.environ.get("VERLOG_ADMIN_KEY") or None
    if not _is_loopback(args.host) and not api_key:
        _say(
            f"warning: serving on {args.host} without an API key: anyone who can reach it can use it "
            "(set --api-key or $VERLOG_API_KEY)"
        )
    source = find_policy(args.checkpoint, base=args.base_model)
    name = args.served_model_name or (
        args.checkpoint if args.checkpoint in MODEL_SPECS else Path(args.checkpoint).resolve().name
    )
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    adapters = f" with the LoRA adapters of {source.adapter}" if source.adapter else ""
    recorder = _open_recorder(args)  # before the model: a store that cannot be opened fails at once
    _say(f"loading {source.model}{adapters} on {device} ...")
    model, tokenizer = load_policy(source, dtype=args.dtype, device=device)
    processor = load_processor(source.model, tokenizer)  # a vision-language model's: image_url parts are rendered
    engine = EmbeddedEngine(model, tokenizer, max_batch_size=args.max_batch_size, seed=args.seed)

    def reload() -> tuple[Any, Any, str]:
        """The newest checkpoint of what is served (``None`` for the engine: it is the one in
        service), through the same checked loader."""
        newest = find_policy(args.reload_from or args.checkpoint, base=args.base_model)
        if newest.version == server.model_version:
            return None, tokenizer, newest.version
        _say(f"loading {newest.label} (version {newest.version}) ...")
        new_model, new_tokenizer = load_policy(newest, dtype=args.dtype, device=device)
        new_engine = EmbeddedEngine(new_model, new_tokenizer, max_batch_size=args.max_batch_size, seed=args.seed)
        return new_engine, new_tokenizer, newest.version

    limits = ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens_cap=args.max_tokens_cap,
        default_max_tokens=min(args.default_max_tokens, args.max_tokens_cap),
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout_s or None,
        max_messages=args.max_messages,
        read_timeout_s=args.read_timeout_s,
        large_body_bytes=args.large_body_bytes,
        max_large_queue=args.max_large_queue,
        max_header_bytes=args.max_header_bytes,
        max_headers=args.max_headers,
    )
    server = OpenAIServer(
        engine,
        tokenizer,
        model_name=name,
        api_key=api_key,
        limits=limits,
        chat_template_kwargs=args.chat_template_kwargs,
        host=args.host,
        port=args.port,
        model_version=source.version,
        recorder=recorder,
        reloader=reload,
        admin_key=admin_key,
        check_at_start=True,
        processor=processor,
    )

    def announce() -> None:
        recording = (
            f"; recording to {recorder.store.where} ({recorder.store.policy.privacy})" if recorder is not None else ""
        )
        _say(
            f"serving '{name}' version {source.version} at {server.base_url} (OpenAI API: /v1/chat/completions, "
            f"/v1/models){'; API key required' if api_key else ''}{recording}. Ctrl-C stops."
        )
        _say(f"open to: {server.access()}")

    try:
        run_server(server, on_start=announce)
    finally:
        server.engine.close()
        if recorder is not None:
            recorder.close()
            recorder.store.close()
    return 0


def _open_recorder(args: argparse.Namespace) -> Any:
    """The trace recorder of ``--record`` (``None`` without it)."""
    if not args.record:
        return None
    from verlog.traces import RecordingPolicy, TraceRecorder, open_store

    for flag, value in (
        ("--record-max-mb", args.record_max_mb),
        ("--record-retention-days", args.record_retention_days),
    ):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0 (0: no bound), got {value}")
    policy = RecordingPolicy(
        privacy=args.record_privacy,
        max_bytes=max(1, int(args.record_max_mb * 2**20)) if args.record_max_mb else None,
        retention_days=args.record_retention_days or None,
    )
    if args.record_write_behind_s < 0:
        raise ValueError(
            f"--record-write-behind-s must be >= 0 (0: every answer waits for its turn to be "
            f"written), got {args.record_write_behind_s}"
        )
    return TraceRecorder(open_store(args.record, policy), write_behind_s=args.record_write_behind_s)


def add_serve_model_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve-model",
        help="serve a checkpoint over an OpenAI-compatible HTTP API (chat completions, streaming, tools)",
        description="Serve CHECKPOINT on the embedded engine behind OpenAI's chat-completions API. "
        "Binds 127.0.0.1 unless --host says otherwise.",
    )
    p.add_argument(
        "checkpoint",
        help="tiny | smollm2 | a Hugging Face model folder | a training run or checkpoint "
        "folder (full or LoRA) | a LoRA adapter folder",
    )
    p.add_argument(
        "--base-model",
        default=None,
        help="with LoRA adapters: the base model (default: the one they were trained on, named in adapter_config.json)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send (default: tiny/smollm2, or the folder's name)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: $VERLOG_API_KEY); "
        "also opens feedback and, without --admin-key, reload to its holders",
    )
    p.add_argument(
        "--admin-key",
        default=None,
        help="the key of POST /v1/admin/reload, and of feedback besides the API key (default: "
        "$VERLOG_ADMIN_KEY). Without any key, feedback and reload are closed (403)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--max-batch-size", type=int, default=64, help="most requests decoded together")
    p.add_argument("--seed", type=int, default=0, help="seed of unseeded sampling")
    p.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default={},
        help="JSON passed to the chat template: use training's multi_turn.chat_template_kwargs "
        "(e.g. '{\"enable_thinking\": false}')",
    )
    _add_trace_arguments(p)
    _add_limit_arguments(p)
    p.set_defaults(func=_serve_model)
    return p


def _add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """serve-model's options for recording its traffic (``--record`` and the store's bounds)."""
    r = p.add_argument_group("traces (production traffic back to training: docs/production_loop.md)")
    r.add_argument(
        "--record",
        default=None,
        metavar="DIR|URL",
        help="record every completion token-exact in a trace store: a folder (SQLite) or a "
        "postgresql:// URL; enables POST /v1/feedback",
    )
    r.add_argument(
        "--record-privacy",
        default="full",
        choices=["full", "ids_only"],
        help="full: token ids, logprobs, the request's messages and the answer's text; ids_only: no text "
        "is stored (token ids and logprobs only)",
    )
    r.add_argument(
        "--record-max-mb",
        type=float,
        default=1024.0,
        help="the store's size bound: the least recently written episodes are deleted past it (0: none)",
    )
    r.add_argument(
        "--record-retention-days",
        type=float,
        default=30.0,
        help="episodes not written to for this long are deleted (0: kept)",
    )
    r.add_argument(
        "--record-write-behind-s",
        type=float,
        default=0.0,
        metavar="S",
        help="0 (default): an answer is sent once its turn is written to the store, so a crash loses no "
        "answered turn; S > 0: answers do not wait and turns are written every S seconds (a crash may "
        "lose the last S seconds; SIGTERM and Ctrl-C write them first)",
    )
    r.add_argument(
        "--reload-from",
        default=None,
        metavar="RUN_DIR",
        help="the training run whose newest checkpoint POST /v1/admin/reload puts in service (default: "
        "CHECKPOINT itself, when it is a run folder); requests in flight finish on the old weights",
    )


def _add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """serve-model's request limits (sizes, counts, time-outs)."""
    g = p.add_argument_group("request limits")
    g.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    g.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longest rendered prompt (default: the model's context minus one)",
    )
    g.add_argument("--max-tokens-cap", type=int, default=2048, help="largest max_tokens a request may ask")
    g.add_argument("--default-max-tokens", type=int, default=256, help="response budget when a request sets none")
    g.add_argument("--max-concurrency", type=int, default=64, help="requests generating at once")
    g.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond those (more get 429)")
    g.add_argument(
        "--large-body-bytes",
        type=int,
        default=64 << 10,
        help="bodies over this size are prepared on a lane of their own, apart from small requests (default 64 KiB)",
    )
    g.add_argument(
        "--max-large-queue",
        type=int,
        default=8,
        help="large bodies handled at once (more get 429 while small requests are still served)",
    )
    g.add_argument("--request-timeout-s", type=float, default=600.0, help="stop a generation after this (0: never)")
    g.add_argument(
        "--max-messages",
        type=int,
        default=2048,
        help="most messages in one request (checked before the prompt is rendered)",
    )
    g.add_argument(
        "--max-header-bytes",
        type=int,
        default=32 << 10,
        help="the most bytes a request's headers may take (431 above it; default 32 KiB)",
    )
    g.add_argument("--max-headers", type=int, default=100, help="the most header fields a request may have (431 above)")
    g.add_argument(
        "--read-timeout-s",
        type=float,
        default=15.0,
        help="a client must send a request's headers, then its body, within this many seconds "
        "(else the connection is closed, or answered 408); idle keep-alive connections close after it",
    )


# ------------------------------------------------------------------------------------ serve
def _serve(args: argparse.Namespace) -> int:
    from verlog.graph_file import GraphFileError
    from verlog.serve.langgraph_dev import STATE_DB, GraphServeSettings, serve_graph

    if not _is_loopback(args.host):
        _say(f"warning: serving the graph on {args.host}: LangGraph's dev server has no authentication")
    settings = GraphServeSettings(
        graph=Path(args.graph),
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key or os.environ.get("VERLOG_API_KEY") or None,
        host=args.host,
        port=args.port,
        graph_id=args.graph_id,
        graph_kwargs=args.graph_kwargs,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        seed=args.seed,
        recursion_limit=args.recursion_limit,
        jobs_per_worker=args.jobs,
        allow_blocking=args.allow_blocking,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        postgres_uri=args.postgres_uri or os.environ.get("VERLOG_POSTGRES_URI") or None,
    )

    def announce(state_dir: Path) -> None:
        threads = "Postgres ($VERLOG_POSTGRES_URI)" if settings.postgres_uri else f"{state_dir / STATE_DB}"
        _say(
            f"serving graph '{settings.name}' ({settings.graph}) with model '{args.model}' at {args.base_url} "
            f"on http://{args.host}:{args.port} (LangGraph server API; SDK: langgraph_sdk.get_client); "
            f"threads kept in {threads}"
        )

    try:
        return serve_graph(settings, announce)
    except (GraphFileError, RuntimeError) as exc:  # a broken graph file, LangGraph's server missing
        return _fail(str(exc))


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve a graph file over HTTP (LangGraph's server) with a model behind any OpenAI-compatible endpoint",
        description="Run GRAPH (a graphs/*.py file, unchanged) with LangChain's ChatOpenAI pointed at --base-url, "
        "behind LangGraph's own server (`langgraph dev`): threads with a checkpointer, runs that wait or stream "
        "graph updates.",
    )
    p.add_argument("graph", help="a graph file, e.g. graphs/calculator.py")
    p.add_argument("--base-url", required=True, help="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves")
    p.add_argument("--api-key", default=None, help="the endpoint's API key (default: $VERLOG_API_KEY)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=2024)
    p.add_argument("--graph-id", default=None, help="the id clients use (default: the file's name)")
    p.add_argument("--graph-kwargs", type=_json_object, default={}, help="JSON keyword arguments of build_graph")
    p.add_argument("--temperature", type=float, default=None, help="default temperature of every model call")
    p.add_argument("--max-tokens", type=int, default=None, help="default max_tokens of every model call")
    p.add_argument("--seed", type=int, default=None, help="sampling seed sent with every model call")
    p.add_argument(
        "--recursion-limit",
        type=int,
        default=None,
        help="LangGraph recursion limit of each run (default: the graph's own: verlog's game graphs carry "
        "the limit of their longest episode; 100 for a graph that sets none)",
    )
    p.add_argument("--jobs", type=int, default=8, help="runs executed at once")
    p.add_argument(
        "--allow-blocking",
        action="store_true",
        help="let graph nodes make blocking calls (LangGraph's dev server refuses them by default)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where langgraph.json and the server's state go, the threads' checkpoints included "
        "(threads.sqlite; default: under ~/.cache/verlog/serve)",
    )
    p.add_argument(
        "--postgres-uri",
        default=None,
        help="keep the threads' checkpoints in Postgres instead (postgresql://...; default: "
        "$VERLOG_POSTGRES_URI); needs langgraph-checkpoint-postgres",
    )
    p.set_defaults(func=_serve)
    return p


def add_serve_commands(subparsers: Any) -> None:
    """Register ``serve-model`` and ``serve`` on verlog's argparse sub-parsers."""
    add_serve_model_parser(subparsers)
    add_serve_parser(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verlog.serve {serve-model,serve} ...``"""
    parser = argparse.ArgumentParser(prog="python -m verlog.serve", description="verlog's serving commands")
    add_serve_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
