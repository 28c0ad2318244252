#include <ctype.h>

static int is_word_char(int c) { return isalnum(c) || c == '_'; }

int count_words(const char *s) {
  int words = 0, in_word = 0;
  for (; *s; s++) {
    int w = is_word_char((unsigned char)*s);
    words += w && !in_word;
    in_word = w;
  }
  return words;
}
