/*
 * idset.c - a set of strings as 64-bit hashes with a 32-bit value each
 * (idset.h): open addressing, linear probing, grown to twice its size past
 * half full. A hash of 0 marks an empty slot, so a string that hashes to 0
 * is stored as 1.
 */
#include "idset.h"

#include <stdlib.h>

struct mz_idset {
  uint64_t *keys; /* 0: empty */
  uint32_t *vals;
  size_t cap, count; /* cap: a power of two */
};

/* FNV-1a over the bytes, then splitmix64's finalizer: every input bit
 * reaches every output bit, so the low bits index the table well. */
static uint64_t hash(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325u;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001b3u;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9u;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebu;
  h ^= h >> 31;
  return h ? h : 1;
}

static size_t slot_of(const uint64_t *keys, size_t cap, uint64_t h) {
  size_t i = (size_t)h & (cap - 1);
  while (keys[i] && keys[i] != h) i = (i + 1) & (cap - 1);
  return i;
}

static int resize(mz_idset *set, size_t cap) {
  uint64_t *keys = calloc(cap, sizeof *keys);
  uint32_t *vals = malloc(cap * sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    return -1;
  }
  for (size_t i = 0; i < set->cap; i++)
    if (set->keys[i]) {
      size_t j = slot_of(keys, cap, set->keys[i]);
      keys[j] = set->keys[i];
      vals[j] = set->vals[i];
    }
  free(set->keys);
  free(set->vals);
  set->keys = keys;
  set->vals = vals;
  set->cap = cap;
  return 0;
}

mz_idset *mz_idset_new(void) {
  mz_idset *set = calloc(1, sizeof *set);
  if (set && resize(set, 64) < 0) {
    free(set);
    return NULL;
  }
  return set;
}

void mz_idset_free(mz_idset *set) {
  if (!set) return;
  free(set->keys);
  free(set->vals);
  free(set);
}

int mz_idset_add(mz_idset *set, const char *s, size_t n, uint32_t v, uint32_t *old) {
  uint64_t h = hash(s, n);
  size_t i = slot_of(set->keys, set->cap, h);
  if (set->keys[i]) {
    if (old) *old = set->vals[i];
    return 0;
  }
  if (2 * (set->count + 1) > set->cap) {
    if (resize(set, set->cap * 2) < 0) return -1;
    i = slot_of(set->keys, set->cap, h);
  }
  set->keys[i] = h;
  set->vals[i] = v;
  set->count++;
  return 1;
}

int mz_idset_put(mz_idset *set, const char *s, size_t n, uint32_t v) {
  uint64_t h = hash(s, n);
  size_t i = slot_of(set->keys, set->cap, h);
  if (set->keys[i]) {
    set->vals[i] = v;
    return 0;
  }
  return mz_idset_add(set, s, n, v, NULL) < 0 ? -1 : 0;
}

int mz_idset_get(const mz_idset *set, const char *s, size_t n, uint32_t *v) {
  size_t i = slot_of(set->keys, set->cap, hash(s, n));
  if (!set->keys[i]) return 0;
  if (v) *v = set->vals[i];
  return 1;
}

size_t mz_idset_count(const mz_idset *set) { return set->count; }

size_t mz_idset_bytes(const mz_idset *set) { return set->cap * (sizeof *set->keys + sizeof *set->vals); }
