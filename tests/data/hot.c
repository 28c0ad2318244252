#include <stdio.h>
#include <stdlib.h>

/* More values live across the loop than four registers hold. */
__attribute__((noinline)) unsigned mix(const unsigned *v, int n) {
  unsigned a = 1, b = 2, c = 3, d = 4, e = 5, f = 6;
  for (int i = 0; i < n; i++) {
    unsigned x = v[i & 63];
    a += x ^ b;
    b = (b << 3) ^ c;
    c += d * x;
    d ^= e + x;
    e = (e >> 1) + f;
    f += a;
  }
  return a ^ b ^ c ^ d ^ e ^ f;
}

int main(int argc, char **argv) {
  unsigned v[64];
  for (int i = 0; i < 64; i++) v[i] = i * 2654435761u;
  int n = argc > 1 ? atoi(argv[1]) : 1000;
  unsigned h = 0;
  for (int call = 0; call < 100; call++) {
    v[call & 63] += h; /* each call reads other values: no call is the same as another */
    h ^= mix(v, n / 100);
  }
  printf("%u\n", h);
  return 0;
}
