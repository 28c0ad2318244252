/* Open-addressing hash map from strings to ints. */
#include <stdlib.h>
#include <string.h>

struct entry { const char *key; int value; };
struct map { struct entry *slots; size_t cap, count; };

static unsigned long fnv1a(const char *s) {
  unsigned long h = 1469598103934665603UL;
  while (*s) { h ^= (unsigned char)*s++; h *= 1099511628211UL; }
  return h;
}

static size_t probe_slot(const struct map *m, const char *key) {
  size_t i = fnv1a(key) & (m->cap - 1);
  while (m->slots[i].key && strcmp(m->slots[i].key, key) != 0) i = (i + 1) & (m->cap - 1);
  return i;
}

static int rehash(struct map *m, size_t cap) {
  struct entry *old = m->slots;
  size_t oldcap = m->cap;
  m->slots = calloc(cap, sizeof *m->slots);
  if (!m->slots) { m->slots = old; return -1; }
  m->cap = cap;
  for (size_t i = 0; i < oldcap; i++)
    if (old[i].key) m->slots[probe_slot(m, old[i].key)] = old[i];
  free(old);
  return 0;
}

int map_put(struct map *m, const char *key, int value) {
  if (2 * (m->count + 1) > m->cap && rehash(m, m->cap ? 2 * m->cap : 8)) return -1;
  size_t i = probe_slot(m, key);
  if (!m->slots[i].key) { m->slots[i].key = key; m->count++; }
  m->slots[i].value = value;
  return 0;
}

int map_get(const struct map *m, const char *key, int *value) {
  if (!m->cap) return 0;
  size_t i = probe_slot(m, key);
  if (!m->slots[i].key) return 0;
  *value = m->slots[i].value;
  return 1;
}

int map_incr(struct map *m, const char *key) {
  int v = 0;
  map_get(m, key, &v);
  return map_put(m, key, v + 1);
}
