"""Workers (local and Ray), atomic files, process lifetime, logged build commands, quiet
TensorFlow imports."""
