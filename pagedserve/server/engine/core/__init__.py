"""The scheduler and its state: queues, sequences and their outputs, block tables, ref
counts, copy-on-write, prefix cache."""
