/*
 * pidfile.c - the per-port pid files that let a later run of mirza adopt
 * and stop a daemon it did not start, and mkdir -p (supervisor.h:
 * mz_pidfile_path/write/read/remove, mz_mkdir_p, mz_mkdir_mode). No Lua.
 *
 * A pid file is an order to kill that pid later, so it is trusted only in
 * a directory that is ours and not writable by others, is never followed
 * through a symlink, and is read only when it is a regular file. Writes go
 * to a temporary name and are renamed into place: a reader sees the old
 * file or the new one, never half of one. The processes themselves are
 * supervisor.c's.
 */
#define _GNU_SOURCE
#include "supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- pid files ------------------------------------------------------------ */

/* The port is checked too (1..65535 are real ports; 0 is let through for
 * tests of "any port"): a negative one would make a strange file name. */
char *mz_pidfile_path(int port, char *buf, size_t len) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (port < 0 || port > 65535) return errno = EINVAL, NULL;
  if (xdg && xdg[0] == '/') /* the spec says: ignore a relative one */
    n = snprintf(buf, len, "%s/mirza/daemon-%d.pid", xdg, port);
  else n = snprintf(buf, len, "/tmp/mirza-%u/daemon-%d.pid", (unsigned)getuid(), port);
  if (n < 0 || (size_t)n >= len) return errno = ENAMETOOLONG, NULL;
  return buf;
}

/* The directory part of path, in place (path is a private copy). */
static char *dir_part(char *path) {
  char *slash = strrchr(path, '/');
  if (slash && slash != path) *slash = '\0';
  return path;
}

/* A pid file is an order to kill that pid later, so its directory must be
 * ours and not writable by others: /tmp/mirza-<uid> could have been made
 * (or symlinked) by another user before us. */
static int dir_is_safe(const char *dir) {
  struct stat sb;
  if (lstat(dir, &sb) < 0) return -1;
  if (!S_ISDIR(sb.st_mode)) return errno = ENOTDIR, -1;
  if (sb.st_uid != getuid() || (sb.st_mode & 022)) return errno = EPERM, -1;
  return 0;
}

static int write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Written to a temporary name then renamed, so a reader sees either the
 * old file or the whole new one, never a half-written pid. */
int mz_pidfile_write(int port, pid_t pid) {
  char path[PATH_MAX], dir[PATH_MAX], tmp[PATH_MAX + 32], line[32];
  if (pid <= 0) return errno = EINVAL, -1;
  if (!mz_pidfile_path(port, path, sizeof path)) return -1;
  strcpy(dir, path);
  if (mz_mkdir_p(dir_part(dir)) < 0 || dir_is_safe(dir) < 0) return -1;
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  int n = snprintf(line, sizeof line, "%ld\n", (long)pid);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return -1;
  int r = write_all(fd, line, (size_t)n);
  if (close(fd) < 0) r = -1;
  if (r == 0) r = rename(tmp, path);
  if (r < 0) {
    int e = errno;
    unlink(tmp);
    errno = e;
  }
  return r;
}

/* "<digits>" with an optional final '\n', 1..INT_MAX; anything else: 0. */
static pid_t parse_pid(const char *text) {
  char *end;
  if (text[0] < '0' || text[0] > '9') return 0;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || v <= 0 || v > INT_MAX) return 0;
  if (*end == '\n') end++;
  return *end ? 0 : (pid_t)v;
}

pid_t mz_pidfile_read(int port) {
  char path[PATH_MAX], dir[PATH_MAX], text[32];
  if (!mz_pidfile_path(port, path, sizeof path)) return 0;
  strcpy(dir, path);
  if (dir_is_safe(dir_part(dir)) < 0) return 0;
  /* O_NONBLOCK and a regular file only: a fifo (or a device) put there
   * would block the read for as long as a writer held it open. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return 0;
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return 0;
  }
  ssize_t n;
  do n = read(fd, text, sizeof text - 1);
  while (n < 0 && errno == EINTR);
  close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  return parse_pid(text);
}

int mz_pidfile_remove(int port) {
  char path[PATH_MAX];
  if (!mz_pidfile_path(port, path, sizeof path)) return -1;
  return unlink(path) < 0 && errno != ENOENT ? -1 : 0;
}

/* ---- directories ---------------------------------------------------------- */

/* Each component of dir in turn, the '/' after it cut and put back (a
 * final '/' is dir's own). A parent gets u+wx besides mode, as mkdir(1)
 * gives it, or the next one could not be made inside it. EEXIST is fine on
 * the way (a component that is a file fails at the next one, ENOTDIR) and
 * at the end only for a directory. */
int mz_mkdir_mode(char *dir, mode_t mode) {
  struct stat sb;
  if (!dir[0]) return errno = ENOENT, -1;
  for (char *s = dir + 1; *s; s++) {
    if (*s != '/' || !s[1]) continue;
    *s = '\0';
    int r = mkdir(dir, mode | S_IWUSR | S_IXUSR);
    *s = '/';
    if (r < 0 && errno != EEXIST) return -1;
  }
  if (mkdir(dir, mode) == 0) return 0;
  if (errno != EEXIST || stat(dir, &sb) < 0) return -1;
  return S_ISDIR(sb.st_mode) ? 0 : (errno = ENOTDIR, -1);
}

int mz_mkdir_p(char *dir) { return mz_mkdir_mode(dir, 0700); }
