"""The supervised warm start (``verlog sft``): demonstrations of the user's graph, then fine-tuning.

Demonstrations are episodes of the config's graph whose model calls someone else answered — a
scripted agent (:mod:`verlog.sft.demonstrators`), a teacher endpoint, recorded production traffic,
or the policy's own episodes kept by outcome — re-rendered through the policy's chat template
(:mod:`verlog.sft.engine`), collected and filtered (:mod:`verlog.sft.collect`), turned into rows
(:mod:`verlog.sft.dataset`) and fitted on their answer tokens (:mod:`verlog.sft.trainer`). The
checkpoints are ordinary run folders: ``verlog train --init-from``, ``verlog eval --checkpoint``
and ``verlog serve-model`` take them as they are.
"""

from verlog.sft.demonstrators import DemoCall, DemonstrationError, Demonstrator

__all__ = ["DemoCall", "DemonstrationError", "Demonstrator", "SftResult", "sft"]


def __getattr__(name: str):
    if name in ("sft", "SftResult"):
        from verlog.sft import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'verlog.sft' has no attribute {name!r}")
