/*
 * test_nofile.c - the open-files limit (src/nofile.c): raised to the hard
 * limit once, what it was kept, and given back to a child after fork.
 * The test lowers its own soft limit first (as `ulimit -Sn 256` would), so
 * there is something to raise whatever limits the machine has.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nofile.h"

static void test_raise_once_and_restore_in_child(void **state) {
  (void)state;
  struct rlimit rl;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max <= 256) skip(); /* a hard limit this low leaves nothing to raise */
  rl.rlim_cur = 256;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
  long soft, hard, orig;
  mz_nofile(&soft, &hard, &orig); /* before any raise: the limit as it is */
  assert_int_equal(soft, 256);
  assert_int_equal(orig, 256);

  mz_nofile_raise();
  mz_nofile(&soft, &hard, &orig);
  assert_int_equal(orig, 256);
  assert_true(soft > 256);
  assert_true(hard < 0 || soft == hard || soft == (1L << 20) || soft == 65536 || soft == 10240);
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  assert_int_equal((long)rl.rlim_cur, soft);

  /* once: a second raise after the script lowered it changes nothing */
  rl.rlim_cur = 300;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
  mz_nofile_raise();
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  assert_int_equal(rl.rlim_cur, 300);
  rl.rlim_cur = (rlim_t)soft;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);

  /* a child gets the limit the process started with */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    mz_nofile_restore();
    struct rlimit c;
    _exit(getrlimit(RLIMIT_NOFILE, &c) == 0 && c.rlim_cur == 256 ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0); /* the parent keeps its own */
  assert_int_equal((long)rl.rlim_cur, soft);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raise_once_and_restore_in_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
