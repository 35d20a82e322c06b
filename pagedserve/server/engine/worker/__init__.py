"""What runs a step on a device: input packing, the model runner and its phase timer, the KV
cache and its sizing."""
