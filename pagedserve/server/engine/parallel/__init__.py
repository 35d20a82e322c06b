"""Tensor parallelism: the workers, their rendezvous, the per-step message and rank 0's runner."""
