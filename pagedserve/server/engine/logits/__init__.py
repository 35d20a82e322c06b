"""From logits to sampled tokens: the step's sampling plan, beams and prompt logprobs."""
