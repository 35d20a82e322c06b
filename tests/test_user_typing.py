"""A user's script type-checks under ``mypy --strict``: the offline ``LLM``, the client and
the load generator's Python API carry precise types (PEP 561, ``py.typed``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pagedserve

USER_SCRIPT = '''
from __future__ import annotations

from pagedserve import LLM, SamplingParams
from pagedserve.client import AsyncClient, BatchRequest, PoolConfig, run_batch
from pagedserve.loadgen import BenchSettings, DatasetSpec, LoadShape, RequestSpec, bench


def offline() -> None:
    llm = LLM("tiny", max_model_len=256)
    outputs = llm.generate(["Hello", {"prompt_token_ids": [1, 2]}],
                           SamplingParams(max_tokens=8, temperature=0.0))
    text: str = outputs[0].outputs[0].text
    ids: list[int] = outputs[0].prompt_token_ids + outputs[0].outputs[0].token_ids
    tokenizer = llm.get_tokenizer()
    count: int = len(tokenizer.encode(text)) if tokenizer is not None else len(ids)
    wrong: str = outputs[0].finished
    print(count, wrong)


async def client() -> None:
    async with AsyncClient("http://127.0.0.1:8000/v1") as client:
        completion = await client.completions.create(model="m", prompt="hi", max_tokens=4)
        text: str = completion.choices[0].text
        names: list[str] = [model.id for model in await client.models.list()]
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for chunk in stream:
            print(chunk.choices[0].delta.content, text, names)
    request = BatchRequest("a", "chat", {"model": "m", "messages": []})
    results, summary = await run_batch([request], PoolConfig(["http://127.0.0.1:8000"]))
    done: int = summary.succeeded + len(results)
    wrong: str = summary.succeeded
    print(done, wrong)


async def load() -> None:
    settings = BenchSettings(RequestSpec("http://127.0.0.1:8000", "m"),
                             LoadShape(num_prompts=4, request_rate=2.0), DatasetSpec())
    out = await bench(settings)
    rate: float = out.metrics.request_throughput
    print(rate, out.result["duration"], settings.with_shape(max_concurrency=2))
    wrong: int = out.metrics.output_throughput
    print(wrong)
'''


def test_mypy_strict_sees_precise_types_in_a_user_script(tmp_path: Path) -> None:
    # Laid out as an installed package (a sys.path entry outside the project), where mypy
    # reads types only from a package that carries py.typed (PEP 561).
    site = tmp_path / "site" / "pagedserve"
    shutil.copytree(Path(pagedserve.__file__).parent, site,
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), script.name],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
    )
    # Exactly the planted mistakes, one per API: every other expression had a precise type.
    assert done.stdout.splitlines() == [
        'user.py:17: error: Incompatible types in assignment (expression has type "bool", '
        'variable has type "str")  [assignment]',
        'user.py:34: error: Incompatible types in assignment (expression has type "int", '
        'variable has type "str")  [assignment]',
        'user.py:44: error: Incompatible types in assignment (expression has type "float", '
        'variable has type "int")  [assignment]',
    ], done.stderr
