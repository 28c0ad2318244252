"""The corpus: its format, recipes and Debian sources, extraction from builds, statistics."""
