/* compiled to an object outside the package tree */
int outside(int x) { return x - 7; }
