"""Model weights shared by training and evaluation: the actor (a causal LM, optionally with
LoRA), the critic and the frozen reference policy (``actor_critic``), their precision (float32
master weights, autocast compute: ``precision``), the engine's own copy of the actor for
overlapped updates (``rollout_copy``), models moved to shared memory for the processes that work on
the same tensors (``shared_memory``), and the checkpoint folders
a training run writes and ``--resume`` / ``verlog eval`` read back (``checkpoint``). Neither the
trainer nor the evaluator owns them, so each imports this package and not the other."""
