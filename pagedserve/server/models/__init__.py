"""Model families (Llama / Mistral, Qwen2, OPT) over the paged KV cache, their config, the
loaders (safetensors directories and GGUF files) and the embedded random-weight ``tiny``
checkpoint.

Import from the submodules (``loader.load_model``, ``model_path.resolve_model``,
``config.ModelConfig``) so that importing this package stays free of torch.
"""
