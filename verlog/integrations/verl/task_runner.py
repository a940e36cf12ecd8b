"""``VerlogTaskRunner``: verl's v1 Ray task runner, registering verlog's trainer where it runs.

verl's ``main_ppo`` starts a ``TaskRunnerV1`` Ray actor that looks the trainer up by
``trainer.v1.trainer_mode`` in a registry filled at import time, *in that actor's process*.
Registering ``VerlogPPOTrainer`` in the driver is therefore not enough; this runner imports
verlog's trainer module inside the actor before verl's own ``run``. (The agent loop is registered
in each agent-loop worker through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``.)
"""

from __future__ import annotations

from typing import Any

import ray
from verl.trainer.main_ppo import TaskRunnerV1

__all__ = ["VerlogTaskRunner", "VerlogTaskRunnerClass"]


class VerlogTaskRunnerClass(TaskRunnerV1.__ray_actor_class__):  # type: ignore[name-defined, misc]
    """verl's ``TaskRunnerV1`` (the plain class), importing verlog's trainer before it runs."""

    def run(self, config: Any) -> None:
        import verlog.integrations.verl.trainer  # noqa: F401  (registers trainer_mode "verlog")

        return super().run(config)


#: the Ray actor class ``verl.trainer.main_ppo.run_ppo`` starts
VerlogTaskRunner = ray.remote(VerlogTaskRunnerClass)
