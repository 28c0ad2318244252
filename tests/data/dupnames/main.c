/* compiled twice to one object; the second compile (with TWICE) is the one kept */
int main(void) { return 0; }
#ifdef TWICE
int twice(int x) { return 2 * x; }
#endif
