"""Debian source packages built into corpora: their recipes, their sources, their builds."""
