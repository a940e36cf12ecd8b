"""verlog: multi-turn reinforcement learning for LLM agents written as LangGraph graphs.

Data flow (one package per stage):

* ``verlog.data``         - task rows from files (JSONL, Parquet, CSV, datasets), split and ordered
* ``verlog.episodes``     - what an episode plays (a row or ``make_input(seed)``) and how it is scored
* ``verlog.envs``         - the games as text (BabyAI, BabaIsAI, Crafter, TextWorld, MiniHack, NetHack, Sokoban)
* ``verlog.llm``          - ``VerlogChatModel``: messages -> chat template -> prompt ids -> engine
* ``verlog.backends``     - engines: embedded transformers (dynamic batching), SGLang over HTTP
* ``verlog.models``       - the offline models: built, found and loaded
* ``verlog.rollout``      - ``TurnRecorder`` (LangChain callback), the episode runner, the env slots
* ``verlog.rewards``      - reward functions and LLM judges run on finished episodes
* ``verlog.algo``         - advantage estimators (dual-discount GAE, ...), PPO losses (pure torch)
* ``verlog.train``        - the embedded trainer
* ``verlog.sft``          - the warm start: demonstrations of the graph (a bot, a teacher, traces, the policy's own successes), then supervised fine-tuning
* ``verlog.weights``      - actor, critic, reference and checkpoint folders
* ``verlog.evaluation``   - ``verlog eval``: seeded episodes, BALROG progression with standard errors
* ``verlog.integrations`` - the same graphs and algorithm inside verl
* ``verlog.serve``        - production: an OpenAI-compatible model server, graphs behind LangGraph's server
* ``verlog.traces``       - served completions recorded token-exact, feedback as rewards
* ``verlog.testing``      - test doubles for tests and benchmarks (nothing in the real paths imports it)

Beside them: ``verlog.config`` (YAML configs), ``verlog.agent`` (a config into an agent),
``verlog.graph_file`` (loading ``graphs/*.py``), ``verlog.cli``, ``verlog.registry``,
``verlog.step_info``, ``verlog.tokens``, ``verlog.console``, ``verlog.local_server``, ``verlog.cache``
(where built models and games are kept).
"""

__version__ = "0.1.0"
