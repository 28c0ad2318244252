"""Decisions collected with the default heuristic, and the training data read from them."""
