/* A growable byte buffer: small helpers the inliner has to weigh. */
#include <stdlib.h>
#include <string.h>

struct strbuf { char *data; size_t len, cap; };

static int grow(struct strbuf *sb, size_t need) {
  if (sb->len + need <= sb->cap) return 0;
  size_t cap = sb->cap ? sb->cap : 16;
  while (cap < sb->len + need) cap *= 2;
  char *p = realloc(sb->data, cap);
  if (!p) return -1;
  sb->data = p;
  sb->cap = cap;
  return 0;
}

int strbuf_append(struct strbuf *sb, const char *s, size_t n) {
  if (grow(sb, n + 1)) return -1;
  memcpy(sb->data + sb->len, s, n);
  sb->len += n;
  sb->data[sb->len] = 0;
  return 0;
}

int strbuf_putc(struct strbuf *sb, char c) { return strbuf_append(sb, &c, 1); }

static char hexdigit(unsigned v) { return "0123456789abcdef"[v & 15]; }

int strbuf_hex(struct strbuf *sb, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (strbuf_putc(sb, hexdigit(p[i] >> 4)) || strbuf_putc(sb, hexdigit(p[i]))) return -1;
  }
  return 0;
}

int strbuf_int(struct strbuf *sb, long v) {
  char tmp[24];
  int i = 0, neg = v < 0;
  unsigned long u = neg ? -(unsigned long)v : (unsigned long)v;
  do { tmp[i++] = (char)('0' + u % 10); u /= 10; } while (u);
  if (neg && strbuf_putc(sb, '-')) return -1;
  while (i) if (strbuf_putc(sb, tmp[--i])) return -1;
  return 0;
}

void strbuf_free(struct strbuf *sb) { free(sb->data); sb->data = 0; sb->len = sb->cap = 0; }
