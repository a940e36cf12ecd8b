"""verlog: multi-turn reinforcement learning for LLM agents written as LangGraph graphs.

Data flow (one package per stage):

* ``verlog.llm``      - ``VerlogChatModel``: messages -> chat template -> prompt ids -> engine
* ``verlog.backends`` - engines: embedded transformers (dynamic batching), SGLang over HTTP
* ``verlog.rollout``  - ``TurnRecorder`` (LangChain callback) and the episode runner
* ``verlog.envs``     - text games (BabyAI, BabaIsAI, Crafter)
* ``verlog.config``   - YAML configs; ``verlog.graph_file`` - loading ``graphs/*.py``
"""

__version__ = "0.1.0"
