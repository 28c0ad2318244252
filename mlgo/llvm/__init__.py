"""Talking to clang: the toolchain, LLVM's log format, the interactive channel, object sizes."""
