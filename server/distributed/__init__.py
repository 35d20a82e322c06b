"""Tensor parallelism across processes, as the PagedAttention paper draws it: one scheduler
and block manager (rank 0, the engine's own process) and N-1 workers, each holding a
Megatron-style shard of the model and its heads' share of every KV block under the same block
tables, joined in a ``torch.distributed`` group (gloo on CPU, NCCL on CUDA).

- ``group``: :class:`TensorParallelGroup`, the collectives the model's parallel layers call.
  A leaf module (torch only), so that ``server.models`` may import it.
- ``step_message``: one step's inputs packed into one int64 tensor, broadcast from rank 0.
- ``launcher``: rendezvous, worker processes, the group; ``worker``: a worker's loop;
  ``driver``: rank 0's stand-in for the model runner; ``watchdog``: worker liveness.
"""
