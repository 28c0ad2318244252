/* Word counter over stdin using the buffer and the map. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct strbuf { char *data; size_t len, cap; };
struct entry { const char *key; int value; };
struct map { struct entry *slots; size_t cap, count; };
int strbuf_append(struct strbuf *, const char *, size_t);
int strbuf_int(struct strbuf *, long);
void strbuf_free(struct strbuf *);
int map_incr(struct map *, const char *);

static int is_word(int c) { return isalnum(c) || c == '_'; }

static char *next_word(const char **p) {
  const char *s = *p;
  while (*s && !is_word((unsigned char)*s)) s++;
  const char *b = s;
  while (*s && is_word((unsigned char)*s)) s++;
  *p = s;
  if (s == b) return NULL;
  char *w = malloc((size_t)(s - b) + 1);
  if (w) { memcpy(w, b, (size_t)(s - b)); w[s - b] = 0; }
  return w;
}

int main(void) {
  char line[4096];
  struct map m = {0};
  long words = 0;
  while (fgets(line, sizeof line, stdin)) {
    const char *p = line;
    char *w;
    while ((w = next_word(&p))) { map_incr(&m, w); words++; }
  }
  struct strbuf out = {0};
  strbuf_append(&out, "words: ", 7);
  strbuf_int(&out, words);
  strbuf_append(&out, " distinct: ", 11);
  strbuf_int(&out, (long)m.count);
  puts(out.data);
  strbuf_free(&out);
  return 0;
}
