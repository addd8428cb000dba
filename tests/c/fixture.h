/*
 * fixture.h - the recorded streams of tests/fixtures for the cmocka tests
 * (test_decode.c, test_fastframe.c, test_sse.c, ...): where they are, and
 * a file read whole. Header-only (static inline: a test uses what it
 * needs); include it after <cmocka.h>, whose asserts it uses: a fixture
 * that cannot be read fails the test, it is never skipped.
 *
 * The directories come from the environment ctest sets (MIRZA_FIXTURES,
 * MIRZA_TRACES: tests/tests.cmake), else from this file's own place in the
 * tree, so a test binary also runs by hand.
 */
#ifndef MIRZA_TEST_FIXTURE_H
#define MIRZA_TEST_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tests/fixtures (traces 0) or tests/fixtures/traces (traces 1). */
static inline const char *fixture_dir(int traces) {
  static char buf[2][1024];
  const char *env = getenv(traces ? "MIRZA_TRACES" : "MIRZA_FIXTURES");
  char *slash;
  if (env && *env) return env;
  snprintf(buf[traces], sizeof buf[traces], "%s", __FILE__);
  slash = strrchr(buf[traces], '/');
  if (slash) *slash = '\0';
  else snprintf(buf[traces], sizeof buf[traces], ".");
  strncat(buf[traces], traces ? "/../fixtures/traces" : "/../fixtures", sizeof buf[traces] - strlen(buf[traces]) - 1);
  return buf[traces];
}

/* The whole file, malloc'd and NUL-terminated after its *len bytes. */
static inline char *fixture_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *b;
  long n;
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  assert_true(n >= 0);
  b = malloc((size_t)n + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* A fixture by name, from fixture_dir(traces). */
static inline char *fixture_read(int traces, const char *name, size_t *len) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s", fixture_dir(traces), name);
  return fixture_slurp(path, len);
}

#endif
