"""The model the peer benchmarks share: a random-weight Llama in float32 whose Hugging Face
tokenizer covers every id of its vocabulary.

Every id must decode to text and come back from the tokenizer: random weights generate any
id, and clients such as ``vllm bench serve`` build prompts by decoding random ids. A byte-level
BPE trained here on a seeded synthetic corpus fills the whole vocabulary with merges.

    python -m benchmarks.peer_model OUT_DIR        # writes config, safetensors, tokenizer
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
# Bump when the recipe changes, so an old directory is rebuilt rather than reused.
RECIPE_VERSION = 2


@dataclass(frozen=True)
class PeerModelShape:
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    intermediate_size: int = 1408
    vocab_size: int = 8192
    max_position_embeddings: int = 2048


def _corpus(seed: int, num_words: int = 60_000) -> list[str]:
    """Common English words, repeated until BPE keeps each as one token (``pagedserve bench``
    builds prompts from such words), then pseudo-words: enough distinct letter pairs for the
    rest of the vocabulary's merges."""
    from pagedserve.loadgen.pieces import word_vocabulary

    rng = random.Random(seed)
    english = [w.strip() for w in word_vocabulary()[:2500]]
    lines = [" ".join(rng.choices(english, k=16)) for _ in range(4 * len(english))]
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    weights = [26 - i for i in range(26)]
    words = ["".join(rng.choices(letters, weights, k=rng.randint(2, 9)))
             for _ in range(num_words)]
    return lines + [" ".join(words[i : i + 16]) for i in range(0, num_words, 16)]


def write_tokenizer(model_dir: Path, vocab_size: int, seed: int = 0) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"the tokenizer reached {tokenizer.get_vocab_size()} ids, "
                           f"not {vocab_size}: enlarge the corpus")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>",
    )
    fast.save_pretrained(model_dir)


def build_peer_model(model_dir: str | Path, shape: PeerModelShape | None = None,
                     seed: int = 0) -> Path:
    """Writes the checkpoint into ``model_dir`` (reused when it is already there)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = shape or PeerModelShape()
    model_dir = Path(model_dir)
    marker = model_dir / "peer_model.json"
    wanted = json.dumps(shape.__dict__ | {"seed": seed, "recipe": RECIPE_VERSION},
                        sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(
        **shape.__dict__, torch_dtype="float32", tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    write_tokenizer(model_dir, shape.vocab_size, seed)
    marker.write_text(wanted)
    return model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_peer_model(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
