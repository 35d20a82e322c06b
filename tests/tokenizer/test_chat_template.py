"""Chat templates render as transformers renders them; bad messages are clear request errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer import Tokenizer, TokenizerLoadError, load_tokenizer
from pagedserve.server.tokenizer.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat_template
from tests.tokenizer_files import CHATML_TEMPLATE, LLAMA2_TEMPLATE, write_hf_tokenizer

# Loop controls, namespaces, tojson (no HTML escaping, non-ASCII kept), special-token variables.
JSON_TEMPLATE = r"""
{%- set ns = namespace(turns=0) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'system' %}{% continue %}{% endif -%}
    {%- set ns.turns = ns.turns + 1 -%}
    [{{ ns.turns }}] {{ message | tojson }}
{% endfor -%}
{%- if add_generation_prompt %}{{ bos_token }}{{ pad_token }}{% endif %}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  What is <b>&</b>?  "},
        {"role": "assistant", "content": "HTML, 你好 😀"},
        {"role": "user", "content": "Thanks\nbye"},
    ],
    [
        {"role": "user", "content": "Ping", "name": "alice"},
        {"role": "assistant", "content": "Pong"},
        {"role": "user", "content": "Again"},
    ],
]


@pytest.fixture(scope="module")
def template_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: write_hf_tokenizer(tmp_path_factory.mktemp(name), 300, chat_template=template)
        for name, template in (("chatml", CHATML_TEMPLATE), ("llama2", LLAMA2_TEMPLATE),
                               ("json", JSON_TEMPLATE))
    }


@pytest.fixture(scope="module")
def tokenizer_pairs(template_dirs: dict[str, Path],
                    auto_tokenizer_for: Callable[[Path], object]) -> dict[str, tuple]:
    return {name: (load_tokenizer(path), auto_tokenizer_for(path))
            for name, path in template_dirs.items()}


@pytest.mark.parametrize("name", ["chatml", "llama2", "json"])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_matches_transformers(
    tokenizer_pairs: dict[str, tuple], name: str, conversation: list[dict[str, str]],
    add_generation_prompt: bool,
) -> None:
    ours, reference = tokenizer_pairs[name]
    expected = reference.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(conversation, add_generation_prompt) == expected


def test_llama2_rendering_is_exact(template_dirs: dict[str, Path]) -> None:
    rendered = load_tokenizer(template_dirs["llama2"]).apply_chat_template(CONVERSATIONS[1])
    assert rendered == (
        "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nWhat is <b>&</b>? [/INST] "
        "HTML, 你好 😀 </s><s>[INST] Thanks\nbye [/INST]"
    )


def test_template_exception_is_a_request_error(template_dirs: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(template_dirs["llama2"])
    with pytest.raises(InvalidRequestError) as info:
        tokenizer.apply_chat_template([{"role": "assistant", "content": "I start"}])
    assert str(info.value) == "roles must alternate user/assistant, starting with user"
    assert info.value.param == "messages"


def test_default_template_exact_output(hf_tokenizer: Tokenizer) -> None:
    assert hf_tokenizer.chat_template == CHATML_TEMPLATE
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": " Hi "}]
    expected = ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                "<|im_start|>user\n Hi <|im_end|>\n")
    assert render_chat_template(None, messages, add_generation_prompt=False) == expected
    assert render_chat_template(None, messages) == expected + "<|im_start|>assistant\n"
    assert render_chat_template(DEFAULT_CHAT_TEMPLATE, messages) == render_chat_template(
        None, messages)


def test_model_without_template_uses_the_default(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_hf_tokenizer(tmp_path, 300, chat_template=None))
    assert tokenizer.chat_template is None
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_text_parts_are_joined_null_content_is_empty_and_null_keys_dropped() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "one"},
                                     {"type": "text", "text": "two"}], "name": None},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": '{"x": 1}'}}]},
    ]
    template = "{% for m in messages %}{{ m | tojson }};{% endfor %}"
    assert render_chat_template(template, messages) == (
        '{"role": "user", "content": "one\\ntwo"};'
        '{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", '
        '"function": {"name": "f", "arguments": {"x": 1}}}]};'
    )


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ("hello", "messages must be a list, got str"),
        ({"role": "user"}, "messages must be a list, got dict"),
        ([], "messages must contain at least one message, got 0"),
        ([["user", "hi"]], "messages[0] must be an object, got list"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], "messages[1] is missing 'role'"),
        ([{"role": "robot", "content": "a"}],
         "messages[0].role must be one of assistant, developer, system, tool, user, "
         "got 'robot'"),
        ([{"role": "user"}], "messages[0] is missing 'content'"),
        ([{"role": "user", "content": None}], "messages[0] is missing 'content'"),
        ([{"role": "tool", "tool_call_id": "c1"}], "messages[0] is missing 'content'"),
        ([{"role": "user", "content": "a", "tool_calls": []}],
         "messages[0].tool_calls is for assistant messages, got role 'user'"),
        ([{"role": "assistant", "tool_calls": {"id": "c1"}}],
         "messages[0].tool_calls must be a list, got dict"),
        ([{"role": "assistant", "tool_calls": [{"id": "c1"}]}],
         "messages[0].tool_calls[0].function must be an object with a name and arguments"),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
         "messages[0].tool_calls[0].function.name must be a non-empty string, got None"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}],
         "messages[0].tool_calls[0].function.arguments must be a JSON object's text, got int"),
        ([{"role": "user", "content": 5}],
         "messages[0].content must be a string or a list of text parts, got int"),
        ([{"role": "user", "content": ["hi"]}],
         "messages[0].content[0] must be an object, got str"),
        ([{"role": "user", "content": [{"type": "text", "text": "a"},
                                       {"type": "image_url", "image_url": {"url": "x"}}]}],
         "messages[0].content[1].type must be 'text', got 'image_url'"),
        ([{"role": "user", "content": [{"type": "text"}]}],
         "messages[0].content[0].text must be a string, got NoneType"),
    ],
)
def test_invalid_messages(hf_tokenizer: Tokenizer, messages: object, error: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        hf_tokenizer.apply_chat_template(messages)
    assert (str(info.value), info.value.param) == (error, "messages")


def test_template_runtime_failure_is_a_request_error() -> None:
    with pytest.raises(InvalidRequestError) as info:
        render_chat_template("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "a"}])
    assert str(info.value) == ('the chat template failed on these messages: can only '
                               'concatenate str (not "int") to str')


def test_sandbox_refuses_to_mutate_messages() -> None:
    messages = [{"role": "user", "content": "a"}]
    with pytest.raises(InvalidRequestError) as info:
        render_chat_template("{% set _ = messages.append(1) %}x", messages)
    assert str(info.value) == ("the chat template failed on these messages: access to attribute "
                               "'append' of 'list' object is unsafe.")
    assert messages == [{"role": "user", "content": "a"}]


def test_broken_template_fails_at_load(tmp_path: Path) -> None:
    write_hf_tokenizer(tmp_path, 300, chat_template="{% for m in messages %}")
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: the chat template does not compile: "
                                      "Unexpected end of template.")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == "{% for m in messages %}"


# Replies to continue: trailing whitespace (kept by ChatML, trimmed by the Llama 2 template)
# and characters a template might escape. (transformers refuses a template that does not
# name "content", such as JSON_TEMPLATE, and renders text parts as a list's repr.)
CONTINUED = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}],
    [*CONVERSATIONS[1][:2], {"role": "assistant", "content": "HTML, 你好 😀 and "}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A: \"1 < 2\" "}],
]


@pytest.mark.parametrize("name", ["chatml", "llama2"])
@pytest.mark.parametrize("conversation", CONTINUED)
def test_continue_final_message_matches_transformers(
    tokenizer_pairs: dict[str, tuple], name: str, conversation: list[dict[str, object]],
) -> None:
    ours, reference = tokenizer_pairs[name]
    expected = reference.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=False,
                                             continue_final_message=True)
    assert ours.apply_chat_template(conversation, False, continue_final_message=True) == expected


def test_continue_final_message_leaves_the_turn_open() -> None:
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello,"},
                                                  {"type": "text", "text": "I am "}]}]
    assert render_chat_template(None, messages, add_generation_prompt=False,
                                continue_final_message=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello,\nI am ")
    # A template that escapes the content (tojson) is cut inside the escaped text.
    assert render_chat_template(JSON_TEMPLATE, messages, add_generation_prompt=False,
                                continue_final_message=True) == (
        '[1] {"role": "user", "content": "Hi"}\n'
        '[2] {"role": "assistant", "content": "Hello,\\nI am ')


@pytest.mark.parametrize(("template", "messages", "error"), [
    (None, [{"role": "user", "content": "Hi"},
            {"role": "assistant",
             "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]}],
     "continue_final_message needs a last message with content to continue"),
    (None, [{"role": "user", "content": ""}],
     "continue_final_message needs a last message with content to continue"),
    ("{% for m in messages %}{{ m['role'] }};{% endfor %}",
     [{"role": "user", "content": "Hi"}],
     "continue_final_message: the chat template does not write the last message's content "
     "out whole, so there is no end of it to continue from"),
])
def test_continue_final_message_errors(template: str | None, messages: list, error: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        render_chat_template(template, messages, add_generation_prompt=False,
                             continue_final_message=True)
    assert (str(info.value), info.value.param) == (error, "messages")


VARIABLES_TEMPLATE = (
    "{% for d in documents or [] %}[doc {{ d['title'] }}: {{ d['text'] }}]\n{% endfor %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% if not enable_thinking %} <no-think>"
    "{% endif %}{% endif %}")


def test_template_variables_match_transformers(
    tmp_path: Path, auto_tokenizer_for: Callable[[Path], object],
) -> None:
    # vLLM's chat_template_kwargs and documents reach the template as names of their own.
    path = write_hf_tokenizer(tmp_path, 300, chat_template=VARIABLES_TEMPLATE)
    ours, reference = load_tokenizer(path), auto_tokenizer_for(path)
    documents = [{"title": "KV", "text": "blocks"}, {"title": "LRU", "text": "evicts"}]
    messages = CONVERSATIONS[0]
    for variables in ({}, {"enable_thinking": True}, {"documents": documents}):
        expected = reference.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True, **variables)
        assert ours.apply_chat_template(messages, True, variables=variables) == expected
    assert ours.apply_chat_template(messages, True, variables={"documents": documents}) == (
        "[doc KV: blocks]\n[doc LRU: evicts]\nuser: Hi\nassistant: <no-think>")
