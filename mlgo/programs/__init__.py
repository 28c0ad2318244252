"""Real programs built twice, plain and with the policy, and their measurement."""
