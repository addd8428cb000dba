/* test.c - a cmocka test, as tests/c/test_*.c are. */
#include "smoke.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void core_works(void **state) {
  (void)state;
  assert_true(smoke_core());
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(core_works)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
