"""A budget that follows the server's load hints to its throughput peak."""
