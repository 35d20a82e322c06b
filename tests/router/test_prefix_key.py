"""The prefix key: the prefix cache's own block hash over the prompt's leading blocks."""

from __future__ import annotations

from pagedserve.common.block_hash import hash_block_tokens, hash_prefix_blocks
from pagedserve.router.prefix_key import prompt_units, routing_key
from pagedserve.server.engine.core.prefix_cache import new_block_hashes

SYSTEM = "You are a terse assistant who answers in one line. " * 6  # 306 characters


def key(path: str, body: dict) -> bytes:
    return routing_key(path, body, prefix_blocks=4, block_chars=64, block_size=16)


def test_prompts_sharing_their_leading_blocks_share_the_key() -> None:
    first = key("/v1/completions", {"prompt": SYSTEM + "What is 2+2?"})
    second = key("/v1/completions", {"prompt": SYSTEM + "Name a colour."})
    other = key("/v1/completions", {"prompt": "Another system prompt. " * 12 + "Hi"})
    assert first == second != other


def test_the_key_is_the_chained_block_hash_of_code_points() -> None:
    units = [ord(c) for c in SYSTEM]
    chain = [hash_block_tokens(None, units[:64])]
    for index in range(1, 4):
        chain.append(hash_block_tokens(chain[-1], units[index * 64:(index + 1) * 64]))
    assert key("/v1/completions", {"prompt": SYSTEM}) == chain[-1].hash_value


def test_token_id_prompts_hash_as_the_engine_prefix_cache_does() -> None:
    ids = list(range(100, 180))
    engine_hashes = new_block_hashes(ids, 16, [], None)
    assert hash_prefix_blocks(ids, 16, 4) == engine_hashes[:4]
    assert key("/v1/completions", {"prompt": ids}) == engine_hashes[3].hash_value
    # A batch goes where its first prompt is cached.
    assert key("/v1/completions", {"prompt": [ids, [1, 2, 3]]}) == engine_hashes[3].hash_value


def test_chat_and_responses_hash_their_rendered_messages() -> None:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    units, are_tokens = prompt_units("/v1/chat/completions", {"messages": messages})
    assert not are_tokens
    assert "".join(map(chr, units)) == f"system\n{SYSTEM}\nuser\nHi\n"
    chat = key("/v1/chat/completions", {"messages": messages})
    assert chat == key("/v1/responses", {"input": messages})
    assert chat == key("/v1/chat/completions", {"messages": [
        messages[0], {"role": "user", "content": "Something else entirely"}]})


def test_short_and_odd_prompts_still_get_a_key() -> None:
    assert key("/v1/completions", {"prompt": "hi"}) != key("/v1/completions", {"prompt": "yo"})
    assert key("/v1/completions", {}) == key("/v1/chat/completions", {"messages": "nonsense"})

