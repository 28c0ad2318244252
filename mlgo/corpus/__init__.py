"""The corpus: its format, the recording wrappers and extraction from builds (the user's own
too), its splits, compiling one module, statistics."""
