"""The tiny random-init test model: ``Qwen2ForCausalLM`` (~1M parameters) + a byte-level BPE tokenizer.

Everything is built in-process and deterministically (same ids, same weights on every machine),
so tests and CPU smoke runs never download anything:

* the tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a small corpus
  generated in code (English, digits and arithmetic, JSON, text-game words, ``ACTION: ...``).
  Its pipeline (NFC normalizer, the Qwen2 pre-tokenization regex, byte-level mapping) is exactly
  the one ``transformers.Qwen2Tokenizer`` rebuilds, so ``AutoTokenizer`` (which picks
  ``Qwen2Tokenizer`` for a ``qwen2`` folder and rebuilds the pipeline from vocab and merges),
  ``PreTrainedTokenizerFast`` and servers such as SGLang/vLLM all produce the same ids.
  Decoding is lossless for NFC-normalized text (input is NFC-normalized, as for Qwen models).
* special tokens ``<|endoftext|>`` (pad, bos), ``<|im_start|>``, ``<|im_end|>`` (eos); added,
  *non-special* tokens ``<tool_call>``, ``</tool_call>``, ``<tool_response>``,
  ``</tool_response>`` (kept by ``decode(..., skip_special_tokens=True)``);
* a ChatML chat template with Hermes-style tools (see :func:`chatml_tool_template`);
* ``Qwen2Config`` (hidden 128, 4 layers, 4 heads, 2 kv heads, MLP 384, tied embeddings,
  4096 positions) initialised under a fixed torch seed.

Use :func:`tiny_model_dir` to get the cached folder (built once), :func:`build_tiny_model` to
build one into a folder of your choice.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from verlog.models.quiet import quiet_progress_bars

__all__ = [
    "TINY_MODEL_NAME",
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "chatml_tool_template",
    "TOOLS_PREAMBLE",
    "TOOLS_INSTRUCTION",
    "build_tiny_tokenizer",
    "tiny_config",
    "build_tiny_model",
    "tiny_model_dir",
    "build_cached",
]

#: name of the cached folder; bump the suffix whenever the build below changes its output
TINY_MODEL_NAME = "tiny-v1"

#: special tokens, in id order (ids 0, 1, 2)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: added tokens that are *not* special (survive ``skip_special_tokens=True``)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

#: size of the trained BPE vocabulary (specials + byte alphabet + merges); the tool tokens come on top
_BPE_VOCAB_SIZE = 1532

#: the pre-tokenization regex of Qwen2 tokenizers: letters grouped, digits one by one,
#: punctuation runs, newlines and spaces (transformers' Qwen2Tokenizer rebuilds exactly this)
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


# --------------------------------------------------------------------------------------------
# chat template
# --------------------------------------------------------------------------------------------

#: text opening the tools section of the system turn (before ``<tools>``)
TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You can call the functions described below. Each one is a JSON schema on its own line "
    "inside <tools></tools>:\n"
)

#: text closing the tools section of the system turn (after ``</tools>``)
TOOLS_INSTRUCTION = (
    "\n\nTo call a function, answer with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, one block per call:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {"<argument>": <value>}}\n</tool_call>'
)

_TEMPLATE = r"""
{%- macro render_content(content) -%}
    {%- if content is none or content is undefined -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- elif content is mapping -%}
        {%- if content.text is defined -%}{{- content.text -}}{%- endif -%}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part is mapping and part.text is defined -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(first=0, system='') -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.system = render_content(messages[0].content) -%}
    {%- set ns.first = 1 -%}
{%- else -%}
    {%- set ns.system = @DEFAULT_SYSTEM@ -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if ns.system -%}
        {{- ns.system + '\n\n' -}}
    {%- endif -%}
    {{- @TOOLS_PREAMBLE@ + '<tools>\n' -}}
    {%- for tool in tools -%}
        {{- tool | tojson -}}
        {{- '\n' -}}
    {%- endfor -%}
    {{- '</tools>' + @TOOLS_INSTRUCTION@ + '<|im_end|>\n' -}}
{%- elif ns.first == 1 or ns.system -%}
    {{- '<|im_start|>system\n' + ns.system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- if message.role == 'tool' -%}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
        {%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- elif message.role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {{- '<|im_start|>assistant\n' + content -}}
        {%- if message.tool_calls -%}
            {%- for call in message.tool_calls -%}
                {%- if call.function is defined -%}
                    {%- set fn = call.function -%}
                {%- else -%}
                    {%- set fn = call -%}
                {%- endif -%}
                {%- if content or not loop.first -%}
                    {{- '\n' -}}
                {%- endif -%}
                {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
                {%- if fn.arguments is undefined or fn.arguments is none -%}
                    {{- '{}' -}}
                {%- elif fn.arguments is string -%}
                    {{- fn.arguments -}}
                {%- else -%}
                    {{- fn.arguments | tojson -}}
                {%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


_TEXT_PART = """            {%- elif part is mapping and part.text is defined -%}
                {{- part.text -}}
"""
_IMAGE_PART = """            {%- elif part is mapping and part.type in ['image', 'image_url'] -%}
                {{- @IMAGE@ -}}
"""


def _jinja_literal(text: str) -> str:
    # a JSON string (ASCII-escaped) is also a valid Jinja string literal
    return json.dumps(text, ensure_ascii=True)


def chatml_tool_template(default_system: str | None = None, image_text: str | None = None) -> str:
    """Return the ChatML + Hermes-tools Jinja chat template (written for verlog).

    It renders

    * ``system`` / ``user`` / ``assistant`` (and any other role) turns as
      ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; ``content`` may be a string, ``None`` or
      a list of OpenAI-style parts (``{"type": "text", "text": ...}``);
    * a ``tools`` list (OpenAI function JSON schemas) into the system turn, Hermes style: one
      JSON object per line inside ``<tools></tools>``, then the instruction to answer calls as
      ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
    * assistant ``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``,
      the arguments a dict or a JSON string) as those ``<tool_call>`` blocks after the content,
      one per line;
    * ``tool`` results as a user turn holding ``<tool_response>\\n...\\n</tool_response>``,
      consecutive tool messages merged into one turn;
    * ``add_generation_prompt`` as ``<|im_start|>assistant\\n``.

    Variables it does not know (``enable_thinking``, ``documents``...) are ignored.

    ``default_system`` is the system prompt used when the conversation does not start with a
    system message (SmolLM2 uses one); with ``None`` no system turn is added in that case unless
    ``tools`` are given. ``image_text``: what an image part (``{"type": "image"}`` or
    ``"image_url"``) renders as, the placeholder a vision model's processor expands (``None``: a
    text model's template, where image parts render as nothing).
    """
    template = _TEMPLATE
    if image_text is not None:
        template = template.replace(_TEXT_PART, _TEXT_PART + _IMAGE_PART.replace("@IMAGE@", _jinja_literal(image_text)))
    return (
        template.strip()
        .replace("@DEFAULT_SYSTEM@", _jinja_literal(default_system or ""))
        .replace("@TOOLS_PREAMBLE@", _jinja_literal(TOOLS_PREAMBLE))
        .replace("@TOOLS_INSTRUCTION@", _jinja_literal(TOOLS_INSTRUCTION))
    )


# --------------------------------------------------------------------------------------------
# training corpus
# --------------------------------------------------------------------------------------------

_ENGLISH = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how said
an each she which do their time if will way about many then them write would like so these her
long make thing see him two has look more day could go come did number sound no most people my
over know water than call first who may down side been now find any new work part take get place
made live where after back little only round man year came show every good me give our under name
very through just form sentence great think say help low line differ turn cause much mean before
move right boy old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near build self earth
father head stand own page should country found answer school grow study still learn plant cover
food sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run don't while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat room friend began
idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave
song measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest
correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot
system busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran
check game shape equate miss brought heat snow tire bring yes distant fill east paint language
among grand ball yet wave drop heart am present heavy dance engine position arm wide sail
material size vary settle speak weight general ice matter circle pair include divide syllable
felt perhaps pick sudden count square reason length represent art subject region energy hunt
probable bed brother egg ride cell believe fraction forest sit race window store summer train
sleep prove lone leg exercise wall catch mount wish sky board joy winter sat written wild
instrument kept glass grass cow job edge sign visit past soft fun bright gas weather month million
bear finish happy hope flower clothe strange gone jump baby eight village meet root buy raise
solve metal whether push seven paragraph third shall held hair describe cook floor either result
burn hill safe cat century consider type law bit coast copy phrase silent tall sand soil roll
temperature finger industry value fight lie beat excite natural view sense ear else quite broke
case middle kill son lake moment scale loud spring observe child straight consonant nation
dictionary milk speed method organ pay age section dress cloud surprise quiet stone tiny climb
cool design poor lot experiment bottom key iron single stick flat twenty skin smile crease hole
trade melody trip office receive row mouth exact symbol die least trouble shout except wrote seed
tone join suggest clean break lady yard rise bad blow oil blood touch grew cent mix team wire cost
lost brown wear garden equal sent choose fell fit flow fair bank collect save control decimal
""".split()

_GAME_WORDS = """
left right forward backward turn pick up drop toggle done door key ball box goal agent wall floor
lava red green blue purple yellow grey locked unlocked open closed carrying facing step grid cell
room tile empty north south east west inventory wood stone coal iron diamond sapling table
furnace pickaxe sword plant eat drink sleep noop collect place make attack zombie skeleton cow
water grass sand tree health food energy score reward episode observation action valid invalid
move go take put use examine inventory look kitchen fridge microwave countertop cabinet drawer
shelf sink bathtub toilet bed desk lamp apple bread egg potato tomato lettuce mug cup plate knife
spoon fork pan pot heat cool clean slice find mission visible nothing happens you see are in
middle of a to the and there is on your task
""".split()

_TOOLISH_WORDS = """
system user assistant tool tools function functions name arguments parameters properties type
object string integer number boolean array required description content role call calls result
results response error query search calculator expression value true false null weather city
location unit celsius fahrenheit temperature get set list add subtract multiply divide answer
final submit think reason step plan observe
""".split()

_TEMPLATES = (
    "You see a {c} {o} to the {d}.",
    "The {c} door is {s}.",
    "You are carrying a {c} key.",
    "Go to the {c} {o}, then pick it up.",
    "Your mission: open the {c} door.",
    "There is a {o} {n} steps {d} of you.",
    "ACTION: {a}",
    "ACTION: {a}\n",
    "Think step by step, then answer in the format ACTION: <action>.",
    "Valid actions: {acts}.",
    "Reward: {r}. Done: {b}.",
)


def _json_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 2 else 5)
    if kind == 0:
        return rng.randint(-1000, 100000)
    if kind == 1:
        return round(rng.uniform(-100, 100), rng.randint(1, 4))
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return " ".join(rng.choice(_ENGLISH + _GAME_WORDS) for _ in range(rng.randint(1, 4)))
    if kind == 5:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(_TOOLISH_WORDS + _GAME_WORDS): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}


def _training_corpus(seed: int = 1234) -> list[str]:
    """A deterministic corpus (~200 KB) covering the kinds of text the tests and envs use."""
    rng = random.Random(seed)
    words = _ENGLISH + _GAME_WORDS + _TOOLISH_WORDS
    actions = ["turn left", "turn right", "move forward", "pick up", "drop", "toggle", "done"]
    colors = ["red", "green", "blue", "purple", "yellow", "grey"]
    objects = ["ball", "box", "key", "door", "goal"]
    texts: list[str] = []
    # plain sentences, in a few casings
    for _ in range(2500):
        sent = [rng.choice(words) for _ in range(rng.randint(4, 16))]
        text = " ".join(sent)
        style = rng.random()
        if style < 0.7:
            text = text[0].upper() + text[1:] + rng.choice([".", ".", "?", "!", ",", ":"])
        elif style < 0.8:
            text = text.title()
        elif style < 0.85:
            text = text.upper()
        texts.append(text)
    # digits and arithmetic
    for _ in range(1500):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*/")
        res = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 3) if b else 0}[op]
        texts.append(
            rng.choice(
                [
                    f"{a} {op} {b} = {res}",
                    f"What is {a} {op} {b}? The answer is {res}.",
                    f"({a}{op}{b})={res}",
                    f"x = {a}; y = {b}; x {op} y == {res}",
                ]
            )
        )
    # JSON, tool calls and tool schemas
    for _ in range(800):
        texts.append(json.dumps(_json_value(rng), ensure_ascii=False))
    for _ in range(400):
        name = rng.choice(["calculator", "search", "get_weather", "lookup", "step", "submit"])
        args = {rng.choice(_TOOLISH_WORDS): _json_value(rng, 1) for _ in range(rng.randint(1, 3))}
        texts.append(json.dumps({"name": name, "arguments": args}))
        schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": " ".join(rng.choice(words) for _ in range(6)),
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": "string"} for k in args},
                    "required": list(args),
                },
            },
        }
        texts.append(json.dumps(schema, indent=rng.choice([None, 2])))
    # text-game observations and answers
    for _ in range(2000):
        tmpl = rng.choice(_TEMPLATES)
        texts.append(
            tmpl.format(
                c=rng.choice(colors),
                o=rng.choice(objects),
                d=rng.choice(["left", "right", "front", "north", "south", "east", "west"]),
                s=rng.choice(["locked", "open", "closed"]),
                n=rng.randint(1, 9),
                a=rng.choice(actions),
                acts=", ".join(rng.sample(actions, 4)),
                r=round(rng.random(), 2),
                b=rng.choice(["True", "False", "true", "false"]),
            )
        )
    # chat-ish lines
    for _ in range(300):
        role = rng.choice(["system", "user", "assistant", "tool"])
        texts.append(f"{role}\n" + " ".join(rng.choice(words) for _ in range(rng.randint(3, 10))))
    texts.append("You are a helpful assistant.")
    return texts


# --------------------------------------------------------------------------------------------
# tokenizer, config, model
# --------------------------------------------------------------------------------------------


def _backend_tokenizer():
    """Train the ``tokenizers.Tokenizer`` (deterministic: same corpus, same merges)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def build_tiny_tokenizer():
    """Build the tiny model's tokenizer as a ``transformers.PreTrainedTokenizerFast``."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend_tokenizer(),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        padding_side="right",
    )
    tokenizer.chat_template = chatml_tool_template()
    return tokenizer


def tiny_config(tokenizer):
    """The ``Qwen2Config`` of the tiny model for ``tokenizer`` (vocab size = ``len(tokenizer)``)."""
    from transformers import Qwen2Config

    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=4096,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        use_sliding_window=False,
        attention_dropout=0.0,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def _patch_tokenizer_config(out_dir: Path) -> None:
    """Name the tokenizer class in ``tokenizer_config.json`` so generic loaders use tokenizer.json."""
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["clean_up_tokenization_spaces"] = False
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def seeded_model(model_cls: Any, config: Any, seed: int, *, pad_id: int, eos_id: int) -> Any:
    """``model_cls(config)`` initialised under torch seed ``seed`` (the same weights on every
    machine; the caller's random state untouched), its generation config naming the pad token as
    the beginning of a sequence, in eval mode: how verlog's offline models are born."""
    import torch
    from transformers import GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    return model.eval()


def build_tiny_model(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the tiny model and tokenizer into ``out_dir`` (created if needed) and return it.

    The result depends only on ``seed`` (weights) and this file (tokenizer): two builds give the
    same token ids and bit-identical weights. Takes about a second on CPU.
    """
    from transformers import Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer)
    model = seeded_model(Qwen2ForCausalLM, config, seed, pad_id=config.pad_token_id, eos_id=config.eos_token_id)
    with quiet_progress_bars():
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _patch_tokenizer_config(out)
    return out


# --------------------------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------------------------


def build_cached(final_dir: Path, build) -> Path:
    """Return ``final_dir``, building it first with ``build(tmp_dir)`` if it does not exist.

    The build goes to a temporary sibling folder that is renamed into place, so a folder that
    exists is always complete and concurrent processes never see a half-written one (the loser
    of a race discards its copy).
    """
    final_dir = Path(final_dir)
    if final_dir.is_dir():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final_dir.name}.tmp-{uuid.uuid4().hex[:8]}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final_dir.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be readable
        try:
            os.rename(tmp, final_dir)
        except OSError:
            if not final_dir.is_dir():  # not a lost race: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final_dir


def tiny_model_dir() -> Path:
    """The cached tiny model folder ``verlog_cache_dir()/models/tiny-v1``, built on first use."""
    from . import verlog_cache_dir

    return build_cached(verlog_cache_dir() / "models" / TINY_MODEL_NAME, build_tiny_model)
