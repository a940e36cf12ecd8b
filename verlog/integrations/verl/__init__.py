"""verlog at scale on verl 0.9 (Ray, FSDP/Megatron, SGLang/vLLM), with verl unforked.

The same ``graphs/*.py`` file, chat model and recorder as on one machine; verl supplies the
distributed engine. Where each piece lives:

* ``agent_loop``  - ``LangGraphAgentLoop`` (verl ``AgentLoopBase``, name ``verlog_langgraph``): runs
  the graph, one ``AgentLoopOutput`` per turn; persistent env slots for fixed-turn batches
* ``engine``      - ``LLMServerEngine``: verlog's ``Engine`` over verl's ``LLMServerClient``
* ``samples``     - what a per-turn verl sample carries (``verlog_*`` extra fields, bootstrap rows)
* ``layout`` / ``advantage`` - verl rows -> ``TurnBatch`` + ``TurnData`` -> the estimator registry's
  ``estimate_advantages`` (``verlog.algo.estimators``, ``algorithm.adv_estimator``) -> verl rows
* ``trainer``     - ``VerlogPPOTrainer`` (verl's sync v1 trainer, ``trainer.v1.trainer_mode: verlog``):
  verlog's advantages, Verlog's critic pre-training, and the config check (``check_verl_config``)
* ``dataset``     - verl's dataset of slot / validation-episode rows (``verlog://`` data files);
  loading it registers the agent loop in verl's workers
* ``settings`` / ``multi_turn`` - the ``verlog:`` block and the agent's ``multi_turn`` block
* ``launch`` / ``task_runner`` - ``verlog train --engine verl CONFIG``

Modules other than ``settings`` and ``dataset`` import verl (``pip install 'verlog[verl]'``).
See docs/verl.md.
"""
