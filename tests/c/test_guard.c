/*
 * test_guard.c - the repetition guard's rules (src/guard.c) without Lua:
 * each rule cuts its loop at the same byte whatever the chunking, with
 * the right line and count; lists, code, fences, numbers and refrains
 * are left alone; the character tail keeps its bound. The verdicts
 * against the Lua reference, on random texts, are repetition_spec's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"

/* mirza.repetition.DEFAULTS */
static const mz_guard_opts DEFAULTS = {6, 4, 8, 32, 6, 8, 80, 64, 4, 32};

typedef struct verdict {
  int hit;
  size_t at; /* bytes fed when it triggered */
  mz_guard_rule rule;
  char line[256];
  long count;
} verdict;

/* Feed text in chunks of `size` bytes (0: all at once), then its end. */
static verdict run(const char *text, size_t size, const mz_guard_opts *o) {
  verdict v = {0};
  mz_guard *g = mz_guard_new(o ? o : &DEFAULTS);
  assert_non_null(g);
  size_t n = strlen(text), i = 0;
  if (size == 0) size = n ? n : 1;
  for (; i < n && !v.hit; i += size) {
    size_t k = n - i < size ? n - i : size;
    v.hit = mz_guard_feed(g, text + i, k);
    assert_true(v.hit >= 0);
    v.at = i + k;
  }
  if (!v.hit) v.hit = mz_guard_check(g, "", 0);
  assert_true(v.hit >= 0);
  v.rule = mz_guard_rule_of(g);
  if (v.hit) {
    size_t len;
    const char *line = mz_guard_line(g, &len);
    assert_int_equal(strlen(line), len);
    snprintf(v.line, sizeof v.line, "%s", line);
    v.count = mz_guard_count(g);
  }
  mz_guard_free(g);
  return v;
}

static char *repeat(const char *unit, int n) {
  size_t len = strlen(unit);
  char *s = malloc(len * (size_t)n + 1);
  assert_non_null(s);
  for (int i = 0; i < n; i++) memcpy(s + len * (size_t)i, unit, len);
  s[len * (size_t)n] = '\0';
  return s;
}

/* The same verdict, rule and line for every chunk size, cut in the chunk
 * holding the byte a byte-wise feed cut at (the count: what was seen). */
static verdict same_whatever_the_chunks(const char *text, const mz_guard_opts *o) {
  verdict want = run(text, 1, o);
  static const size_t sizes[] = {2, 3, 7, 64, 0};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    verdict v = run(text, sizes[i], o);
    assert_int_equal(v.hit, want.hit);
    assert_int_equal(v.rule, want.rule);
    assert_string_equal(v.line, want.line);
    if (sizes[i] == 0) continue; /* the whole text: the counts run on past the cut */
    if (want.hit && sizes[i]) assert_true(v.at >= want.at && v.at < want.at + sizes[i]);
  }
  return want;
}

static void test_cycle_cuts_at_the_sixth(void **state) {
  (void)state;
  char *s = repeat("Wait, let me reconsider. ", 10);
  verdict v = same_whatever_the_chunks(s, NULL);
  assert_int_equal(v.hit, 1);
  assert_int_equal(v.rule, MZ_GUARD_CYCLE);
  assert_string_equal(mz_guard_rule_name(v.rule), "cycle");
  assert_string_equal(v.line, "Wait, let me reconsider.");
  assert_int_equal(v.count, 6);
  assert_int_equal(v.at, 6 * strlen("Wait, let me reconsider. ")); /* the space that ends the 6th */
  free(s);

  /* list markers, case and the final stop do not change the key: two
   * spellings of one sentence, four times each, are counted as eight */
  s = repeat("- First I add the numbers.\n* first i ADD the numbers!\n2. Then I check the sum.\n", 4);
  v = same_whatever_the_chunks(s, NULL);
  assert_int_equal(v.rule, MZ_GUARD_COUNT);
  assert_string_equal(v.line, "* first i ADD the numbers!");
  assert_int_equal(v.count, 8);
  free(s);
}

static void test_count_in_the_window(void **state) {
  (void)state;
  char text[2048] = "";
  static const char *const other[] = {"The sum is odd.", "Try the next pair.", "Maybe seven works.",
                                      "Then eight, surely.", "Or nine instead."};
  for (int i = 0; i < 8; i++) {
    strcat(text, "Hmm, wait a moment. ");
    strcat(text, other[i % 5]);
    strcat(text, i % 2 ? "\n" : " ");
  }
  verdict v = same_whatever_the_chunks(text, NULL);
  assert_int_equal(v.rule, MZ_GUARD_COUNT);
  assert_string_equal(v.line, "Hmm, wait a moment.");
  assert_int_equal(v.count, 8);

  /* a code line never counts: x = x + 1; is judged by the cycle rule alone */
  text[0] = '\0';
  for (int i = 0; i < 8; i++) {
    strcat(text, "x = x + 1;\n");
    strcat(text, other[i % 5]);
    strcat(text, "\n");
  }
  assert_int_equal(run(text, 5, NULL).hit, 0);

  /* nor does a sentence inside a fence */
  text[0] = '\0';
  strcat(text, "```\n");
  for (int i = 0; i < 8; i++) {
    strcat(text, "Hmm, wait a moment.\n");
    strcat(text, other[i % 5]);
    strcat(text, "\n");
  }
  strcat(text, "```\n");
  assert_int_equal(run(text, 5, NULL).hit, 0);
  memmove(text, text + 4, strlen(text + 4) + 1); /* unfenced: prose, cut */
  assert_int_equal(run(text, 5, NULL).rule, MZ_GUARD_COUNT);
}

static void test_phrase(void **state) {
  (void)state;
  char *s = repeat("and so on ", 12);
  verdict v = same_whatever_the_chunks(s, NULL);
  assert_int_equal(v.rule, MZ_GUARD_PHRASE);
  assert_string_equal(v.line, "and so on");
  assert_int_equal(v.count, 8);
  assert_int_equal(v.at, 80); /* 8 units of 10 bytes: phrase_min_chars */
  free(s);

  /* a unit with too few letters never counts */
  s = repeat("la )) ", 40);
  assert_int_equal(run(s, 3, NULL).hit, 0);
  free(s);

  /* a unit with a line break needs line_repeats (32) */
  s = repeat("Okay.\n", 40); /* too short for the segment rules */
  v = same_whatever_the_chunks(s, NULL);
  assert_int_equal(v.rule, MZ_GUARD_PHRASE);
  assert_string_equal(v.line, "okay.");
  assert_int_equal(v.count, 32);
  free(s);

  /* the same with a space before each line break, the pieces cut between
   * the two: the run " \n" is one line break in the tail, whatever the cut */
  mz_guard *g = mz_guard_new(&DEFAULTS);
  int fed = 0;
  while (mz_guard_rule_of(g) == MZ_GUARD_NONE && fed < 40) {
    assert_true(mz_guard_feed(g, "Okay. ", 6) >= 0);
    assert_true(mz_guard_feed(g, "\n", 1) >= 0);
    fed++;
  }
  assert_int_equal(mz_guard_rule_of(g), MZ_GUARD_PHRASE);
  assert_int_equal(mz_guard_count(g), 32);
  assert_int_equal(fed, 32);
  mz_guard_free(g);
}

static void test_tail_bound(void **state) {
  (void)state;
  /* one piece overflows the tail: it keeps the last 3/4 of 4096 bytes, so
   * it starts mid-word and so does the unit, 307 of them */
  char *s = repeat("and so on ", 1000);
  verdict v = run(s, 0, NULL);
  assert_int_equal(v.rule, MZ_GUARD_PHRASE);
  assert_string_equal(v.line, "n and so o");
  assert_int_equal(v.count, 307);
  free(s);
}

static void test_not_loops(void **state) {
  (void)state;
  const char *texts[] = {
      "1. Crack three eggs.\n2. Add salt.\n3. Beat them.\n4. Melt butter.\n5. Pour.\n6. Stir.\n7. Fold.\n",
      "Pi is 3.14159 and e is 2.71828. Mr. Smith said e.g. this works. Fine... really… yes.\n",
      ("Row, row, row your boat,\nGently down the stream.\nMerrily, merrily, merrily, merrily,\nLife is but a dream.\n"
       "Row, row, row your boat,\nGently down the stream.\nMerrily, merrily, merrily, merrily,\nLife is but a "
       "dream.\n"),
      "- item\n- item\n- item\n- item\n- item\n- item\n- item\n- item\n- item\n", /* too short to count */
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    verdict v = same_whatever_the_chunks(texts[i], NULL);
    assert_int_equal(v.hit, 0);
  }
}

static void test_sentence_ends(void **state) {
  (void)state;
  /* stops with closers, ellipses, and "3.14" inside a sentence: the
   * repeated sentence is found whole each time */
  char *s = repeat("He said \"go on.\" Then 3.14 came back… ", 6);
  verdict v = same_whatever_the_chunks(s, NULL);
  assert_int_equal(v.rule, MZ_GUARD_CYCLE);
  assert_string_equal(v.line, "He said \"go on.\"");
  free(s);
  /* a runaway line (no end for 4 KiB: no stop, no line break) is judged
   * as one segment: the same one six times is a cycle */
  char line[4200] = "";
  unsigned x = 7;
  while (strlen(line) < 4100) {
    x = x * 1103515245u + 12345u;
    static const char *const words[] = {"alpha ", "beta, ", "gamma ", "delta ", "eps; ", "zeta "};
    strcat(line, words[(x >> 16) % 6]);
  }
  mz_guard *g = mz_guard_new(&DEFAULTS);
  int i = 0;
  while (mz_guard_rule_of(g) == MZ_GUARD_NONE && i++ < 10) assert_true(mz_guard_feed(g, line, strlen(line)) >= 0);
  assert_int_equal(mz_guard_rule_of(g), MZ_GUARD_CYCLE);
  assert_int_equal(i, 6);
  size_t len;
  mz_guard_line(g, &len);
  assert_int_equal(len, strlen(line) - 1); /* trimmed: the final space */
  mz_guard_free(g);
}

static void test_stays_triggered(void **state) {
  (void)state;
  mz_guard *g = mz_guard_new(&DEFAULTS);
  char *s = repeat("and so on ", 9);
  assert_int_equal(mz_guard_feed(g, s, strlen(s)), 1);
  assert_int_equal(mz_guard_feed(g, "different text. ", 16), 1);
  assert_int_equal(mz_guard_check(g, "", 0), 1);
  assert_int_equal(mz_guard_count(g), 9);
  mz_guard_free(g);
  mz_guard_free(NULL);
  free(s);
  assert_null(mz_guard_rule_name(MZ_GUARD_NONE));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cycle_cuts_at_the_sixth),
      cmocka_unit_test(test_count_in_the_window),
      cmocka_unit_test(test_phrase),
      cmocka_unit_test(test_tail_bound),
      cmocka_unit_test(test_not_loops),
      cmocka_unit_test(test_sentence_ends),
      cmocka_unit_test(test_stays_triggered),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
