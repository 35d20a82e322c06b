"""OpenAI messages as templates read them: the assistant message exactly as the openai SDK
returns it (content null, null members beside ``tool_calls``), a ``tool`` result with its
``tool_call_id`` and ``name``, text parts; and templates that read ``message['content']``
or a call's ``arguments`` unguarded render them."""

from __future__ import annotations

from openai.types.chat import ChatCompletionMessage

from pagedserve.server.tokenizer.chat_messages import template_messages
from pagedserve.server.tokenizer.chat_template import render_chat_template

SDK_REPLY = ChatCompletionMessage.model_validate({
    "role": "assistant", "content": None, "refusal": None,
    "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}],
})
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
               "content": [{"type": "text", "text": "18 C"}, {"type": "text", "text": "sun"}]}


def test_the_sdks_assistant_message_and_a_tool_result_read_as_templates_expect() -> None:
    messages = [{"role": "user", "content": "Weather in Rome?"}, SDK_REPLY.model_dump(),
                TOOL_RESULT]
    assert template_messages(messages) == [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "18 C\nsun"},
    ]


def test_an_assistant_message_may_leave_content_out() -> None:
    (message,) = template_messages([{"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "not json"}}]}])
    assert message == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}


# What the agent loop's second call failed on: a template that reads every message's content
# and writes each call's arguments with tojson (as Qwen2.5's and Llama 3.1's do).
STRICT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
    "{% for call in m.tool_calls or [] %} -> {{ call.function.name }}"
    "{{ call.function.arguments | tojson }}{% endfor %}"
    "{% if m.tool_call_id is defined %} ({{ m.tool_call_id }}){% endif %}{{ '\\n' }}"
    "{% endfor %}"
)


def test_a_template_reading_content_renders_a_call_and_its_result() -> None:
    messages = [{"role": "user", "content": "Weather in Rome?"}, SDK_REPLY.model_dump(),
                TOOL_RESULT]
    assert render_chat_template(STRICT_TEMPLATE, messages, add_generation_prompt=False) == (
        "user: Weather in Rome?\n"
        'assistant:  -> get_weather{"city": "Rome"}\n'
        "tool: 18 C\nsun (call_1)\n"
    )
