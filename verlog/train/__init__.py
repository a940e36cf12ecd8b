"""The embedded trainer: multi-turn PPO on LangGraph graphs in one process (CPU or one GPU).

``train(config)`` is ``verlog train`` (policies are scored by ``verlog.evaluation``). The loop
itself reads top to bottom in ``verlog/train/trainer.py``; the maths is in ``verlog.algo``.
"""

from verlog.train.trainer import TrainResult, train

__all__ = ["TrainResult", "train"]
