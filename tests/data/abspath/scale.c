/* compiled with an absolute -o, as freetype and lcms2 build */
int scale(int x) { return 3 * x + 1; }
