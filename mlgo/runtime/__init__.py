"""Workers (local and Ray), atomic files, process lifetime, quiet TensorFlow imports."""
