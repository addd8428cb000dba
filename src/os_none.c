/*
 * os_none.c - os.h's facts with POSIX alone (-DMIRZA_PORTABLE): which pid
 * listens on a port and whether a pid is a zombie cannot be known, and the
 * callers take the safe answer (an adopted daemon whose pid cannot be
 * checked is not signalled; a pid is gone only when kill says so). Linux
 * builds it so that CI runs the paths a system without /proc takes.
 */
#include "os.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char mz_os_facts[] = "none";

int mz_os_pid_listens(pid_t pid, int port) {
  (void)pid, (void)port;
  return errno = ENOSYS, -1;
}

int mz_os_pid_zombie(pid_t pid) {
  (void)pid;
  return errno = ENOSYS, -1;
}

/* dir/name when it is an executable file, made absolute by realpath. */
static int try_path(const char *dir, size_t dlen, const char *name, char *buf, size_t len) {
  char path[PATH_MAX], real[PATH_MAX];
  int n = snprintf(path, sizeof path, "%.*s%s%s", (int)dlen, dir, dlen ? "/" : "", name);
  if (n < 0 || (size_t)n >= sizeof path || access(path, X_OK) != 0 || !realpath(path, real)) return -1;
  if (strlen(real) >= len) return errno = ENAMETOOLONG, -1;
  strcpy(buf, real);
  return 0;
}

/* argv[0] as the shell found it: a path (with a '/') from the working
 * directory, else the first executable of that name along PATH. */
int mz_os_exe_path(char *buf, size_t len, const char *argv0) {
  if (!argv0 || !*argv0) return errno = ENOENT, -1;
  if (strchr(argv0, '/')) return try_path("", 0, argv0, buf, len);
  const char *p = getenv("PATH");
  for (p = p ? p : "/usr/bin:/bin"; *p;) {
    size_t dlen = strcspn(p, ":");
    if (try_path(dlen ? p : ".", dlen ? dlen : 1, argv0, buf, len) == 0) return 0;
    p += dlen + (p[dlen] == ':');
  }
  return errno = ENOENT, -1;
}

double mz_os_mtime(const struct stat *st) { return (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec * 1e-9; }

long mz_os_nofile_ceiling(void) { return -1; }
