"""Tokenizer files for test checkpoints: a small byte-level BPE trained here, offline.

``write_hf_tokenizer(model_dir, vocab_size)`` writes ``tokenizer.json``,
``tokenizer_config.json`` and ``special_tokens_map.json`` that both pagedserve and transformers'
``AutoTokenizer`` load. Every id is below ``vocab_size``, so the tokens fit a tiny model's
embedding. Ids 0-5 are ``<unk> <s> </s> <pad> <|im_start|> <|im_end|>``; rare characters of
the corpus (some CJK, the emoji) stay split into single bytes, so their UTF-8 sequences
straddle tokens. ``write_tiktoken_tokenizer`` writes the ``tiktoken.json`` of the embedded
model's kind.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD, IM_START, IM_END)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

CHATML_TEMPLATE = r"""
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\n' }}
    {{- message['content'] | trim + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA2_TEMPLATE = r"""
{%- if messages[0]['role'] == 'system' -%}
    {%- set system = messages[0]['content'] -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set system = none -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message['role'] == 'user') != (loop.index0 is even) -%}
        {{- raise_exception('roles must alternate user/assistant, starting with user') -}}
    {%- endif -%}
    {%- if message['role'] == 'user' -%}
        {%- set content = message['content'] | trim -%}
        {%- if loop.first and system is not none -%}
            {%- set content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content -%}
        {%- endif -%}
        {{- bos_token + '[INST] ' + content + ' [/INST]' -}}
    {%- else -%}
        {{- ' ' + message['content'] | trim + ' ' + eos_token -}}
    {%- endif -%}
{%- endfor -%}
"""

# Meta-Llama-3-8B-Instruct's template (its header markers and end-of-turn are special ids).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
LLAMA3_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                         "<|eot_id|>")

_CORPUS = """\
PagedAttention stores the keys and values of each sequence in fixed-size blocks, so memory is
allocated on demand and wasted only in the last block of a sequence. A block table maps the
logical blocks of a sequence to physical blocks in GPU memory. When two sequences share a
prefix, they share its blocks, and copy-on-write gives each its own block when one of them
writes. The scheduler batches requests at the level of iterations: every step it runs the
decodes first, then the prefills that fit the token budget. When memory runs out, it preempts
the request that arrived last and either recomputes it later or swaps its blocks to the CPU.
The server speaks the OpenAI API, streams tokens as server-sent events, and reports its load.
The client keeps a budget of tokens in flight, so a batch job saturates the server without
overloading it. Throughput is the number of tokens generated per second across all requests;
latency is the time to the first token and the time between tokens.
Hello, world! How are you today? I am fine, thank you. The quick brown fox jumps over the lazy
dog. 0123456789 + 42 = 4242 - 4200. def step(self): return self.scheduler.schedule()
Un café crème, s'il vous plaît. Où est la gare ? Le café est très bon. Déjà vu, naïve façade.
Grüße aus München: Straße, Größe, Übung. ¿Dónde está la biblioteca? El niño come mañana.
你好世界。你好，今天天气很好。我们在北京。日本語のテキストも少しあります。
Emoji: 😀 🚀 👍🏽 — and symbols: € £ ¥ © ® ™ ✓ ∑ ∞ ≠ ≤ ≥ → ←.
"""


def train_byte_level_bpe(vocab_size: int, add_bos_token: bool = True) -> Tokenizer:
    """A byte-level BPE trained on the in-file corpus, ids < ``vocab_size``.

    With ``add_bos_token`` its post-processor starts every encoding with ``<s>``.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE} (256 bytes + "
                         f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a pair seen once stays split: rare characters keep byte tokens
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer)
    if add_bos_token:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
            special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
        )
    return tokenizer


def write_hf_tokenizer(
    model_dir: str | Path,
    vocab_size: int,
    chat_template: str | None = CHATML_TEMPLATE,
    *,
    add_bos_token: bool = True,
) -> Path:
    """Write the tokenizer files into ``model_dir`` (created if needed); returns it.

    ``chat_template=None`` writes no template. ``add_bos_token`` decides whether encoding
    with special tokens starts with ``<s>`` (set in tokenizer.json and, as transformers
    saves it, in the config).
    """
    path = Path(model_dir)
    path.mkdir(parents=True, exist_ok=True)
    train_byte_level_bpe(vocab_size, add_bos_token).save(str(path / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        # transformers saves named tokens either as text or as AddedToken objects: use both.
        "eos_token": {"__type": "AddedToken", "content": EOS, "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False,
                      "special": True},
        "unk_token": UNK,
        "pad_token": PAD,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "add_bos_token": add_bos_token,
        "add_eos_token": False,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write_json(path / "tokenizer_config.json", config)
    _write_json(path / "special_tokens_map.json",
                {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD})
    return path


def write_llama3_tokenizer(model_dir: str | Path, vocab_size: int) -> Path:
    """The trained BPE with Llama 3's special tokens added (after ``vocab_size``), its BOS and
    end of turn named, and its chat template; returns ``model_dir``."""
    path = write_hf_tokenizer(model_dir, vocab_size, LLAMA3_TEMPLATE, add_bos_token=False)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.add_special_tokens(list(LLAMA3_SPECIAL_TOKENS))
    tokenizer.save(str(path / "tokenizer.json"))
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(bos_token=LLAMA3_SPECIAL_TOKENS[0], eos_token=LLAMA3_SPECIAL_TOKENS[3])
    _write_json(path / "tokenizer_config.json", config)
    _write_json(path / "special_tokens_map.json",
                {"bos_token": LLAMA3_SPECIAL_TOKENS[0], "eos_token": LLAMA3_SPECIAL_TOKENS[3],
                 "unk_token": UNK, "pad_token": PAD})
    return path


def write_tiktoken_tokenizer(
    model_dir: str | Path, encoding: str = "cl100k_base", eos_token: str = "<|endoftext|>"
) -> Path:
    """Write ``tiktoken.json`` naming ``encoding`` into ``model_dir``; returns it."""
    path = Path(model_dir)
    path.mkdir(parents=True, exist_ok=True)
    _write_json(path / "tiktoken.json", {"encoding": encoding, "eos_token": eos_token})
    return path


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
