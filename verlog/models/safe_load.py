"""Model folders read as untrusted input: what verlog checks before it loads weights, a tokenizer
or LoRA adapters from a folder (a training checkpoint, a downloaded model, a colleague's run).

A folder may come from anyone, so loading one never runs code and never produces a model that is
not wholly in the folder:

* **safetensors only.** Weights are read from ``model.safetensors`` (or the shards its
  ``model.safetensors.index.json`` names) with ``use_safetensors=True`` and
  ``trust_remote_code=False``; a folder holding only pickled weights (``pytorch_model.bin``, ...)
  is refused, never unpickled.
* **Every tensor, nothing else.** Before any weight is loaded, the tensor names and shapes in the
  files' headers are checked against the model the folder's ``config.json`` describes (built on
  the meta device, so it costs no memory): a missing tensor (which transformers would fill with
  random values and the server would serve), an extra one or a wrong shape is refused. Adapters
  are checked against the LoRA layers their ``adapter_config.json`` adds to the base model.
* **Nothing outside the folder.** Every file verlog (or transformers) reads must be a regular
  file inside the folder: a symbolic link that leads out of it, a device or a pipe is refused
  (but for a Hugging Face hub cache snapshot, whose files are links to its model's ``blobs/``).
* **Bounded reads.** JSON, template and tokenizer files are size-limited
  (:data:`MAX_JSON_BYTES`, :data:`MAX_TOKENIZER_BYTES`) and JSON is parsed with bounded nesting
  before transformers reads it.
* **A usable chat template.** The tokenizer must render a conversation with its chat template,
  so a broken template is refused at load instead of failing every request.

Every refusal is a :class:`CheckpointError`: one line naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "CheckpointError",
    "MAX_JSON_BYTES",
    "MAX_TOKENIZER_BYTES",
    "check_adapter_folder",
    "check_model_folder",
    "check_tensors",
    "first_line",
    "folder_file",
    "load_adapter_weights",
    "load_checked_causal_lm",
    "load_checked_tokenizer",
    "merge_adapter",
    "read_json",
    "safetensors_header",
]

#: the largest JSON or template file verlog reads from a model or checkpoint folder (configs,
#: generation and adapter settings, special tokens, chat templates, a checkpoint's state)
MAX_JSON_BYTES = 16 << 20
#: the largest tokenizer file (``tokenizer.json``, vocabularies, merges, SentencePiece models,
#: ``tokenizer_config.json``): the largest public vocabularies take about 35 MB
MAX_TOKENIZER_BYTES = 128 << 20
_TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
    }
)
#: files whose contents transformers may read as text (size-limited)
_TEXT_SUFFIXES = (".json", ".jinja", ".txt", ".model")
#: pickled weight files: never loaded
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: the LoRA settings verlog trains and loads (other PEFT methods are not served)
_ADAPTER_TYPE = "LORA"


class CheckpointError(ValueError):
    """A checkpoint or model folder verlog will not load: written by another tool or an older
    verlog, incomplete, tampered with, or not matching this run's models. The message is one line
    naming the file."""


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (tracebacks and multi-line messages stay out of errors)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


# ---------------------------------------------------------------------------------- files
def _size_limit(name: str) -> int | None:
    if name in _TOKENIZER_FILES:
        return MAX_TOKENIZER_BYTES
    return MAX_JSON_BYTES if name.endswith(_TEXT_SUFFIXES) else None


def folder_file(folder: Path, name: str, *, limit: int | None = None, required: bool = True) -> Path | None:
    """``folder/name`` if it is a regular file inside ``folder`` of at most ``limit`` bytes;
    ``None`` if it is absent and not ``required``; else :class:`CheckpointError`."""
    path = Path(folder) / name
    if not os.path.lexists(path):
        if required:
            raise CheckpointError(f"{path}: missing")
        return None
    _check_entry(Path(folder), path, limit)
    return path


def _check_entry(folder: Path, path: Path, limit: int | None) -> None:
    """A regular file or folder inside ``folder`` (links may point only inside it), a file of at
    most ``limit`` bytes."""
    try:
        target = path.resolve(strict=True)
        root = folder.resolve(strict=True)
        info = os.stat(target)
    except (OSError, RuntimeError) as exc:  # a dangling link, a loop
        raise CheckpointError(f"{path}: unreadable ({first_line(exc)})") from None
    if path.is_symlink() and not target.is_relative_to(root) and not _hub_cache_blob(root, target):
        raise CheckpointError(
            f"{path} is a symbolic link to {target}, outside {root}: verlog reads only files "
            "inside the folder (copy the real files in)"
        )
    if stat.S_ISDIR(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"{path} is not a regular file (a device, pipe or socket)")
    if limit is not None and info.st_size > limit:
        raise CheckpointError(f"{path} is {info.st_size} bytes, over verlog's limit of {limit} for this file")


def _hub_cache_blob(root: Path, target: Path) -> bool:
    """Whether ``target`` is a file of the Hugging Face hub cache's ``blobs/`` folder of the model
    whose snapshot ``root`` is (``models--org--name/snapshots/<revision>`` links every file
    there): the one place outside a folder its links may lead."""
    return root.parent.name == "snapshots" and target.parent == root.parent.parent / "blobs"


def _check_folder(folder: Path) -> list[str]:
    """Every entry of ``folder`` that verlog or transformers could read: inside it, regular, its
    JSON within size and nesting bounds. Returns the entry names."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder")
    names = sorted(os.listdir(folder))
    for name in names:
        _check_entry(folder, folder / name, _size_limit(name))
        if name.endswith(".json") and name not in ("tokenizer.json",):  # the tokenizers library parses that one
            read_json(folder / name, limit=_size_limit(name) or MAX_JSON_BYTES)
    return names


def read_json(path: Path, *, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON in ``path`` (a regular file of at most ``limit`` bytes); any problem, including
    nesting too deep for Python's parser, is one :class:`CheckpointError` line naming the file."""
    path = Path(path)
    folder_file(path.parent, path.name, limit=limit)
    try:
        return json.loads(path.read_bytes())
    except RecursionError:
        raise CheckpointError(f"{path}: unreadable (JSON nested too deep)") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{path}: unreadable ({first_line(exc)})") from None


def safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes of a safetensors file, read from its header only (never a
    pickle: a file that is not safetensors is refused)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as exc:  # SafetensorError, a truncated file, a pickle under this name
        raise CheckpointError(f"{path}: not a readable safetensors file ({first_line(exc)})") from None


# ---------------------------------------------------------------------------------- full models
def _weight_files(folder: Path, names: list[str]) -> list[Path]:
    """The safetensors files of a model folder (one file, or the shards its index names)."""
    if WEIGHTS_INDEX in names:
        index = read_json(folder / WEIGHTS_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{folder / WEIGHTS_INDEX}: no 'weight_map' of tensor names to file names")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise CheckpointError(
                    f"{folder / WEIGHTS_INDEX} names {shard!r}: shards must be .safetensors files of the folder itself"
                )
        return [folder_file(folder, shard) for shard in shards]
    if WEIGHTS_FILE in names:
        return [folder / WEIGHTS_FILE]
    pickles = [n for n in names if n.endswith(_PICKLE_SUFFIXES)]
    if pickles:
        raise CheckpointError(
            f"{folder / pickles[0]}: pickled weights, which verlog never loads (unpickling can run "
            "code); convert the model to safetensors (save_pretrained(safe_serialization=True))"
        )
    raise CheckpointError(
        f"{folder}: no {WEIGHTS_FILE} (a Hugging Face model folder with safetensors weights was expected)"
    )


def _model_config(folder: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:  # an unknown model_type, custom code, bad values
        raise CheckpointError(
            f"{folder / 'config.json'}: not a model config verlog can build ({first_line(exc)})"
        ) from None


def model_class(config: Any) -> Any:
    """The transformers auto class that builds ``config``'s model: ``AutoModelForCausalLM``, or
    ``AutoModelForImageTextToText`` for a vision-language model (Idefics3/SmolVLM, Qwen2-VL, ...)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def _expected_tensors(config: Any, where: Path) -> tuple[dict[str, tuple[int, ...]], list[set[str]]]:
    """The tensors the model of ``config`` loads (name -> shape), built on the meta device, and
    its groups of tied names (one tensor saved under any of them)."""
    import torch

    try:
        with torch.device("meta"):
            model = model_class(config).from_config(config, trust_remote_code=False)
    except Exception as exc:
        raise CheckpointError(f"{where}: describes no causal LM transformers can build ({first_line(exc)})") from None
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    by_tensor: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), set()).add(name)
    return shapes, [names for names in by_tensor.values() if len(names) > 1]


def check_tensors(
    found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], tied: list[set[str]], where: Path
) -> None:
    """Refuse tensors ``found`` in a file that are missing from, extra to or shaped unlike the
    ``expected`` ones (name -> shape; ``tied``: groups of names saved once); ``where`` names the file."""
    satisfied = set(found)
    for group in tied:  # a tied tensor is saved once, under any of its names
        if group & satisfied:
            satisfied |= group
    missing = sorted(set(expected) - satisfied)
    extra = sorted(set(found) - set(expected))
    if missing:
        raise CheckpointError(
            f"{where}: {len(missing)} of the model's tensors missing (e.g. {missing[0]}); "
            "verlog does not fill missing weights with random values"
        )
    if extra:
        raise CheckpointError(
            f"{where}: {len(extra)} tensors that are not the model's (e.g. {extra[0]}): weights of another model?"
        )
    for name, shape in found.items():
        if shape != expected[name]:
            raise CheckpointError(
                f"{where}: tensor {name} has shape {list(shape)}, the model's is {list(expected[name])}"
            )


def check_model_folder(folder: str | os.PathLike) -> None:
    """Check a Hugging Face model folder before loading it (see the module doc): its files, its
    config, and that its safetensors hold exactly the model's tensors."""
    folder = Path(folder)
    names = _check_folder(folder)
    folder_file(folder, "config.json", limit=MAX_JSON_BYTES)
    files = _weight_files(folder, names)
    found: dict[str, tuple[int, ...]] = {}
    for path in files:
        for name, shape in safetensors_header(path).items():
            if name in found:
                raise CheckpointError(f"{path}: tensor {name} is also in another shard")
            found[name] = shape
    if WEIGHTS_INDEX in names:
        listed = set(read_json(folder / WEIGHTS_INDEX)["weight_map"])
        if listed != set(found):
            odd = sorted(listed ^ set(found))[0]
            raise CheckpointError(f"{folder / WEIGHTS_INDEX}: the index and the shards disagree (e.g. on {odd})")
    expected, tied = _expected_tensors(_model_config(folder), folder / "config.json")
    check_tensors(found, expected, tied, files[0] if len(files) == 1 else folder / WEIGHTS_INDEX)


def load_checked_causal_lm(folder: str | os.PathLike, *, dtype: Any) -> Any:
    """The causal LM of ``folder`` in ``dtype`` (a ``torch.dtype``), on the CPU, after
    :func:`check_model_folder`: safetensors only, no remote code, every tensor from the folder."""
    from transformers import AutoConfig

    from verlog.models.quiet import quiet_progress_bars

    folder = Path(folder)
    check_model_folder(folder)
    try:
        auto = model_class(AutoConfig.from_pretrained(folder, trust_remote_code=False))
        with quiet_progress_bars():
            model, info = auto.from_pretrained(
                folder, dtype=dtype, use_safetensors=True, trust_remote_code=False, output_loading_info=True
            )
    except Exception as exc:
        raise CheckpointError(f"{folder}: the model does not load ({first_line(exc)})") from None
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):  # checked above; transformers agrees
        if info.get(kind):
            raise CheckpointError(f"{folder}: {kind.replace('_', ' ')} when loading: {sorted(info[kind])[0]}")
    return model


# ---------------------------------------------------------------------------------- tokenizers
def _template_file(folder: Path) -> Path:
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).exists():
            return folder / name
    return folder / "tokenizer_config.json"


def load_checked_tokenizer(folder: str | os.PathLike) -> Any:
    """The tokenizer of ``folder`` (its files checked first), refused unless its chat template
    renders a conversation.

    Folders whose ``tokenizer_config.json`` names the generic ``PreTrainedTokenizerFast`` /
    ``TokenizersBackend`` (verlog's own models) are loaded straight from ``tokenizer.json`` with
    ``PreTrainedTokenizerFast``, so the ids are exactly the ones the folder was built with
    (``AutoTokenizer`` may substitute a model-specific class that rebuilds the pipeline); other
    folders go through ``AutoTokenizer``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(folder)
    names = _check_folder(folder)
    settings = (
        read_json(folder / "tokenizer_config.json", limit=MAX_TOKENIZER_BYTES)
        if "tokenizer_config.json" in names
        else {}
    )
    cls_name = settings.get("tokenizer_class") if isinstance(settings, dict) else None
    try:
        if "tokenizer.json" in names and cls_name in ("PreTrainedTokenizerFast", "TokenizersBackend"):
            tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        else:
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:
        where = folder / "tokenizer.json" if "tokenizer.json" in names else folder
        raise CheckpointError(f"{where}: the tokenizer does not load ({first_line(exc)})") from None
    where = _template_file(folder)
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError(f"{folder}: the tokenizer has no chat template (verlog renders every prompt with it)")
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # jinja's syntax and runtime errors, raise_exception() in the template
        raise CheckpointError(
            f"{where}: the chat template does not render a conversation ({first_line(exc)})"
        ) from None
    if not isinstance(text, str) or "hi" not in text:
        raise CheckpointError(f"{where}: the chat template leaves the message out of the prompt")
    return tokenizer


# ---------------------------------------------------------------------------------- processors
#: the files that make a folder a vision-language model's (a processor beside its tokenizer)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def load_checked_processor(folder: str | os.PathLike, tokenizer: Any = None) -> Any:
    """The processor of a vision-language model's ``folder`` (image processor + the tokenizer
    :func:`load_checked_tokenizer` loads), or ``None`` for a folder without a processor config.

    transformers' ``AutoProcessor`` is tried first; where it cannot build the image processor
    (its default backend needs torchvision, which CPU installs lack), the processor class the
    folder names is built with the image processor's PIL backend (``<Name>Pil``) from the same
    settings: the same pixels for the same image. ``tokenizer``: the folder's tokenizer, already
    loaded (by :func:`load_checked_tokenizer`; loaded here without one)."""
    import transformers

    folder = Path(folder)
    names = _check_folder(folder)
    found = [n for n in PROCESSOR_FILES if n in names]
    if not found:
        return None
    tokenizer = tokenizer if tokenizer is not None else load_checked_tokenizer(folder)
    try:
        processor = transformers.AutoProcessor.from_pretrained(folder, trust_remote_code=False)
        processor.tokenizer = tokenizer  # the tokenizer verlog checked (and loads from tokenizer.json)
        return processor
    except Exception as exc:  # e.g. "requires the Torchvision library"
        auto_error = first_line(exc)
    settings = read_json(folder / found[0])
    if not isinstance(settings, dict):
        raise CheckpointError(f"{folder / found[0]}: not a JSON object")
    image = settings.get("image_processor", settings)
    cls_name, kind = (
        settings.get("processor_class"),
        image.get("image_processor_type") if isinstance(image, dict) else None,
    )
    processor_cls = getattr(transformers, str(cls_name), None)
    model_type = read_json(folder / "config.json").get("model_type") if "config.json" in names else None
    image_cls = _pil_image_processor(str(model_type), str(kind))
    if processor_cls is None or image_cls is None:
        raise CheckpointError(f"{folder}: the processor does not load ({auto_error})")
    extra = {k: v for k, v in settings.items() if k not in ("image_processor", "processor_class")}
    if "image_processor" not in settings:
        extra = {}
    try:
        image_processor = image_cls(**{k: v for k, v in image.items() if k != "image_processor_type"})
        return processor_cls(
            image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template, **extra
        )
    except Exception as exc:
        raise CheckpointError(f"{folder}: the processor does not load ({first_line(exc)}; {auto_error})") from None


def _pil_image_processor(model_type: str, kind: str) -> Any:
    """transformers' PIL-backend class (``<kind>Pil``) of a ``model_type`` model's image
    processor ``kind``, if it has one."""
    import importlib

    try:
        module = importlib.import_module(f"transformers.models.{model_type}.image_processing_pil_{model_type}")
    except ImportError:
        return None
    return getattr(module, f"{kind}Pil", None)


# ---------------------------------------------------------------------------------- LoRA adapters
def check_adapter_folder(folder: str | os.PathLike) -> dict[str, Any]:
    """Check a LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``,
    what training with ``actor.lora.rank > 0`` saves); returns its settings."""
    folder = Path(folder)
    names = _check_folder(folder)
    if ADAPTER_WEIGHTS not in names:
        pickles = [n for n in names if n.endswith(_PICKLE_SUFFIXES)]
        raise CheckpointError(
            f"{folder / (pickles[0] if pickles else ADAPTER_WEIGHTS)}: "
            + ("pickled adapter weights, which verlog never loads" if pickles else "missing")
        )
    settings = read_json(folder_file(folder, ADAPTER_CONFIG, limit=MAX_JSON_BYTES))
    if not isinstance(settings, dict) or settings.get("peft_type") != _ADAPTER_TYPE:
        kind = settings.get("peft_type") if isinstance(settings, dict) else None
        raise CheckpointError(
            f"{folder / ADAPTER_CONFIG}: not LoRA adapter settings (peft_type {kind!r}, expected {_ADAPTER_TYPE!r})"
        )
    safetensors_header(folder / ADAPTER_WEIGHTS)
    return settings


def load_adapter_weights(peft_model: Any, folder: str | os.PathLike) -> None:
    """Load ``folder``'s adapter weights into ``peft_model`` (a PEFT model with the same LoRA
    layers), after checking that the file holds exactly its adapter tensors, with their shapes."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    path = folder_file(folder, ADAPTER_WEIGHTS)
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(peft_model).items()}
    check_tensors(safetensors_header(path), expected, [], path)
    try:
        result = set_peft_model_state_dict(peft_model, load_file(path))
    except Exception as exc:
        raise CheckpointError(f"{path}: the adapters do not load ({first_line(exc)})") from None
    if getattr(result, "unexpected_keys", None):
        raise CheckpointError(f"{path}: tensors the adapters do not have (e.g. {result.unexpected_keys[0]})")


def merge_adapter(base: Any, folder: str | os.PathLike) -> Any:
    """``base`` (a causal LM) with the LoRA adapters of ``folder`` merged into its weights: what
    evaluation and serving run (the same weights, so the same answers)."""
    from peft import LoraConfig, get_peft_model

    folder = Path(folder)
    settings = check_adapter_folder(folder)
    try:
        config = LoraConfig.from_peft_type(**{**settings, "inference_mode": True})
        peft_model = get_peft_model(base, config)
    except Exception as exc:  # settings of another peft version, target modules the base lacks
        raise CheckpointError(
            f"{folder / ADAPTER_CONFIG}: the adapters do not fit this base model ({first_line(exc)})"
        ) from None
    load_adapter_weights(peft_model, folder)
    return peft_model.merge_and_unload().eval()
