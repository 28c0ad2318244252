#include <stdio.h>

static void emit(int count, int c) {
  while (count-- > 0) putchar(c);
}

int main(void) {
  int count, c;
  while ((count = getchar()) != EOF && (c = getchar()) != EOF) emit(count, c);
  return 0;
}
