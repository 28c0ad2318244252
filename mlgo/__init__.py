"""mlgo: learned policies for compiler decisions (LLVM inliner, register allocator, XLA tiles)."""
