#include <stdio.h>

int count_words(const char *s);

int main(int argc, char **argv) {
  int total = 0;
  for (int i = 1; i < argc; i++) total += count_words(argv[i]);
  printf("%d\n", total);
  return 0;
}
