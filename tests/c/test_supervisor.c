/*
 * test_supervisor.c - the supervisor against real child processes: /bin/sh
 * scripts stand in for daemons, including ones that ignore SIGTERM, fork
 * grandchildren, or outlive the process that started them.
 *
 * Timing: every wait is a poll with a generous deadline, and timing asserts
 * are lower bounds (a stop cannot beat its grace period) or loose upper
 * bounds, so a loaded machine slows the suite down but does not fail it.
 * Scripts hand pids back through files written to a temporary name and
 * renamed, so a reader never sees half a number.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "os.h"
#include "supervisor.h"

static char tmpdir[64]; /* "/tmp/mz-supervisor-XXXXXX" */
static char *saved_xdg;

/* ---- helpers ------------------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static char *tmp_path(const char *name, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", tmpdir, name);
  return buf;
}

static mz_proc *spawn_ok(const char *const *argv, const char *log, int keep_alive) {
  mz_spawn_opts o = {.argv = argv, .log_path = log, .keep_alive = keep_alive};
  mz_proc *p = NULL;
  char err[256] = "";
  int r = mz_proc_spawn(&o, &p, err, sizeof err);
  if (r != 0) print_error("spawn failed: %s\n", err);
  assert_int_equal(r, 0);
  assert_non_null(p);
  return p;
}

static mz_proc *spawn_sh(const char *script, const char *log) {
  const char *argv[] = {"/bin/sh", "-c", script, NULL};
  return spawn_ok(argv, log, 0);
}

/* Poll until exit (at most ms); returns the wait status. */
static int wait_exit(mz_proc *p, int ms) {
  int status = -1;
  int64_t deadline = now_ms() + ms;
  while (!mz_proc_poll(p, &status) && now_ms() < deadline) nap_ms(5);
  assert_true(mz_proc_poll(p, &status));
  return status;
}

static void read_file(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  size_t n = 0;
  if (f) {
    n = fread(buf, 1, len - 1, f);
    fclose(f);
  }
  buf[n] = '\0';
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

/* The pid a script wrote (atomically) to path; fails after 5 s. */
static pid_t wait_pid_file(const char *path) {
  char text[32];
  int64_t deadline = now_ms() + 5000;
  for (;;) {
    read_file(path, text, sizeof text);
    if (atoi(text) > 0 || now_ms() > deadline) break;
    nap_ms(5);
  }
  assert_true(atoi(text) > 0);
  return (pid_t)atoi(text);
}

/* 1 where /proc can be read (Linux, whatever os.h file the build has):
 * the tests then look at what the child really has. 0 with
 * MIRZA_TEST_NO_PROC=1 (the portable build's suite, tests.cmake), so that
 * Linux runs the ways of a system without /proc, as on macOS. */
static int have_proc(void) {
  const char *no = getenv("MIRZA_TEST_NO_PROC");
  if (no && strcmp(no, "1") == 0) return 0;
  return access("/proc/self/stat", R_OK) == 0;
}

/* Dead: no such pid, or a zombie left to an init that may never reap
 * (/proc/PID/stat when there is one, else os.h's answer). */
static int gone(pid_t pid) {
  char path[64], text[512] = "";
  if (kill(pid, 0) < 0 && errno == ESRCH) return 1;
  if (!have_proc()) return mz_os_pid_zombie(pid) == 1;
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  read_file(path, text, sizeof text);
  char *rp = strrchr(text, ')');
  return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

static int wait_gone(pid_t pid, int ms) {
  int64_t deadline = now_ms() + ms;
  while (!gone(pid) && now_ms() < deadline) nap_ms(10);
  return gone(pid);
}

/* Last-resort cleanup so a failing test does not leave sleeps behind. */
static void kill_quietly(pid_t pid) {
  if (pid > 0 && !gone(pid)) kill(pid, SIGKILL);
}

/* A /proc/<pid>/status field as a hex mask (SigIgn, SigBlk...). */
static unsigned long long status_mask(pid_t pid, const char *field) {
  char path[64], text[4096];
  snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
  read_file(path, text, sizeof text);
  char *line = strstr(text, field);
  assert_non_null(line);
  return strtoull(line + strlen(field) + 1, NULL, 16);
}

/* ---- spawn ----------------------------------------------------------------- */

static void test_exit_status(void **state) {
  (void)state;
  /* Both by PATH lookup (execvp; macOS has no /bin/true, only /usr/bin/true);
   * spawn_sh below runs an absolute path, /bin/sh. */
  const char *t[] = {"true", NULL}, *f[] = {"false", NULL};
  mz_proc *p = spawn_ok(t, NULL, 0);
  int st = wait_exit(p, 5000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_true(mz_proc_pid(p) > 0);
  mz_proc_free(p);
  p = spawn_ok(f, NULL, 0);
  st = wait_exit(p, 5000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  mz_proc_free(p);
  p = spawn_sh("exit 3", NULL);
  st = wait_exit(p, 5000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 3);
  /* Later polls keep the status. */
  st = -1;
  assert_int_equal(mz_proc_poll(p, &st), 1);
  assert_int_equal(WEXITSTATUS(st), 3);
  assert_int_equal(mz_proc_poll(p, NULL), 1);
  mz_proc_free(p);
}

static void test_log_appends(void **state) {
  (void)state;
  char log[PATH_MAX], text[256];
  tmp_path("append.log", log, sizeof log);
  unlink(log);
  mz_proc *p = spawn_sh("echo out; echo err >&2", log);
  wait_exit(p, 5000);
  mz_proc_free(p);
  p = spawn_sh("echo second", log);
  wait_exit(p, 5000);
  mz_proc_free(p);
  read_file(log, text, sizeof text);
  assert_string_equal(text, "out\nerr\nsecond\n");
  struct stat sb;
  assert_int_equal(stat(log, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0644); /* umask is 022: see group_setup */
}

static void test_env_and_cwd(void **state) {
  (void)state;
  char log[PATH_MAX], text[PATH_MAX + 64], expect[PATH_MAX + 64], real[PATH_MAX];
  const char *argv[] = {"/bin/sh", "-c", "echo \"$MZ_TEST_VAR\"; pwd -P", NULL};
  const char *env[] = {"MZ_TEST_VAR=hello there", NULL};
  tmp_path("env.log", log, sizeof log);
  mz_spawn_opts o = {.argv = argv, .env = env, .cwd = tmpdir, .log_path = log};
  mz_proc *p = NULL;
  char err[256];
  assert_int_equal(mz_proc_spawn(&o, &p, err, sizeof err), 0);
  wait_exit(p, 5000);
  mz_proc_free(p);
  assert_non_null(realpath(tmpdir, real));
  snprintf(expect, sizeof expect, "hello there\n%s\n", real);
  read_file(log, text, sizeof text);
  assert_string_equal(text, expect);
  assert_null(getenv("MZ_TEST_VAR")); /* the parent's environment is untouched */
}

/* A failed spawn must leave nothing to reap: check with waitpid(-1). Every
 * earlier test reaped its children, so ECHILD is the only right answer. */
static void expect_spawn_error(const mz_spawn_opts *o, const char *needle, int err_no) {
  static char sentinel;
  mz_proc *p = (mz_proc *)(void *)&sentinel; /* must be reset to NULL */
  char err[512] = "";
  errno = 0;
  assert_int_equal(mz_proc_spawn(o, &p, err, sizeof err), -1);
  assert_int_equal(errno, err_no);
  assert_null(p);
  if (!strstr(err, needle)) print_error("message: %s\n", err);
  assert_non_null(strstr(err, needle));
  errno = 0;
  assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
  assert_int_equal(errno, ECHILD);
}

static void test_spawn_failures(void **state) {
  (void)state;
  char noexec[PATH_MAX], msg[PATH_MAX + 64];
  const char *missing[] = {"mirza-no-such-program", NULL};
  const char *absent[] = {"/nonexistent/prog", "x", NULL};
  const char *sh[] = {"true", NULL}; /* found on PATH: /usr/bin/true on macOS */
  mz_spawn_opts o = {.argv = missing};
  expect_spawn_error(&o, "cannot run 'mirza-no-such-program': No such file or directory", ENOENT);
  o.argv = absent;
  expect_spawn_error(&o, "cannot run '/nonexistent/prog': No such file or directory", ENOENT);

  tmp_path("not-executable", noexec, sizeof noexec);
  write_file(noexec, "echo hi\n");
  chmod(noexec, 0644);
  const char *ne[] = {noexec, NULL};
  o.argv = ne;
  snprintf(msg, sizeof msg, "cannot run '%s': Permission denied", noexec);
  expect_spawn_error(&o, msg, EACCES);

  o.argv = sh;
  o.cwd = "/nonexistent-dir";
  expect_spawn_error(&o, "cannot chdir to '/nonexistent-dir': No such file or directory", ENOENT);
  o.cwd = NULL;
  o.log_path = "/nonexistent-dir/x.log";
  expect_spawn_error(&o, "cannot run 'true': cannot open log '/nonexistent-dir/x.log'", ENOENT);
  const char *none[] = {NULL};
  mz_spawn_opts empty = {.argv = none};
  expect_spawn_error(&empty, "cannot run", EINVAL);
}

/* The child must start with default dispositions, an empty mask, and no
 * descriptors but 0, 1, 2, whatever the parent had. */
static void test_child_environment(void **state) {
  (void)state;
  struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe, old_term;
  sigset_t usr1, old_mask;
  sigaction(SIGPIPE, &ign, &old_pipe);
  sigaction(SIGTERM, &ign, &old_term);
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_BLOCK, &usr1, &old_mask);
  int leak = open("/dev/null", O_RDONLY); /* deliberately not CLOEXEC */
  assert_true(leak >= 0);

  const char *argv[] = {"/bin/sleep", "30", NULL};
  mz_proc *p = spawn_ok(argv, NULL, 0);
  pid_t pid = mz_proc_pid(p);
  close(leak);
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGPIPE, &old_pipe, NULL);

  /* Signals 32 and 33 are glibc's own (thread cancellation, setxid): its
   * sigaction refuses them, so a SIG_IGN on them (lua5.4's os.execute
   * leaves one) is inherited whatever we do, and glibc installs its own
   * handlers in the daemon anyway. Every other signal must be default. */
  const unsigned long long libc_reserved = 0x180000000ULL;
  /* its own process group's leader, /proc or not */
  assert_int_equal(getpgid(pid), pid);
  if (!have_proc()) { /* macOS: no /proc to read them from */
    print_message("no /proc: the child's signals and descriptors are not checked here\n");
    assert_int_equal(mz_proc_stop(p, 5000), 0);
    mz_proc_free(p);
    return;
  }
  assert_int_equal(status_mask(pid, "SigIgn:") & ~libc_reserved, 0);
  assert_int_equal(status_mask(pid, "SigBlk:"), 0);
  /* The dynamic loader of the new image briefly opens its libraries
   * (fd 3...), so look again until it has settled; an inherited fd would
   * stay open for good and still fail after the last look. */
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%ld/fd", (long)pid);
  int count = 0, high = 0;
  for (int tries = 0; tries < 100; tries++) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    count = high = 0;
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      high += atoi(e->d_name) > 2;
      count++;
    }
    closedir(d);
    if (!high) break;
    usleep(10000);
  }
  assert_int_equal(high, 0);
  assert_int_equal(count, 3);
  assert_int_equal(mz_proc_stop(p, 5000), 0);
  mz_proc_free(p);
}

/* ---- poll and stop --------------------------------------------------------- */

static void test_poll_nonblocking(void **state) {
  (void)state;
  const char *argv[] = {"/bin/sleep", "30", NULL};
  mz_proc *p = spawn_ok(argv, NULL, 0);
  int64_t t0 = now_ms();
  for (int i = 0; i < 100; i++) assert_int_equal(mz_proc_poll(p, NULL), 0);
  assert_true(now_ms() - t0 < 2000);
  mz_proc_stop(p, 5000);
  mz_proc_free(p);
}

static void test_stop_term(void **state) {
  (void)state;
  const char *argv[] = {"/bin/sleep", "30", NULL};
  mz_proc *p = spawn_ok(argv, NULL, 0);
  int64_t t0 = now_ms();
  assert_int_equal(mz_proc_stop(p, 10000), 0);
  assert_true(now_ms() - t0 < 5000); /* well under the grace period */
  int st = 0;
  assert_int_equal(mz_proc_poll(p, &st), 1);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
  /* Idempotent: same answer at once, status kept. */
  t0 = now_ms();
  assert_int_equal(mz_proc_stop(p, 10000), 0);
  assert_true(now_ms() - t0 < 1000);
  assert_int_equal(mz_proc_poll(p, &st), 1);
  assert_int_equal(WTERMSIG(st), SIGTERM);
  mz_proc_free(p);
}

static void test_stop_after_exit(void **state) {
  (void)state;
  mz_proc *p = spawn_sh("exit 5", NULL);
  wait_exit(p, 5000);
  assert_int_equal(mz_proc_stop(p, 1000), 0);
  int st = 0;
  assert_int_equal(mz_proc_poll(p, &st), 1);
  assert_int_equal(WEXITSTATUS(st), 5);
  mz_proc_free(p);
}

static void test_stop_needs_kill(void **state) {
  (void)state;
  char ready[PATH_MAX], script[PATH_MAX * 4];
  tmp_path("trap.ready", ready, sizeof ready);
  unlink(ready);
  /* The ready file proves the trap is set before we send SIGTERM. */
  snprintf(script, sizeof script, "trap '' TERM; echo $$ > %s.tmp && mv %s.tmp %s; sleep 30", ready, ready, ready);
  mz_proc *p = spawn_sh(script, NULL);
  wait_pid_file(ready);
  int64_t t0 = now_ms();
  assert_int_equal(mz_proc_stop(p, 300), 1);
  int64_t took = now_ms() - t0;
  assert_true(took >= 290);
  assert_true(took < 5000);
  int st = 0;
  assert_int_equal(mz_proc_poll(p, &st), 1);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  assert_int_equal(mz_proc_stop(p, 300), 1); /* idempotent */
  mz_proc_free(p);
}

/* The grandchild ignores SIGTERM while the leader dies of it: only the
 * group SIGKILL after reaping the leader can get it. */
static void test_stop_kills_grandchildren(void **state) {
  (void)state;
  char pidf[PATH_MAX], script[PATH_MAX * 4];
  tmp_path("grandchild.pid", pidf, sizeof pidf);
  unlink(pidf);
  snprintf(script, sizeof script, "sh -c 'trap \"\" TERM; echo $$ > %s.tmp && mv %s.tmp %s; exec sleep 300' & wait",
           pidf, pidf, pidf);
  mz_proc *p = spawn_sh(script, NULL);
  pid_t g = wait_pid_file(pidf);
  assert_true(mz_pid_alive(g));
  assert_int_equal(getpgid(g), mz_proc_pid(p));
  assert_int_equal(mz_proc_stop(p, 5000), 0);
  int ok = wait_gone(g, 5000);
  kill_quietly(g);
  assert_true(ok);
  mz_proc_free(p);
}

/* ---- lifetime tied to the parent (PR_SET_PDEATHSIG) -------------------------- */

/* Fork a middle process that spawns argv (default `sleep 300`) and
 * reports its pid. */
static pid_t spawn_argv_via_middle(const char *const *argv, int keep_alive, int grace_ms, pid_t *middle) {
  int fds[2];
  pid_t child = -1;
  assert_int_equal(pipe(fds), 0);
  pid_t m = fork();
  assert_true(m >= 0);
  if (m == 0) {
    mz_spawn_opts o = {.argv = argv, .keep_alive = keep_alive, .grace_ms = grace_ms};
    mz_proc *p;
    char err[256];
    close(fds[0]);
    if (mz_proc_spawn(&o, &p, err, sizeof err) == 0) child = mz_proc_pid(p);
    if (write(fds[1], &child, sizeof child) < 0) _exit(1);
    for (;;) pause(); /* until the test kills us */
  }
  close(fds[1]);
  assert_int_equal(read(fds[0], &child, sizeof child), (ssize_t)sizeof child);
  close(fds[0]);
  assert_true(child > 0);
  *middle = m;
  return child;
}

static pid_t spawn_via_middle(int keep_alive, pid_t *middle) {
  static const char *const argv[] = {"/bin/sleep", "300", NULL};
  return spawn_argv_via_middle(argv, keep_alive, 0, middle);
}

static void kill_middle(pid_t m) {
  assert_int_equal(kill(m, SIGKILL), 0);
  assert_int_equal(waitpid(m, NULL, 0), m);
}

static void test_pdeathsig(void **state) {
  (void)state;
  pid_t m;
  pid_t c = spawn_via_middle(0, &m);
  assert_true(mz_pid_alive(c));
  kill_middle(m);
  int ok = wait_gone(c, 5000);
  kill_quietly(c);
  assert_true(ok);
}

/* The watchdog (os_posix.c) goes further than PDEATHSIG's one SIGTERM: a
 * daemon that ignores SIGTERM gets SIGKILL after its grace, and so does
 * everything else in its group. */
static void test_watchdog_escalates(void **state) {
  (void)state;
  if (strcmp(mz_os_guard_kind, "watchdog") != 0) skip(); /* Linux: PR_SET_PDEATHSIG sends SIGTERM only */
  char pidf[PATH_MAX], script[PATH_MAX * 4];
  tmp_path("stubborn-daemon.pid", pidf, sizeof pidf);
  unlink(pidf);
  snprintf(script, sizeof script, "trap '' TERM; sleep 300 & echo $$ > %s.tmp && mv %s.tmp %s; wait", pidf, pidf, pidf);
  const char *const argv[] = {"/bin/sh", "-c", script, NULL};
  pid_t m;
  pid_t c = spawn_argv_via_middle(argv, 0, 200, &m);
  assert_int_equal(wait_pid_file(pidf), c); /* TERM ignored from now on */
  kill_middle(m);
  int ok = wait_gone(c, 5000);
  int64_t deadline = now_ms() + 5000; /* sleep and the watchdog: the whole group */
  while (kill(-c, 0) == 0 && now_ms() < deadline) nap_ms(10);
  int group_gone = kill(-c, 0) < 0 && errno == ESRCH;
  kill_quietly(c);
  kill(-c, SIGKILL);
  assert_true(ok);
  assert_true(group_gone);
}

/* A stop leaves nothing of the guard: no watchdog in the daemon's group,
 * none of ours unreaped; a free without a stop leaves the daemon running
 * (as on Linux), its watchdog gone. */
static void test_guard_cleanup(void **state) {
  (void)state;
  const char *argv[] = {"/bin/sleep", "300", NULL};
  mz_proc *p = spawn_ok(argv, NULL, 0);
  pid_t pid = mz_proc_pid(p);
  assert_int_equal(mz_proc_stop(p, 1000), 0);
  assert_true(kill(-pid, 0) < 0 && errno == ESRCH);
  mz_proc_free(p);
  p = spawn_ok(argv, NULL, 0);
  pid = mz_proc_pid(p);
  mz_proc_free(p);
  int alive = kill(pid, 0) == 0;
  kill(-pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
  assert_true(alive);
  errno = 0;
  assert_true(waitpid(-1, NULL, WNOHANG) <= 0); /* no watchdog of ours left to reap */
}

static void test_keep_alive_survives(void **state) {
  (void)state;
  pid_t m;
  pid_t c = spawn_via_middle(1, &m);
  kill_middle(m);
  nap_ms(300);
  int alive = !gone(c);
  int own_session = getsid(c) == c;
  assert_int_equal(mz_pid_stop(c, 5000), 0); /* it leads its group: group path */
  int ok = wait_gone(c, 5000);
  kill_quietly(c);
  assert_true(alive);
  assert_true(own_session);
  assert_true(ok);
}

/* ---- processes we did not spawn ---------------------------------------------- */

/* `sleep` started by a shell that exits at once: not our child, and in the
 * (dead) shell's group rather than leading one. */
static pid_t spawn_orphan(const char *inner, const char *pidf) {
  char script[PATH_MAX * 4];
  unlink(pidf);
  snprintf(script, sizeof script, inner, pidf, pidf, pidf);
  mz_proc *p = spawn_sh(script, NULL);
  int st = wait_exit(p, 5000);
  assert_int_equal(WEXITSTATUS(st), 0);
  mz_proc_free(p);
  return wait_pid_file(pidf);
}

static void test_pid_stop_nonchild(void **state) {
  (void)state;
  char pidf[PATH_MAX];
  tmp_path("orphan.pid", pidf, sizeof pidf);
  pid_t g = spawn_orphan("sleep 300 & echo $! > %s.tmp && mv %s.tmp %s", pidf);
  assert_true(mz_pid_alive(g));
  assert_true(getpgid(g) != g);
  int64_t t0 = now_ms();
  int r = mz_pid_stop(g, 5000);
  int64_t took = now_ms() - t0;
  int ok = gone(g);
  kill_quietly(g);
  assert_int_equal(r, 0);
  assert_true(ok);
  assert_true(took < 4000); /* SIGTERM sufficed */
}

static void test_pid_stop_needs_kill(void **state) {
  (void)state;
  char pidf[PATH_MAX];
  tmp_path("stubborn.pid", pidf, sizeof pidf);
  pid_t g = spawn_orphan("sh -c 'trap \"\" TERM; echo $$ > %s.tmp && mv %s.tmp %s; "
                         "exec sleep 300' &",
                         pidf);
  int64_t t0 = now_ms();
  int r = mz_pid_stop(g, 200);
  int64_t took = now_ms() - t0;
  int ok = gone(g);
  kill_quietly(g);
  assert_int_equal(r, 0);
  assert_true(ok);
  assert_true(took >= 190);
}

static void test_pid_stop_edges(void **state) {
  (void)state;
  const char *argv[] = {"true", NULL}; /* PATH lookup: /usr/bin/true on macOS */
  mz_proc *p = spawn_ok(argv, NULL, 0);
  pid_t dead = mz_proc_pid(p);
  wait_exit(p, 5000);
  mz_proc_free(p);
  assert_int_equal(mz_pid_stop(dead, 100), 0); /* ESRCH counts as gone */
  assert_false(mz_pid_alive(dead));
  errno = 0;
  assert_int_equal(mz_pid_stop(0, 100), -1);
  assert_int_equal(errno, EINVAL);
  assert_int_equal(mz_pid_stop(-1, 100), -1);
  assert_int_equal(mz_pid_stop(getpid(), 100), -1);
  assert_false(mz_pid_alive(0));
  assert_false(mz_pid_alive(-1));
  assert_true(mz_pid_alive(getpid()));
  assert_true(mz_pid_alive(1));
}

/* ---- status strings ------------------------------------------------------------ */

static void test_status_describe(void **state) {
  (void)state;
  char buf[128];
  assert_string_equal(mz_status_describe(0, buf, sizeof buf), "exited with status 0");
  assert_string_equal(mz_status_describe(1 << 8, buf, sizeof buf), "exited with status 1");
  assert_string_equal(mz_status_describe(SIGKILL, buf, sizeof buf), "killed by signal 9 (Killed)");
  assert_string_equal(mz_status_describe(SIGTERM, buf, sizeof buf), "killed by signal 15 (Terminated)");
  assert_string_equal(mz_status_describe(SIGSEGV | 0x80, buf, sizeof buf),
                      "killed by signal 11 (Segmentation fault), core dumped");
  assert_string_equal(mz_status_describe((SIGSTOP << 8) | 0x7f, buf, sizeof buf),
                      "stopped by signal 19 (Stopped (signal))");
  char small[8];
  assert_ptr_equal(mz_status_describe(1 << 8, small, sizeof small), small);
  assert_string_equal(small, "exited ");
  /* And a real one. */
  mz_proc *p = spawn_sh("exit 42", NULL);
  assert_string_equal(mz_status_describe(wait_exit(p, 5000), buf, sizeof buf), "exited with status 42");
  mz_proc_free(p);
}

/* ---- log tail -------------------------------------------------------------------- */

static void tail_is(const char *content, int n, const char *expect) {
  char path[PATH_MAX], buf[256];
  tmp_path("tail.txt", path, sizeof path);
  write_file(path, content);
  assert_string_equal(mz_file_tail(path, n, buf, sizeof buf), expect);
}

static void test_tail_small(void **state) {
  (void)state;
  tail_is("a\nb\nc\n", 2, "b\nc\n");
  tail_is("a\nb\nc\n", 1, "c\n");
  tail_is("a\nb\nc\n", 10, "a\nb\nc\n");
  tail_is("a\nb\nc\n", 0, "");
  tail_is("a\nb\nc", 2, "b\nc");
  tail_is("a\n\n\n", 2, "\n\n");
  tail_is("", 3, "");
  tail_is("hello world\n", 1, "hello world\n");
  char buf[8] = "junk";
  assert_string_equal(mz_file_tail("/nonexistent/log", 5, buf, sizeof buf), "");
  /* Too long for buf: the end of it, len - 1 bytes. */
  char path[PATH_MAX];
  tmp_path("tail.txt", path, sizeof path);
  write_file(path, "a\nb\nhello world\n");
  assert_string_equal(mz_file_tail(path, 1, buf, sizeof buf), " world\n");
  /* ...without starting inside a UTF-8 character ("é" is 2 bytes). */
  write_file(path, "x\n\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\n");
  assert_string_equal(mz_file_tail(path, 1, buf, sizeof buf), "\xc3\xa9\xc3\xa9\xc3\xa9\n");
}

static void test_tail_big(void **state) {
  (void)state;
  char path[PATH_MAX], line[32];
  static char buf[80 * 1024];
  tmp_path("big.log", path, sizeof path);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 20000; i++) fprintf(f, "line %05d\n", i); /* 220 kB */
  fclose(f);
  assert_string_equal(mz_file_tail(path, 3, buf, sizeof buf), "line 19997\nline 19998\nline 19999\n");
  /* Asking for more than the 64 KiB window holds: whole lines only. */
  size_t n = strlen(mz_file_tail(path, 100000, buf, sizeof buf));
  assert_true(n > 60000 && n <= 64 * 1024);
  assert_int_equal(n % 11, 0);
  assert_memory_equal(buf, "line ", 5);
  snprintf(line, sizeof line, "line %05d\n", 20000 - (int)(n / 11));
  assert_memory_equal(buf, line, 11);
  /* One 100 kB line without newline: its last 64 KiB. */
  f = fopen(path, "w");
  for (int i = 0; i < 100000; i++) fputc('x', f);
  fclose(f);
  assert_int_equal(strlen(mz_file_tail(path, 2, buf, sizeof buf)), 64 * 1024);
}

/* ---- pid files --------------------------------------------------------------------- */

static pid_t read_with(const char *content) {
  char path[PATH_MAX];
  assert_non_null(mz_pidfile_path(8123, path, sizeof path));
  write_file(path, content);
  return mz_pidfile_read(8123);
}

static void test_pidfile_xdg(void **state) {
  (void)state;
  char xdg[PATH_MAX], path[PATH_MAX], expect[PATH_MAX + 32], text[64], dir[PATH_MAX + 8];
  tmp_path("xdg", xdg, sizeof xdg);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  snprintf(expect, sizeof expect, "%s/mirza/daemon-8123.pid", xdg);
  assert_string_equal(mz_pidfile_path(8123, path, sizeof path), expect);
  char tiny[10];
  assert_null(mz_pidfile_path(8123, tiny, sizeof tiny));
  assert_int_equal(mz_pidfile_read(8123), 0);
  assert_int_equal(mz_pidfile_write(8123, 4242), 0);
  assert_int_equal(mz_pidfile_read(8123), 4242);
  read_file(path, text, sizeof text);
  assert_string_equal(text, "4242\n");
  snprintf(dir, sizeof dir, "%s/mirza", xdg);
  struct stat sb;
  assert_int_equal(stat(dir, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0700);
  assert_int_equal(mz_pidfile_write(8123, 4343), 0); /* replaces */
  assert_int_equal(mz_pidfile_read(8123), 4343);
  DIR *d = opendir(dir); /* no temporary file left over */
  int files = 0;
  for (struct dirent *e; (e = readdir(d));) files += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(files, 1);
  assert_int_equal(mz_pidfile_remove(8123), 0);
  assert_int_equal(mz_pidfile_read(8123), 0);
  assert_int_equal(mz_pidfile_remove(8123), 0); /* absent is fine */
  errno = 0;
  assert_int_equal(mz_pidfile_write(8123, 0), -1);
  assert_int_equal(errno, EINVAL);
}

static void test_pidfile_validation(void **state) {
  (void)state;
  char xdg[PATH_MAX];
  setenv("XDG_RUNTIME_DIR", tmp_path("xdg", xdg, sizeof xdg), 1);
  assert_int_equal(mz_pidfile_write(8123, 1), 0); /* creates the directory */
  assert_int_equal(read_with("77"), 77);
  assert_int_equal(read_with("77\n"), 77);
  assert_int_equal(read_with(""), 0);
  assert_int_equal(read_with("abc\n"), 0);
  assert_int_equal(read_with("0\n"), 0);
  assert_int_equal(read_with("-5\n"), 0);
  assert_int_equal(read_with(" 5\n"), 0);
  assert_int_equal(read_with("12x\n"), 0);
  assert_int_equal(read_with("12\n\n"), 0);
  assert_int_equal(read_with("99999999999999999999\n"), 0);
  assert_int_equal(mz_pidfile_remove(8123), 0);
}

/* A directory others can write to is refused: its pid files are orders to
 * kill, and anyone could have written them. */
static void test_pidfile_unsafe_dir(void **state) {
  (void)state;
  char xdg[PATH_MAX], dir[PATH_MAX + 8], path[PATH_MAX];
  tmp_path("xdg-unsafe", xdg, sizeof xdg);
  snprintf(dir, sizeof dir, "%s/mirza", xdg);
  mkdir(xdg, 0700);
  mkdir(dir, 0700);
  assert_int_equal(chmod(dir, 0777), 0);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  assert_int_equal(mz_pidfile_write(9000, 55), -1);
  assert_non_null(mz_pidfile_path(9000, path, sizeof path));
  write_file(path, "55\n");
  assert_int_equal(mz_pidfile_read(9000), 0);
}

static void test_pidfile_fallback(void **state) {
  (void)state;
  char path[PATH_MAX], expect[PATH_MAX];
  snprintf(expect, sizeof expect, "/tmp/mirza-%u/daemon-0.pid", (unsigned)getuid());
  setenv("XDG_RUNTIME_DIR", "relative/dir", 1); /* ignored, like an empty one */
  assert_string_equal(mz_pidfile_path(0, path, sizeof path), expect);
  setenv("XDG_RUNTIME_DIR", "", 1);
  assert_string_equal(mz_pidfile_path(0, path, sizeof path), expect);
  unsetenv("XDG_RUNTIME_DIR");
  assert_string_equal(mz_pidfile_path(0, path, sizeof path), expect);
  assert_null(mz_pidfile_path(-1, path, sizeof path));
  assert_null(mz_pidfile_path(65536, path, sizeof path));
  /* Port 0: no real daemon's file gets touched. */
  assert_int_equal(mz_pidfile_write(0, 31337), 0);
  assert_int_equal(mz_pidfile_read(0), 31337);
  assert_int_equal(mz_pidfile_remove(0), 0);
  assert_int_equal(mz_pidfile_read(0), 0);
}

/* ---- setup ------------------------------------------------------------------------ */

static int group_setup(void **state) {
  (void)state;
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  saved_xdg = xdg ? strdup(xdg) : NULL;
  umask(022);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mz-supervisor-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int restore_xdg(void **state) {
  (void)state;
  if (saved_xdg) setenv("XDG_RUNTIME_DIR", saved_xdg, 1);
  else unsetenv("XDG_RUNTIME_DIR");
  return 0;
}

/* rm -rf through the supervisor itself. */
static int group_teardown(void **state) {
  const char *argv[] = {"/bin/rm", "-rf", tmpdir, NULL};
  mz_spawn_opts o = {.argv = argv};
  mz_proc *p;
  char err[256];
  int64_t deadline = now_ms() + 10000;
  restore_xdg(state);
  free(saved_xdg);
  if (mz_proc_spawn(&o, &p, err, sizeof err) < 0) return -1;
  while (!mz_proc_poll(p, NULL) && now_ms() < deadline) nap_ms(5);
  mz_proc_stop(p, 1000); /* only if rm is somehow stuck */
  mz_proc_free(p);
  return 0;
}

/* ---- who listens on a port ------------------------------------------------ */

/* A socket of ours listening on loopback (family AF_INET or AF_INET6) on a
 * free port picked by the kernel; its port in *port. */
static int listen_loopback(int family, int *port) {
  struct sockaddr_storage ss;
  socklen_t len;
  memset(&ss, 0, sizeof ss);
  if (family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof *a;
  } else {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    len = sizeof *a;
  }
  int fd = mz_os_socket(family, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&ss, len), 0);
  assert_int_equal(listen(fd, 4), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
  *port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port : ((struct sockaddr_in6 *)&ss)->sin6_port);
  return fd;
}

/* A build that cannot tell (os_none.c) says so, for any pid and port. */
static void test_pid_listens_unknown(int port) {
  errno = 0;
  assert_int_equal(mz_pid_listens(getpid(), port), -1);
  assert_int_equal(errno, ENOSYS);
}

static void test_pid_listens(void **state) {
  (void)state;
  int port;
  int fd = listen_loopback(AF_INET, &port);
  if (strcmp(mz_os_facts, "none") == 0) {
    test_pid_listens_unknown(port);
    close(fd);
    assert_int_equal(mz_pid_listens(0, 80), -1);
    assert_int_equal(errno, EINVAL);
    return;
  }
  assert_int_equal(mz_pid_listens(getpid(), port), 1);
  /* another process (a child of ours without the socket) does not */
  const char *argv[] = {"sleep", "30", NULL};
  mz_proc *p = spawn_ok(argv, NULL, 0);
  assert_int_equal(mz_pid_listens(mz_proc_pid(p), port), 0);
  mz_proc_stop(p, 1000);
  mz_proc_free(p);
  /* a port nobody listens on, once closed */
  close(fd);
  assert_int_equal(mz_pid_listens(getpid(), port), 0);
  /* IPv6 loopback (skipped where the host has no IPv6) */
  int fd6 = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd6 >= 0) {
    close(fd6);
    fd6 = listen_loopback(AF_INET6, &port);
    assert_int_equal(mz_pid_listens(getpid(), port), 1);
    close(fd6);
  }
  assert_int_equal(mz_pid_listens(0, 80), -1);
  assert_int_equal(errno, EINVAL);
  assert_int_equal(mz_pid_listens(getpid(), 0), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exit_status),
      cmocka_unit_test(test_spawn_failures),
      cmocka_unit_test(test_log_appends),
      cmocka_unit_test(test_env_and_cwd),
      cmocka_unit_test(test_child_environment),
      cmocka_unit_test(test_poll_nonblocking),
      cmocka_unit_test(test_stop_term),
      cmocka_unit_test(test_stop_after_exit),
      cmocka_unit_test(test_stop_needs_kill),
      cmocka_unit_test(test_stop_kills_grandchildren),
      cmocka_unit_test(test_pdeathsig),
      cmocka_unit_test(test_watchdog_escalates),
      cmocka_unit_test(test_guard_cleanup),
      cmocka_unit_test(test_keep_alive_survives),
      cmocka_unit_test(test_pid_stop_nonchild),
      cmocka_unit_test(test_pid_stop_needs_kill),
      cmocka_unit_test(test_pid_stop_edges),
      cmocka_unit_test(test_status_describe),
      cmocka_unit_test(test_tail_small),
      cmocka_unit_test(test_tail_big),
      cmocka_unit_test_teardown(test_pidfile_xdg, restore_xdg),
      cmocka_unit_test_teardown(test_pidfile_validation, restore_xdg),
      cmocka_unit_test_teardown(test_pidfile_unsafe_dir, restore_xdg),
      cmocka_unit_test_teardown(test_pidfile_fallback, restore_xdg),
      cmocka_unit_test(test_pid_listens),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
