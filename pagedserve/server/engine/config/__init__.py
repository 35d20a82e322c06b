"""The engine's arguments and the validated configs they make."""
