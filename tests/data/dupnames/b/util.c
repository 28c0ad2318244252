/* the other util.c */
int util_b(int x) { return x + 42; }
