/* Benchmark baseline: the cheapest possible policy process. It serves one compilation's
 * inlining channel in C and answers every decision with the compiler's own default (the
 * last feature with -inliner-interactive-include-default). tools/bench_collect.py times it
 * beside the Python channel to split the overhead into the compiler's ML-mode cost and
 * the policy side's cost. Usage: default_responder CHANNEL_BASE */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CHANNEL_BASE\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s.in", argv[1]);
  int advice = open(path, O_WRONLY); /* the compiler opens .in first */
  snprintf(path, sizeof path, "%s.out", argv[1]);
  FILE *log = fopen(path, "rb");
  if (advice < 0 || !log) {
    perror("default_responder: open channel");
    return 1;
  }
  char *line = NULL;
  size_t cap = 0;
  if (getline(&line, &cap, log) <= 0) return 1;
  int tensors = 0; /* every inlining feature is int64[1]; the header also names the advice */
  for (char *p = line; (p = strstr(p, "\"name\"")); p++) tensors++;
  int features = tensors - 1;
  long long *block = malloc(8 * (size_t)features + 1);
  while (getline(&line, &cap, log) > 0) {
    if (strncmp(line, "{\"context\"", 10) == 0) continue;
    if (fread(block, 1, 8 * (size_t)features + 1, log) != 8 * (size_t)features + 1) return 1;
    if (write(advice, &block[features - 1], 8) != 8) return 1;
  }
  return 0;
}
