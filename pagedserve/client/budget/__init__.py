"""How much may be in flight: the token budget, its fair waiting line, rate limits, token
counts."""
