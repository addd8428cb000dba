/*
 * test_sim_slots.c - mirza-sim's choice of a slot (src/sim/slots.c, built
 * into this test: the simulator is not part of mirza_core), as
 * llama-server's get_available_slot makes it: the idle slot sharing the
 * longest prefix when it is more than the similarity threshold of the
 * request, else the least recently released idle slot (the last of
 * equals); busy and empty slots never match; 0 turns the first pass off.
 * And the endpoint store's lookup (--prompt-cache endpoint).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "../../src/sim/slots.c"

static slot S(const char *prompt, bool busy, double last_used) {
  return (slot){
      .prompt = (char *)prompt, .prompt_len = prompt ? strlen(prompt) : 0, .busy = busy, .last_used = last_used};
}

static int pick(const slot *slots, int n, const char *prompt, double sim) {
  return slot_pick(slots, n, prompt, strlen(prompt), sim);
}

static void test_common_prefix(void **state) {
  (void)state;
  assert_int_equal(3, sim_common_prefix("abcd", 4, "abcx", 4));
  assert_int_equal(2, sim_common_prefix("ab", 2, "abc", 3));
  assert_int_equal(0, sim_common_prefix("", 0, "abc", 3));
  assert_int_equal(0, sim_common_prefix("abc", 3, NULL, 0));
}

static void test_longest_prefix_wins(void **state) {
  (void)state;
  slot s[3] = {S("AAAAxxxx", false, 1), S("AAAAAAAAyy", false, 5), S("BBBB", false, 0)};
  assert_int_equal(1, pick(s, 3, "AAAAAAAAzz", 0.1)); /* 8 of 10 beats 4 of 10 and the LRU slot 2 */
  assert_int_equal(0, pick(s, 3, "AAAAxxxxQ", 0.1));
  s[1].busy = true; /* a busy slot is never taken, however well it matches */
  assert_int_equal(0, pick(s, 3, "AAAAAAAAzz", 0.1));
  s[0].busy = true;
  assert_int_equal(2, pick(s, 3, "AAAAAAAAzz", 0.1));
  s[2].busy = true;
  assert_int_equal(-1, pick(s, 3, "AAAAAAAAzz", 0.1)); /* all busy */
}

static void test_similarity_threshold(void **state) {
  (void)state;
  /* "P" shares 1 byte of a 10-byte request (0.1, not more than 0.1): LRU */
  slot s[2] = {S("Pxxxxxxxxx", false, 3), S("Q", false, 1)};
  assert_int_equal(1, pick(s, 2, "Pyyyyyyyyy", 0.1));
  assert_int_equal(0, pick(s, 2, "Pxyyyyyyyy", 0.1));  /* 2 of 10 > 0.1 */
  assert_int_equal(1, pick(s, 2, "Pxyyyyyyyy", 0.5));  /* not > 0.5: LRU */
  assert_int_equal(1, pick(s, 2, "Pxxxxxxxxx", 0));    /* 0: LRU only */
  assert_int_equal(0, pick(s, 2, "Pxxxxxxxxx", 0.99)); /* the whole request */
}

static void test_lru_by_release(void **state) {
  (void)state;
  slot s[3] = {S("aaaa", false, 7), S("bbbb", false, 2), S("cccc", false, 9)};
  assert_int_equal(1, pick(s, 3, "zzzz", 0.1)); /* released first */
  s[1].busy = true;
  assert_int_equal(0, pick(s, 3, "zzzz", 0.1));
  /* fresh slots (never released, all equal): the last of them, as llama-server */
  slot e[3] = {S(NULL, false, 0), S(NULL, false, 0), S(NULL, false, 0)};
  assert_int_equal(2, pick(e, 3, "zzzz", 0.1));
  e[2].busy = true;
  assert_int_equal(1, pick(e, 3, "zzzz", 0.1));
  /* an empty slot is never chosen for its prompt, only by LRU */
  slot m[2] = {S("", false, 1), S("zz", false, 0)};
  assert_int_equal(1, pick(m, 2, "zzzz", 0.1));
}

static void test_store(void **state) {
  (void)state;
  cached_prompt st[3] = {{(char *)"abcdef", 6, 3}, {(char *)"abcxyz", 6, 1}, {(char *)"qq", 2, 2}};
  size_t c = 99;
  assert_int_equal(0, store_best(st, 3, "abcdeQ", 6, &c));
  assert_int_equal(5, c);
  assert_int_equal(1, store_best(st, 3, "abcxy", 5, &c));
  assert_int_equal(5, c);
  assert_int_equal(-1, store_best(st, 3, "zzz", 3, &c));
  assert_int_equal(0, c);
  assert_int_equal(-1, store_best(st, 0, "abc", 3, &c));
  assert_int_equal(1, store_victim(st, 3)); /* the least recently used */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_common_prefix),
      cmocka_unit_test(test_longest_prefix_wins),
      cmocka_unit_test(test_similarity_threshold),
      cmocka_unit_test(test_lru_by_release),
      cmocka_unit_test(test_store),
  };
  return cmocka_run_group_tests(tests, 0, NULL);
}
