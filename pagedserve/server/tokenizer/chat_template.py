"""Chat messages → prompt text, through the model's Jinja chat template.

Templates come from checkpoints, so they run in Jinja's immutable sandbox, set up the way
Hugging Face transformers renders them (``trim_blocks``, ``lstrip_blocks``, loop controls, a
``tojson`` that does not escape HTML, ``raise_exception`` and ``strftime_now``), so a template
renders here exactly as it does in ``tokenizer.apply_chat_template``. The variables are
``messages``, ``add_generation_prompt``, the model's named special tokens (``bos_token``,
``eos_token``, ...) and any the request adds (vLLM's ``chat_template_kwargs`` and
``documents``).

Messages are first checked and put in the form templates expect (``chat_messages``: string
contents, tool-call arguments as objects). Invalid messages, and templates that reject a
conversation (``raise_exception``), raise ``InvalidRequestError(param="messages")``.

A model without a template gets ``DEFAULT_CHAT_TEMPLATE``, ChatML::

    <|im_start|>system
    You are terse.<|im_end|>
    <|im_start|>user
    Hi<|im_end|>
    <|im_start|>assistant

one ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` block per message, then
``<|im_start|>assistant\\n`` when ``add_generation_prompt`` is true. With ``tools`` it
renders them as Hermes and Qwen templates do: a system turn listing them and the
``<tool_call>`` format, an assistant's calls as ``<tool_call>`` blocks, and ``tool`` results
inside ``<tool_response>``. With
``continue_final_message`` the prompt stops right after the last message's content (no
``<|im_end|>``), so that the model continues that message: a reply prefilled by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer.chat_messages import template_messages
from pagedserve.server.tokenizer.tokenizer_load_error import TokenizerLoadError

DEFAULT_CHAT_TEMPLATE = (
    # With tools, a system turn lists them (merged with the conversation's own system
    # message) and shows the Hermes call format that the "hermes" tool parser reads.
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- 'You may call one or more functions. Their signatures are within "
    "<tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, write a JSON object with the function name and "
    "its arguments within <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set function = call['function'] if call['function'] is defined else call %}"
    "{{- '<tool_call>\\n' + ({'name': function['name'], 'arguments': function['arguments']}"
    " | tojson) + '\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_PARAM = "messages"


def render_chat_template(
    template: str | None,
    messages: object,
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text of ``messages`` under ``template`` (``DEFAULT_CHAT_TEMPLATE`` if None).
    With ``continue_final_message`` the text ends with the last message's content, left open
    for the model to go on with (as transformers and vLLM do: whatever the template writes
    after it, such as an end-of-turn token, is cut). ``variables`` are more names for the
    template (vLLM's ``chat_template_kwargs`` and ``documents``)."""
    context = template_context(add_generation_prompt, special_tokens, variables)
    return render_validated(template, template_messages(messages), context,
                            continue_final_message)


def template_context(add_generation_prompt: bool, special_tokens: Mapping[str, str] | None,
                     variables: Mapping[str, Any] | None) -> dict[str, Any]:
    """The names a template sees besides ``messages``."""
    return {**(special_tokens or {}), **(variables or {}),
            "add_generation_prompt": add_generation_prompt}


def render_validated(template: str | None, chat: list[dict[str, Any]],
                     context: dict[str, Any], continue_final_message: bool) -> str:
    """``chat`` (``template_messages``) rendered with ``context`` (``template_context``)."""
    if continue_final_message:
        chat = [*chat[:-1], _marked_final_message(chat[-1])]
    compiled = compile_chat_template(template or DEFAULT_CHAT_TEMPLATE)
    try:
        text = compiled.render(messages=chat, **context)
    except InvalidRequestError:
        raise
    except (jinja2.TemplateError, TypeError, KeyError, ValueError) as exc:
        raise InvalidRequestError(f"the chat template failed on these messages: {exc}",
                                  param=_PARAM) from exc
    return _cut_at_mark(text) if continue_final_message else text


# Appended to the final message before rendering, then cut with everything after it. Letters,
# an underscore and a space: nothing a template escapes. The space shows whether the template
# kept the message's trailing whitespace or trimmed it.
_CONTINUE_MARK = "PAGEDSERVE_CONTINUE_HERE "


def _marked_final_message(final: dict[str, Any]) -> dict[str, Any]:
    if not final.get("content"):
        _fail("continue_final_message needs a last message with content to continue")
    return {**final, "content": final["content"] + _CONTINUE_MARK}


def _cut_at_mark(text: str) -> str:
    at = text.rfind(_CONTINUE_MARK.rstrip())
    if at < 0:
        _fail("continue_final_message: the chat template does not write the last message's "
              "content out whole, so there is no end of it to continue from")
    if text.startswith(_CONTINUE_MARK, at):
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the message: so is the cut


@lru_cache(maxsize=32)
def compile_chat_template(template: str) -> jinja2.Template:
    """``template`` compiled in the sandbox; raises jinja2.TemplateSyntaxError if malformed."""
    return _environment().from_string(template)


def checked_chat_template(template: str | None, source: str) -> str | None:
    """``template`` once it compiles; a checkpoint's broken template fails at load time."""
    if template is not None:
        try:
            compile_chat_template(template)
        except jinja2.TemplateSyntaxError as exc:
            raise TokenizerLoadError(f"{source}: the chat template does not compile: "
                                     f"{exc} (line {exc.lineno})") from exc
    return template


def _fail(message: str) -> NoReturn:
    raise InvalidRequestError(message, param=_PARAM)


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject a conversation (say, roles that do not alternate): the
    # request is at fault, not the server.
    raise InvalidRequestError(message, param=_PARAM)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
