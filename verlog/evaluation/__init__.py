"""Evaluation: seeded episodes of the graph files, scored as BALROG does, with standard errors.

The same graph files that are trained and served are played by a checkpoint on verlog's engine
or by any OpenAI-compatible endpoint (LangChain's ``ChatOpenAI``), and scored per episode with
BALROG's progression (0-100), success and return.

* ``tasks``    — what to play: (environment, task) pairs from configs and suites
* ``models``   — what plays: a checkpoint on the engine, or an endpoint
* ``runner``   — playing seeded episodes concurrently, one JSON line each, resumable;
  ``evaluate`` for the trainer
* ``results``  — episode records and their aggregation (task, environment, overall; mean ± s.e.)
* ``report``   — tables, summary JSON, PNG chart; ``progress`` — the live progress bars
* ``command``  — ``verlog eval``
"""

from verlog.evaluation.report import eval_table, print_results, summary_table
from verlog.evaluation.results import EpisodeRecord, GroupResult, Summary, TaskResult, mean_of_means, mean_se, summarize
from verlog.evaluation.runner import EpisodeLog, EvalError, evaluate, play_episode, play_tasks
from verlog.evaluation.tasks import EvalTask, config_tasks, plan_tasks

__all__ = [
    "EpisodeLog",
    "EpisodeRecord",
    "EvalError",
    "EvalTask",
    "GroupResult",
    "Summary",
    "TaskResult",
    "config_tasks",
    "eval_table",
    "evaluate",
    "mean_of_means",
    "mean_se",
    "play_episode",
    "play_tasks",
    "plan_tasks",
    "print_results",
    "summarize",
    "summary_table",
]
