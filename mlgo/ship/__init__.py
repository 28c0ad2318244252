"""A trained policy made into artifacts: SavedModel, AOT objects, clang plugin, model card."""
