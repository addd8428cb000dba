/*
 * nofile.c - the open-files limit, raised for the streams and given back
 * to children (nofile.h).
 */
#include "nofile.h"
#include "os.h"

#include <limits.h>
#include <stddef.h>
#include <sys/resource.h>

/* What the process started with, and what it has now. Set once, by the
 * raise, before any child is started (children read it after fork). */
static struct {
  int done, raised;
  rlim_t orig, soft, hard;
} nofile;

static long lim_long(rlim_t v) { return v == RLIM_INFINITY || v > LONG_MAX ? -1 : (long)v; }

void mz_nofile_raise(void) {
  struct rlimit rl;
  if (nofile.done || getrlimit(RLIMIT_NOFILE, &rl)) return;
  nofile.done = 1;
  nofile.orig = nofile.soft = rl.rlim_cur;
  nofile.hard = rl.rlim_max;
  long ceiling = mz_os_nofile_ceiling(); /* macOS: kern.maxfilesperproc */
  const rlim_t steps[] = {rl.rlim_max, ceiling > 0 ? (rlim_t)ceiling : rl.rlim_max, 1u << 20, 65536, 10240};
  for (size_t i = 0; i < sizeof steps / sizeof *steps && rl.rlim_cur < rl.rlim_max; i++) {
    if (steps[i] <= nofile.orig || steps[i] > rl.rlim_max) continue;
    struct rlimit up = {steps[i], rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
      nofile.soft = steps[i];
      nofile.raised = 1;
      break;
    }
  }
}

void mz_nofile(long *soft, long *hard, long *orig) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) nofile.soft = rl.rlim_cur, nofile.hard = rl.rlim_max;
  if (!nofile.done) nofile.orig = nofile.soft;
  *soft = lim_long(nofile.soft);
  *hard = lim_long(nofile.hard);
  *orig = lim_long(nofile.orig);
}

void mz_nofile_restore(void) {
  struct rlimit rl;
  if (!nofile.raised || getrlimit(RLIMIT_NOFILE, &rl)) return;
  rl.rlim_cur = nofile.orig;
  setrlimit(RLIMIT_NOFILE, &rl);
}
