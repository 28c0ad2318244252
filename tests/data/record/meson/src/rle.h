#ifndef RLE_H
#define RLE_H
#include <stddef.h>
size_t rle_encode(const unsigned char *in, size_t n, unsigned char *out);
#endif
