/*
 * idset.h - a set of strings kept as 64-bit hashes, each with a 32-bit
 * value: what a batch run remembers of a million custom_ids (the
 * duplicates in its input, the records already in its output) in 12-byte
 * slots, at most half full (24-48 bytes an id; a million: 25 MB), instead
 * of a Lua string and a table node (~76 bytes). Two different strings with the same 64-bit hash are taken for
 * one: for n strings that happens with a probability of about n^2 / 2^65
 * (a million: 3e-8). Lua-free.
 */
#ifndef MZ_IDSET_H
#define MZ_IDSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct mz_idset mz_idset;

mz_idset *mz_idset_new(void); /* NULL: out of memory */
void mz_idset_free(mz_idset *set);
/* Add s (n bytes) with value v. Returns 1 when added, 0 when it was there
 * already (*old, when not NULL, gets its value; the value is kept), -1 out
 * of memory (nothing changed). */
int mz_idset_add(mz_idset *set, const char *s, size_t n, uint32_t v, uint32_t *old);
/* Add s with value v, or give it v when it is there. 0, or -1 out of
 * memory (nothing changed). */
int mz_idset_put(mz_idset *set, const char *s, size_t n, uint32_t v);
/* Whether s is there (1, *v its value when not NULL) or not (0). */
int mz_idset_get(const mz_idset *set, const char *s, size_t n, uint32_t *v);
size_t mz_idset_count(const mz_idset *set);
/* Bytes the set holds (its arrays). */
size_t mz_idset_bytes(const mz_idset *set);

#endif
