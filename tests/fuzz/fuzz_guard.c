/*
 * fuzz_guard.c - the repetition guard's rules (src/guard.c) on any bytes,
 * whatever the cut: memory safety under the sanitizers, and what a guard
 * promises whatever the text.
 *
 * Byte 0 picks a set of thresholds, byte 1 seeds the pieces; the rest is
 * the text (a model's output is untrusted: NULs, bare UTF-8 continuation
 * bytes, runs of closers, 4 KiB lines). It is fed in pieces of 1 to 64
 * bytes, then its end judged (check); and again whole, with check. Each
 * run must:
 *  - return 0 or 1, and once 1, stay 1 with the same report, whatever
 *    comes after (pieces, the end, more text);
 *  - report a rule, a line no longer than the text and a count >= 1 when
 *    triggered, nothing when not;
 *  - give the same report twice for the same pieces (no state outside the
 *    guard).
 * The verdicts themselves are held to the Lua reference by
 * tests/lua/repetition_spec.lua.
 */
#include <string.h>

#include "fuzz.h"
#include "guard.h"

static const mz_guard_opts SETS[] = {
    {6, 4, 8, 32, 6, 8, 80, 64, 4, 32},            /* mirza.repetition.DEFAULTS */
    {3, 4, 4, 8, 2, 3, 12, 10, 0.5, 5},            /* tight: most texts trigger */
    {2, 1, 2, 3, 1, 1, 1, 3, 0, 2},                /* one repetition may pass the phrase rule */
    {1000, 1000, 1000, 1000, 0, 2, 0, 4096, 0, 1}, /* long periods, huge windows */
};

typedef struct report {
  int hit;
  mz_guard_rule rule;
  char line[5000];
  size_t len;
  long count;
} report;

static report take(const mz_guard *g, int hit, size_t text_len) {
  report r = {.hit = hit, .rule = mz_guard_rule_of(g)};
  FUZZ_CHECK(hit == 0 || hit == 1, "returned %d", hit);
  FUZZ_CHECK(hit == (r.rule != MZ_GUARD_NONE), "returned %d, rule %d", hit, (int)r.rule);
  const char *line = mz_guard_line(g, &r.len);
  if (!hit) {
    FUZZ_CHECK(line == NULL, "a line before any rule triggered");
    return r;
  }
  FUZZ_CHECK(mz_guard_rule_name(r.rule) != NULL, "rule %d has no name", (int)r.rule);
  FUZZ_CHECK(line != NULL && r.len <= text_len, "line of %zu bytes from %zu", r.len, text_len);
  FUZZ_CHECK(r.len < sizeof r.line, "line of %zu bytes", r.len);
  memcpy(r.line, line, r.len);
  r.count = mz_guard_count(g);
  FUZZ_CHECK(r.count >= 1, "count %ld", r.count);
  return r;
}

static int same(const report *a, const report *b) {
  return a->hit == b->hit && a->rule == b->rule && a->len == b->len && a->count == b->count &&
         memcmp(a->line, b->line, a->len) == 0;
}

/* Feed text in pieces (seed 0: whole, with check), then check. */
static report run(const mz_guard_opts *o, const char *text, size_t len, uint32_t seed) {
  mz_guard *g = mz_guard_new(o);
  FUZZ_CHECK(g != NULL, "oom");
  report first = {0};
  int hit = 0;
  if (!seed) {
    hit = mz_guard_check(g, text, len);
  } else {
    for (size_t from = 0; from < len;) {
      size_t n = 1 + fuzz_next(&seed) % 64;
      if (n > len - from) n = len - from;
      int h = mz_guard_feed(g, text + from, n);
      FUZZ_CHECK(h >= 0, "out of memory");
      if (h && !hit) first = take(g, h, len);
      if (hit) FUZZ_CHECK(h == 1, "triggered, then not");
      hit = h;
      from += n;
    }
    int h = mz_guard_check(g, "", 0);
    FUZZ_CHECK(!hit || h == 1, "triggered, then not at the end");
    hit = h;
  }
  FUZZ_CHECK(hit >= 0, "out of memory");
  report r = take(g, hit, len);
  if (first.hit) FUZZ_CHECK(same(&first, &r), "the report changed after the trigger");
  if (hit) { /* more text changes nothing once triggered */
    FUZZ_CHECK(mz_guard_feed(g, "and so on. and so on. ", 22) == 1, "a later feed changed the verdict");
    report again = take(g, 1, len + 22);
    FUZZ_CHECK(same(&r, &again), "a later feed changed the report");
  }
  mz_guard_free(g);
  return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 65536) return 0;
  const mz_guard_opts *o = &SETS[data[0] % (sizeof SETS / sizeof *SETS)];
  uint32_t seed = data[1] | 1u; /* never 0: pieces */
  const char *text = (const char *)data + 2;
  size_t len = size - 2;
  report a = run(o, text, len, seed), b = run(o, text, len, seed);
  FUZZ_CHECK(same(&a, &b), "the same pieces, two reports");
  run(o, text, len, 0);
  return 0;
}
