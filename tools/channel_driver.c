/* Benchmark peer: plays the compiler's side of an interactive channel from recorded real
 * observations and times every decision's round trip (observation written -> advice
 * read), so the policy side is measured without clang's own work in the way.
 *
 * Usage: channel_driver CHANNEL_BASE CHUNKS PASSES
 * CHUNKS (written by tools/bench_service.py): a line "ADVICE_BYTES COUNT", then COUNT
 * records of a 4-byte little-endian length and that many bytes. Record 0 is the log
 * header; each further record is one observation (event line + tensor block), answered
 * by ADVICE_BYTES of advice. The observations are sent PASSES times in one session.
 * Prints "decisions p50_ns p90_ns p99_ns max_ns". */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, char *p, size_t n) {
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return -1;
    p += r, n -= (size_t)r;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s CHANNEL_BASE CHUNKS PASSES\n", argv[0]);
    return 2;
  }
  FILE *f = fopen(argv[2], "rb");
  size_t advice_bytes, count;
  if (!f || fscanf(f, "%zu %zu", &advice_bytes, &count) != 2 || fgetc(f) != '\n') {
    fprintf(stderr, "channel_driver: cannot read %s\n", argv[2]);
    return 1;
  }
  char **chunk = calloc(count, sizeof *chunk);
  uint32_t *len = calloc(count, sizeof *len);
  for (size_t i = 0; i < count; i++) {
    if (fread(&len[i], 4, 1, f) != 1 || !(chunk[i] = malloc(len[i])) ||
        fread(chunk[i], 1, len[i], f) != len[i]) {
      fprintf(stderr, "channel_driver: %s is truncated\n", argv[2]);
      return 1;
    }
  }
  int passes = atoi(argv[3]);
  char path[4096];
  snprintf(path, sizeof path, "%s.in", argv[1]);
  int advice = open(path, O_RDONLY); /* the compiler's order: .in first, then .out */
  snprintf(path, sizeof path, "%s.out", argv[1]);
  int log = open(path, O_WRONLY);
  if (advice < 0 || log < 0) {
    perror("channel_driver: open channel");
    return 1;
  }
  size_t n = (count - 1) * (size_t)passes;
  uint64_t *rtt = malloc(n * sizeof *rtt);
  char answer[4096];
  if (write_all(log, chunk[0], len[0])) return 1;
  size_t k = 0;
  for (int p = 0; p < passes; p++) {
    for (size_t i = 1; i < count; i++) {
      uint64_t t0 = now_ns();
      if (write_all(log, chunk[i], len[i]) || read_all(advice, answer, advice_bytes)) {
        fprintf(stderr, "channel_driver: the policy side went away at decision %zu\n", k);
        return 1;
      }
      rtt[k++] = now_ns() - t0;
    }
  }
  close(log);
  close(advice);
  qsort(rtt, n, sizeof *rtt, cmp_u64);
  printf("%zu %llu %llu %llu %llu\n", n, (unsigned long long)rtt[n / 2],
         (unsigned long long)rtt[n * 9 / 10], (unsigned long long)rtt[n * 99 / 100],
         (unsigned long long)rtt[n - 1]);
  return 0;
}
