/*
 * test_pidfile.c - what the supervisor trusts in a pid file's directory
 * (mz_pidfile_read/write, src/pidfile.c). A pid file is an order to
 * kill that pid later, so it is read and written only in a directory that
 * is ours and that nobody else can write to: a directory writable by its
 * group or by others (sticky bit or not), owned by another user, or that
 * is a symlink is refused; a pid file that is a symlink is not followed.
 * test_supervisor.c has the file's format and the 0777 case.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor.h"

#define PORT 9100

static char tmpdir[64]; /* "/tmp/mz-pidfile-XXXXXX" */
static char *saved_xdg;

/* A fresh XDG_RUNTIME_DIR (tmpdir/name) holding mirza/ with this mode;
 * the pid file's path in path. */
static void runtime(const char *name, mode_t mode, char *path, size_t len) {
  char xdg[PATH_MAX], dir[PATH_MAX + 8];
  snprintf(xdg, sizeof xdg, "%s/%s", tmpdir, name);
  snprintf(dir, sizeof dir, "%s/mirza", xdg);
  assert_int_equal(mkdir(xdg, 0700), 0);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(chmod(dir, mode), 0);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  assert_non_null(mz_pidfile_path(PORT, path, len));
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void read_text(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* A directory of this mode: its pid file is refused both ways (EPERM). */
static void refused_mode(const char *name, mode_t mode) {
  char path[PATH_MAX];
  runtime(name, mode, path, sizeof path);
  errno = 0;
  assert_int_equal(mz_pidfile_write(PORT, 4242), -1);
  assert_int_equal(errno, EPERM);
  write_file(path, "4242\n"); /* as another user could */
  assert_int_equal(mz_pidfile_read(PORT), 0);
}

static void test_safe_modes(void **state) {
  (void)state;
  char path[PATH_MAX];
  runtime("safe-0700", 0700, path, sizeof path);
  assert_int_equal(mz_pidfile_write(PORT, 4242), 0);
  assert_int_equal(mz_pidfile_read(PORT), 4242);
  runtime("safe-0755", 0755, path, sizeof path); /* others may read, not write */
  assert_int_equal(mz_pidfile_write(PORT, 4343), 0);
  assert_int_equal(mz_pidfile_read(PORT), 4343);
}

static void test_writable_by_others(void **state) {
  (void)state;
  refused_mode("o+w", 0702);
  refused_mode("g+w", 0720);
  refused_mode("sticky", 01777); /* /tmp's mode: still anyone's to create files in */
  refused_mode("sticky-o+w", 01703);
}

static void test_owned_by_another_user(void **state) {
  (void)state;
  char path[PATH_MAX], dir[PATH_MAX];
  if (geteuid() != 0) skip(); /* only root can give a directory away */
  runtime("other-owner", 0700, path, sizeof path);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  write_file(path, "4242\n");
  assert_int_equal(mz_pidfile_read(PORT), 4242); /* ours: trusted */
  assert_int_equal(chown(dir, 65534, 65534), 0);
  assert_int_equal(mz_pidfile_read(PORT), 0);
  errno = 0;
  assert_int_equal(mz_pidfile_write(PORT, 4343), -1);
  assert_int_equal(errno, EPERM);
  assert_int_equal(chown(dir, getuid(), getgid()), 0); /* the teardown's rm needs no more */
}

/* mirza/ a symlink to a safe directory of ours: refused (ENOTDIR), since
 * whoever made the link chose where it points. */
static void test_directory_symlink(void **state) {
  (void)state;
  char xdg[PATH_MAX], real[PATH_MAX + 8], link[PATH_MAX + 8];
  snprintf(xdg, sizeof xdg, "%s/dir-link", tmpdir);
  snprintf(real, sizeof real, "%s/real", xdg);
  snprintf(link, sizeof link, "%s/mirza", xdg);
  assert_int_equal(mkdir(xdg, 0700), 0);
  assert_int_equal(mkdir(real, 0700), 0);
  assert_int_equal(symlink(real, link), 0);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  char target[PATH_MAX + 32];
  snprintf(target, sizeof target, "%s/daemon-%d.pid", real, PORT);
  write_file(target, "4242\n");
  assert_int_equal(mz_pidfile_read(PORT), 0);
  errno = 0;
  assert_int_equal(mz_pidfile_write(PORT, 4343), -1);
  assert_int_equal(errno, ENOTDIR);
  char text[32];
  read_text(target, text, sizeof text);
  assert_string_equal(text, "4242\n");
}

/* The pid file a symlink (to a file holding a pid): not read through; a
 * write replaces the link itself, its target untouched. */
static void test_pidfile_symlink(void **state) {
  (void)state;
  char path[PATH_MAX], target[PATH_MAX + 16], text[32];
  runtime("file-link", 0700, path, sizeof path);
  snprintf(target, sizeof target, "%s/elsewhere", tmpdir);
  write_file(target, "4242\n");
  assert_int_equal(symlink(target, path), 0);
  assert_int_equal(mz_pidfile_read(PORT), 0);
  assert_int_equal(mz_pidfile_write(PORT, 4343), 0);
  struct stat sb;
  assert_int_equal(lstat(path, &sb), 0);
  assert_true(S_ISREG(sb.st_mode));
  assert_int_equal(mz_pidfile_read(PORT), 4343);
  read_text(target, text, sizeof text);
  assert_string_equal(text, "4242\n");
}

/* The pid file a directory: no pid. */
static void test_pidfile_directory(void **state) {
  (void)state;
  char path[PATH_MAX];
  runtime("not-a-file", 0700, path, sizeof path);
  assert_int_equal(mkdir(path, 0700), 0);
  assert_int_equal(mz_pidfile_read(PORT), 0);
  assert_int_equal(rmdir(path), 0);
}

/* The pid file a fifo that a writer holds open: no pid, and no hang (it
 * blocked forever when mz_pidfile_read opened it without O_NONBLOCK and
 * read it without checking it is a regular file). The alarm turns a hang
 * into a failure. */
static void test_pidfile_fifo(void **state) {
  (void)state;
  char path[PATH_MAX];
  runtime("fifo", 0700, path, sizeof path);
  assert_int_equal(mkfifo(path, 0600), 0);
  int fd = open(path, O_RDWR | O_NONBLOCK);
  assert_true(fd >= 0);
  alarm(5);
  assert_int_equal(mz_pidfile_read(PORT), 0);
  alarm(0);
  close(fd);
}

static int group_setup(void **state) {
  (void)state;
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  saved_xdg = xdg ? strdup(xdg) : NULL;
  umask(022);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mz-pidfile-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  char cmd[128];
  if (saved_xdg) setenv("XDG_RUNTIME_DIR", saved_xdg, 1);
  else unsetenv("XDG_RUNTIME_DIR");
  free(saved_xdg);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_safe_modes),
      cmocka_unit_test(test_writable_by_others),
      cmocka_unit_test(test_owned_by_another_user),
      cmocka_unit_test(test_directory_symlink),
      cmocka_unit_test(test_pidfile_symlink),
      cmocka_unit_test(test_pidfile_directory),
      cmocka_unit_test(test_pidfile_fifo),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
