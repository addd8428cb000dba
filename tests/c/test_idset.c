/*
 * test_idset.c - the set of strings as 64-bit hashes (src/idset.c): each
 * string once with its first value, put overwrites, growth keeps every
 * entry, lengths count (no NUL termination), and its size for a million.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "idset.h"

static void test_add_get_put(void **state) {
  (void)state;
  mz_idset *set = mz_idset_new();
  assert_non_null(set);
  uint32_t v = 99;
  assert_int_equal(0, mz_idset_get(set, "a", 1, &v));
  assert_int_equal(1, mz_idset_add(set, "a", 1, 7, NULL));
  assert_int_equal(0, mz_idset_add(set, "a", 1, 8, &v)); /* there already: its first value */
  assert_int_equal(7, v);
  assert_int_equal(1, mz_idset_get(set, "a", 1, &v));
  assert_int_equal(7, v);
  assert_int_equal(0, mz_idset_put(set, "a", 1, 9));
  assert_int_equal(1, mz_idset_get(set, "a", 1, &v));
  assert_int_equal(9, v);
  assert_int_equal(0, mz_idset_put(set, "b", 1, 3)); /* put adds too */
  assert_int_equal(2, mz_idset_count(set));
  /* lengths count: "ab" and "a" (the first byte of "ab") differ, NUL too */
  assert_int_equal(1, mz_idset_add(set, "ab", 2, 1, NULL));
  assert_int_equal(1, mz_idset_add(set, "a\0b", 3, 1, NULL));
  assert_int_equal(1, mz_idset_add(set, "", 0, 1, NULL));
  assert_int_equal(0, mz_idset_add(set, "", 0, 2, NULL));
  assert_int_equal(5, mz_idset_count(set));
  mz_idset_free(set);
  mz_idset_free(NULL);
}

static void test_growth_keeps_every_entry(void **state) {
  (void)state;
  enum { N = 200000 };
  mz_idset *set = mz_idset_new();
  char id[32];
  for (uint32_t i = 0; i < N; i++) {
    int n = snprintf(id, sizeof id, "custom-%u", i);
    assert_int_equal(1, mz_idset_add(set, id, (size_t)n, i, NULL));
  }
  assert_int_equal(N, mz_idset_count(set));
  for (uint32_t i = 0; i < N; i++) {
    uint32_t v;
    int n = snprintf(id, sizeof id, "custom-%u", i);
    assert_int_equal(1, mz_idset_get(set, id, (size_t)n, &v));
    assert_int_equal(i, v);
    n = snprintf(id, sizeof id, "custom-%u", i + N);
    assert_int_equal(0, mz_idset_get(set, id, (size_t)n, NULL));
  }
  /* at most half full, 12 bytes a slot: under 32 bytes an entry */
  assert_true(mz_idset_bytes(set) <= 32u * N);
  mz_idset_free(set);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_add_get_put),
      cmocka_unit_test(test_growth_keeps_every_entry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
