"""Tensor parallelism across processes, as the PagedAttention paper draws it: one scheduler
and block manager (rank 0, the engine's own process) and N-1 workers, each holding a
Megatron-style shard of the model and its heads' share of every KV block under the same block
tables, joined in a ``torch.distributed`` group (gloo on CPU, NCCL on CUDA).

The group object the model's layers communicate through is ``TensorParallelGroup`` in
``server.models.parallel_group`` (the models layer, below this one). This package belongs to
the engine's layer:

- ``step_message``: one step's inputs packed into one byte tensor, broadcast from rank 0.
- ``launcher``: rendezvous, worker processes, the group; ``worker``: a worker's loop;
  ``driver``: rank 0's stand-in for the model runner; ``watchdog``: worker liveness.
"""
