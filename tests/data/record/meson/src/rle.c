#include "rle.h"

static size_t run_length(const unsigned char *in, size_t n, size_t i) {
  size_t j = i;
  while (j < n && in[j] == in[i] && j - i < 255) j++;
  return j - i;
}

size_t rle_encode(const unsigned char *in, size_t n, unsigned char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    size_t r = run_length(in, n, i);
    out[o++] = (unsigned char)r;
    out[o++] = in[i];
    i += r;
  }
  return o;
}
