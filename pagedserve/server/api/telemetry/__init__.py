"""What the server reports about itself: Prometheus metrics, traces, its log, load hints, the
throughput curve."""
