#include <stdio.h>
#include <string.h>

#include "rle.h"

int main(int argc, char **argv) {
  unsigned char out[1024];
  const char *s = argc > 1 ? argv[1] : "aaabccc";
  size_t n = rle_encode((const unsigned char *)s, strlen(s) % 512, out);
  printf("%zu bytes\n", n);
  return 0;
}
