"""Rollout: running graph episodes and capturing every model call as a training turn."""

from verlog.rollout.events import REWARD_EVENT, areport_reward, report_reward
from verlog.rollout.recorder import NO_TRAIN_TAG, TurnRecorder
from verlog.rollout.runner import episode_config, run_episode, run_episodes
from verlog.rollout.slots import SlotBatch, SlotFailureError, SlotRunner
from verlog.rollout.turn import Episode, EpisodeStatus, Turn

__all__ = [
    "NO_TRAIN_TAG",
    "REWARD_EVENT",
    "Episode",
    "EpisodeStatus",
    "SlotBatch",
    "SlotFailureError",
    "SlotRunner",
    "Turn",
    "TurnRecorder",
    "areport_reward",
    "episode_config",
    "report_reward",
    "run_episode",
    "run_episodes",
]
