"""Architecture name (config.json ``architectures[0]``) → model class."""

from __future__ import annotations

from pagedserve.server.models.base import CausalLM
from pagedserve.server.models.llama import LlamaForCausalLM
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.opt import OPTForCausalLM
from pagedserve.server.models.phi3 import Phi3ForCausalLM
from pagedserve.server.models.qwen2 import Qwen2ForCausalLM
from pagedserve.server.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    # Mistral is Llama's layout; its sliding window is honoured by capping max_model_len.
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "OPTForCausalLM": OPTForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def get_model_class(architecture: str) -> type[CausalLM]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ModelLoadError(
            f"unsupported architecture {architecture!r}; supported: "
            f"{', '.join(supported_architectures())}"
        ) from None
