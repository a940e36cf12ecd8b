"""The embedded trainer: multi-turn PPO on LangGraph graphs in one process (CPU or one GPU).

``train(config)`` is ``verlog train``; ``evaluate`` / ``verlog eval`` score a policy. The loop
itself reads top to bottom in ``verlog/train/trainer.py``; the maths is in ``verlog.algo``.
"""

from verlog.train.trainer import TrainResult, train

__all__ = ["TrainResult", "train"]
