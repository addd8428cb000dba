/*
 * test_fuzz_found.c - what the fuzzers (tests/fuzz/) found in the engine
 * files, pinned with exact values. Each test names the saved input under
 * tests/fuzz/regressions/ that first showed it; ctest's fuzz.* tests replay
 * those inputs too, but only catch a crash or a broken invariant, while
 * these say what the right answer is.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "decode.h"

/* regressions/frame/error-code-out-of-long-long-range: an error "code"
 * beyond long long was converted before its range was checked (undefined
 * behaviour, caught by UBSan). It is rendered with %g. */
static void test_error_code_huge(void **state) {
  mz_frame f;
  char err[64], code[32];
  const char *type, *msg;
  static const char frame[] = "{\"error\":{\"code\":5.0077e22,\"message\":\"boom\",\"type\":\"se\"}}";
  (void)state;
  assert_int_equal(mz_frame_decode(&f, frame, strlen(frame), err, sizeof err), 0);
  msg = mz_error_message(f.error, &type, code, sizeof code);
  assert_string_equal(msg, "boom");
  assert_string_equal(type, "se");
  assert_string_equal(code, "5.0077e+22");
  mz_frame_free(&f);
}

/* regressions/frame/index-out-of-int-range: a choice "index" outside int
 * was cast to int (undefined behaviour; INT_MIN on x86). Such an index
 * reads as absent: the position in the array. */
static void test_choice_index_huge(void **state) {
  mz_frame f;
  mz_choice c;
  char err[64];
  static const char frame[] =
      "{\"choices\":[{\"index\":1e10,\"delta\":{\"content\":\"x\"}},{\"index\":-3e9,\"delta\":{}},{\"index\":7}]}";
  (void)state;
  assert_int_equal(mz_frame_decode(&f, frame, strlen(frame), err, sizeof err), 0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.index, 0);
  assert_string_equal(c.content, "x");
  assert_int_equal(mz_frame_choice(&f, 1, &c), 0);
  assert_int_equal(c.index, 1);
  assert_int_equal(mz_frame_choice(&f, 2, &c), 0);
  assert_int_equal(c.index, 7);
  mz_frame_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_error_code_huge),
      cmocka_unit_test(test_choice_index_huge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
