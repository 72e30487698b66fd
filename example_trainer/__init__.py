"""The example GRPO trainer: closes the RL loop against the trajectory API."""
