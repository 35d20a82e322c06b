"""``pagedserve bench`` takes ``vllm bench serve`` command lines unchanged: the option names,
local Hugging Face tokenizers, the sonnet dataset, unstreamed best_of / beam search, and
streams whose tokens have no text."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np
import orjson
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from pagedserve.cli.main import main
from pagedserve.loadgen.cli import add_arguments
from pagedserve.loadgen.cli_options import settings_from_args
from pagedserve.loadgen.datasets import DatasetSpec, SampleRequest, load_dataset
from pagedserve.loadgen.hf_tokenizer import HFTokenizerCounter
from pagedserve.loadgen.request import build_payload
from pagedserve.loadgen.sonnet import BASE_PROMPT, read_poem_lines
from pagedserve.loadgen.tokenizers import TiktokenCounter

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|user|>\n{{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer over the sonnets, with a BOS and a chat template, saved as a
    Hugging Face tokenizer directory."""
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words = [line.strip() for line in read_poem_lines()] + [BASE_PROMPT, "<|user|> <|assistant|>"]
    tokenizer.train_from_iterator(words, trainers.WordLevelTrainer(
        special_tokens=["[UNK]", "<s>", "</s>"]))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>",
              "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return directory


def _settings(command: str):
    argv = shlex.split(command)
    assert argv[:3] == ["vllm", "bench", "serve"]
    parser = argparse.ArgumentParser(prog="pagedserve bench")
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv[3:]))


def test_vllm_chat_command_line_parses(hf_dir: Path) -> None:
    settings = _settings(
        f"vllm bench serve --backend openai-chat --host 10.0.0.5 --port 8001 "
        f"--endpoint /v1/chat/completions --model {hf_dir} --served-model-name llama "
        f"--tokenizer {hf_dir} --tokenizer-mode auto --trust-remote-code "
        f"--dataset-name sonnet --sonnet-input-len 550 --sonnet-output-len 150 "
        f"--sonnet-prefix-len 200 --num-prompts 100 --request-rate 4 --logprobs 2 "
        f"--top-p 0.9 --top-k 50 --min-p 0.1 --temperature 0.8 --seed 1 --save-result")
    request = settings.request
    assert request.url == "http://10.0.0.5:8001/v1/chat/completions"
    assert (request.model, settings.backend, settings.tokenizer) == ("llama", "openai-chat",
                                                                     str(hf_dir))
    assert (settings.dataset.name, settings.dataset.sonnet_input_len,
            settings.dataset.sonnet_output_len, settings.dataset.sonnet_prefix_len) == (
        "sonnet", 550, 150, 200)
    assert (settings.shape.num_prompts, settings.shape.request_rate, settings.seed) == (100, 4, 1)
    payload = build_payload(request, SampleRequest("hi", 1, 7))
    assert payload == {
        "model": "llama", "max_tokens": 7,
        "temperature": 0.8, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}], "top_p": 0.9, "top_k": 50,
        "min_p": 0.1, "logprobs": True, "top_logprobs": 2,
    }


def test_vllm_completions_command_lines_parse(hf_dir: Path) -> None:
    settings = _settings(f"vllm bench serve --backend vllm --model {hf_dir} "
                         "--endpoint /v1/completions --dataset-name random --num-prompts 5")
    assert settings.request.url == "http://127.0.0.1:8000/v1/completions"
    assert settings.tokenizer == str(hf_dir)  # --tokenizer defaults to the model directory
    assert settings.backend == "vllm" and settings.request.streams
    beams = _settings("vllm bench serve --backend openai --base-url http://h:9/v1 "
                      "--endpoint /v1/completions --model m --best-of 4 --use-beam-search "
                      "--ignore-eos")
    assert beams.request.url == "http://h:9/v1/completions"  # not /v1/v1
    assert not beams.request.streams and beams.tokenizer == "cl100k_base"
    assert build_payload(beams.request, SampleRequest("hi", 1, 7))["stream"] is False


async def test_sonnet_follows_vllms_line_arithmetic() -> None:
    counter = TiktokenCounter()
    lines = read_poem_lines()
    spec = DatasetSpec(name="sonnet", sonnet_input_len=300, sonnet_prefix_len=120,
                       sonnet_output_len=9, seed=3)
    samples = await load_dataset(spec, 12, counter)
    avg = np.mean(counter.count_sync(lines))
    (base,) = counter.count_sync([BASE_PROMPT])
    num_prefix = round((120 - base) / avg)
    num_input = round((300 - base) / avg)
    prefix = BASE_PROMPT + "".join(lines[:num_prefix])
    for sample in samples:
        assert sample.prompt.startswith(prefix) and sample.expected_output_len == 9
        drawn = sample.prompt[len(prefix):].splitlines(keepends=True)
        assert len(drawn) == num_input - num_prefix and set(drawn) <= set(lines)
        assert sample.prompt_len == counter.count_sync([sample.prompt])[0] <= 300
    assert len({s.prompt for s in samples}) == 12
    again = await load_dataset(spec, 12, counter)
    assert [s.prompt for s in again] == [s.prompt for s in samples]


async def test_sonnet_is_chat_formatted_for_completions_and_plain_for_chat(
        hf_dir: Path) -> None:
    counter = HFTokenizerCounter(str(hf_dir))
    spec = DatasetSpec(name="sonnet", sonnet_input_len=200, sonnet_prefix_len=60, seed=0)
    formatted = await load_dataset(spec, 6, counter)
    plain = await load_dataset(spec, 6, counter, chat=True)
    for f, p in zip(formatted, plain, strict=True):
        assert p.prompt.startswith(BASE_PROMPT)
        assert f.prompt == f"<s><|user|>\n{p.prompt}\n<|assistant|>\n"
        # Lengths are those of the formatted text, counted as transformers counts it: the
        # template's "<s>" and the tokenizer's own BOS both count.
        assert f.prompt_len == p.prompt_len == counter.count_sync([f.prompt])[0] <= 200
        without_bos = Tokenizer.from_file(str(hf_dir / "tokenizer.json")).encode(
            f.prompt, add_special_tokens=False)
        assert f.prompt_len == len(without_bos.ids) + 1


def test_sonnet_text_ships_with_the_package() -> None:
    lines = read_poem_lines()
    assert len(lines) == 518
    assert lines[0] == "FROM fairest creatures we desire increase,\n"
    assert "Shall I compare thee to a summer's day?\n" in lines


def _load(path: Path) -> dict:
    return orjson.loads(path.read_bytes())


def test_a_vllm_command_line_runs_end_to_end(serve, hf_dir: Path, tmp_path: Path) -> None:
    server, url = serve()
    path = tmp_path / "r.json"
    argv = shlex.split(
        f"--backend openai-chat --base-url {url}/v1 --endpoint /v1/chat/completions "
        f"--model {hf_dir} --served-model-name tiny --tokenizer {hf_dir} "
        f"--tokenizer-mode auto --trust-remote-code --dataset-name sonnet --num-prompts 4 "
        f"--sonnet-input-len 120 --sonnet-prefix-len 40 --sonnet-output-len 3 --top-p 0.9 "
        f"--top-k 5 --min-p 0.1 --logprobs 1 --disable-tqdm --result-json {path}")
    assert main(["bench", *argv]) == 0
    result = _load(path)
    assert (result["completed"], result["failed"]) == (4, 0)
    assert {s.path for s in server.served} == {"/v1/chat/completions"}
    payload = server.served[0].payload
    assert payload["model"] == "tiny" and payload["max_tokens"] == 3
    assert (payload["top_p"], payload["top_k"], payload["min_p"]) == (0.9, 5, 0.1)
    assert payload["messages"][0]["content"].startswith(BASE_PROMPT)
    assert (result["backend"], result["dataset_name"], result["tokenizer_id"]) == (
        "openai-chat", "sonnet", str(hf_dir))


@pytest.mark.parametrize("flags", [["--best-of", "2"], ["--use-beam-search", "--n", "2"]])
def test_best_of_and_beam_search_run_unstreamed(serve, tmp_path: Path, capsys,
                                                flags: list[str]) -> None:
    server, url = serve()
    path = tmp_path / "r.json"
    assert main(["bench", "--base-url", url, "--model", "tiny", "--disable-tqdm",
                 "--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "4",
                 *flags, "--result-json", str(path)]) == 0
    result = _load(path)
    assert all(s.payload["stream"] is False and "stream_options" not in s.payload
               for s in server.served)
    assert (result["completed"], result["failed"], result["streamed"]) == (3, 0, False)
    assert result["total_output_tokens"] == sum(s.completion_tokens for s in server.served)
    assert result["mean_ttft_ms"] is None and result["mean_tpot_ms"] is None
    assert result["mean_e2el_ms"] > 0
    out = capsys.readouterr().out.splitlines()
    na = [line for line in out if line.startswith("TTFT, TPOT, ITL (requests not streamed):")]
    assert len(na) == 1 and na[0].endswith(" n/a") and len(na[0]) == 64
    assert not any(line.startswith("Mean TTFT (ms)") for line in out)
    assert any(line.startswith("Mean E2EL (ms)") for line in out)


def test_tokens_without_text_are_completed_requests(serve, tmp_path: Path) -> None:
    server, url = serve(token_text="")
    path = tmp_path / "r.json"
    for endpoint in ("completions", "chat"):
        assert main(["bench", "--base-url", url, "--model", "tiny", "--disable-tqdm",
                     "--endpoint", endpoint, "--num-prompts", "3", "--random-input-len", "8",
                     "--random-output-len", "4", "--result-json", str(path)]) == 0
        result = _load(path)
        assert (result["completed"], result["failed"]) == (3, 0)
        assert result["total_output_tokens"] == 12
        assert result["mean_ttft_ms"] > 0 and result["mean_tpot_ms"] is not None
    assert len(server.served) == 6 and all(s.completed for s in server.served)
