/* one of two util.c, each compiled to util.o in its own directory */
int util_a(int x) { return x * x; }
