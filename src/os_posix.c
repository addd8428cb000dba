/*
 * os_posix.c - os.h's mechanisms with POSIX calls only: macOS, and Linux
 * built with -DMIRZA_PORTABLE (which is how CI runs this file).
 *
 * Close-on-exec is set with fcntl right after the call that made the
 * descriptor. mirza forks and execs from one thread, so no other thread
 * can exec in between (libcurl's resolver threads never fork).
 *
 * The parent-death guard is a watchdog process (os.h has the protocol).
 * It is a fork of mirza that never execs and calls only async-signal-safe
 * functions: fork in a process that used libcurl, or on macOS
 * CoreFoundation, leaves locks in an unknown state, which those functions
 * never touch.
 */
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char mz_os_guard_kind[] = "watchdog";

#define FD_CLOSE_LIMIT 65536 /* the close loop never goes past this */
#define WATCH_STEP_MS 20     /* the watchdog's look at a dying daemon */

static int cloexec(int fd) {
  int fl = fcntl(fd, F_GETFD);
  return fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0 ? -1 : 0;
}

/* close() keeping errno, for cleanups on a path that reports it. */
static void close_keep_errno(int fd) {
  int e = errno;
  if (fd >= 0) close(fd);
  errno = e;
}

int mz_os_pipe(int fd[2]) {
  if (pipe(fd) < 0) return -1;
  if (cloexec(fd[0]) == 0 && cloexec(fd[1]) == 0) return 0;
  close_keep_errno(fd[0]);
  close_keep_errno(fd[1]);
  return -1;
}

int mz_os_socket(int domain, int type, int protocol) {
  int fd = socket(domain, type, protocol);
  if (fd < 0 || cloexec(fd) == 0) return fd;
  close_keep_errno(fd);
  return -1;
}

void mz_os_close_from3(int keep) {
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > FD_CLOSE_LIMIT) max = FD_CLOSE_LIMIT;
  for (int fd = 3; fd < max; fd++) {
    if (fd != keep) close(fd);
  }
}

/* ---- the watchdog --------------------------------------------------------------- */

/* Move fd to >= 3 (keeping CLOEXEC): the watchdog closes 0..2. */
static int fd_high(int fd) {
  if (fd < 0 || fd >= 3) return fd;
  int hi = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close_keep_errno(fd);
  return hi;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static void set_signal(int sig, void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

/* The watchdog's life: join the daemon's group, hold nothing of mirza's but
 * the pipe, wait for its EOF, then stop the group. After mirza's death the
 * daemon is re-parented and reaped by init, so kill(pid, 0) failing is how
 * its end shows. */
static _Noreturn void watchdog_run(pid_t group, int life, int grace_ms) {
  char b;
  sigset_t none;
  if (setpgid(0, group) < 0) _exit(0); /* the daemon is gone already */
  for (int s = 1; s < NSIG; s++) {
    if (s != SIGKILL && s != SIGSTOP) set_signal(s, SIG_DFL);
  }
  set_signal(SIGTERM, SIG_IGN); /* its own group's SIGTERM is not for it */
  set_signal(SIGINT, SIG_IGN);
  set_signal(SIGHUP, SIG_IGN);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int fd = 0; fd < 3; fd++) close(fd); /* a pipe of mirza's stdout would not see its EOF */
  mz_os_close_from3(life);
  for (;;) {
    ssize_t n = read(life, &b, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  kill(-group, SIGTERM);
  for (int waited = 0; waited < grace_ms && kill(group, 0) == 0; waited += WATCH_STEP_MS) sleep_ms(WATCH_STEP_MS);
  kill(-group, SIGKILL); /* the watchdog too */
  _exit(0);
}

int mz_os_guard_open(mz_os_guard *g) {
  g->go[0] = g->go[1] = g->life = -1;
  g->watchdog = 0;
  if (mz_os_pipe(g->go) < 0) return -1;
  g->go[0] = fd_high(g->go[0]);
  g->go[1] = fd_high(g->go[1]);
  if (g->go[0] >= 0 && g->go[1] >= 0) return 0;
  mz_os_guard_end(g);
  return -1;
}

/* The child waits for the go: a byte once the watchdog is up, EOF when the
 * parent died or could not start it. */
int mz_os_guard_child(mz_os_guard *g, pid_t parent) {
  char b;
  ssize_t n;
  close(g->go[1]);
  do n = read(g->go[0], &b, 1);
  while (n < 0 && errno == EINTR);
  close(g->go[0]);
  if (n == 1) return 0;
  if (getppid() != parent) _exit(127); /* orphaned: nobody to serve, nobody to tell */
  return errno = ECHILD, -1;
}

/* Start the watchdog: a fork that runs watchdog_run with the pipe's read
 * end. Returns its pid, or -1 (errno) with both ends closed; on success
 * *life holds the write end. */
static pid_t watchdog_start(pid_t child, int grace_ms, int *life) {
  int fd[2];
  if (mz_os_pipe(fd) < 0) return -1;
  fd[0] = fd_high(fd[0]);
  fd[1] = fd_high(fd[1]);
  pid_t w = fd[0] < 0 || fd[1] < 0 ? -1 : fork();
  if (w == 0) watchdog_run(child, fd[0], grace_ms);
  if (w > 0) setpgid(w, child); /* as the watchdog does: whichever runs first */
  close_keep_errno(fd[0]);
  if (w > 0) *life = fd[1];
  else close_keep_errno(fd[1]);
  return w;
}

/* The go byte to the child: 0, or an errno. A child that failed before
 * reading it (its setpgid) has closed the pipe: EPIPE, not a SIGPIPE that
 * would end a stock lua5.4. */
static int send_go(int fd) {
  struct sigaction ign, old;
  char b = 1;
  ssize_t n;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &old);
  do n = write(fd, &b, 1);
  while (n < 0 && errno == EINTR);
  int e = n == 1 ? 0 : n < 0 ? errno : EIO;
  sigaction(SIGPIPE, &old, NULL);
  return e;
}

/* The life pipe is made after the child's fork, so the daemon never holds
 * its write end (an end it held would keep the watchdog from seeing EOF). */
int mz_os_guard_parent(mz_os_guard *g, pid_t child, int grace_ms) {
  close(g->go[0]);
  g->go[0] = -1;
  pid_t w = watchdog_start(child, grace_ms, &g->life);
  int e = w < 0 ? errno : 0;
  if (w > 0) {
    g->watchdog = w;
    e = send_go(g->go[1]);
  }
  close(g->go[1]); /* without the byte: the child's EOF, it fails */
  g->go[1] = -1;
  return e ? (errno = e, -1) : 0;
}

/* The watchdog stands down: killed while it still waits on the pipe (the
 * pipe is closed only after, so it never sees an EOF and stops the
 * group), then reaped. After mz_proc_stop's final SIGKILL of the group it
 * is dead already; after a free without a stop the daemon runs on, as it
 * does on Linux. */
void mz_os_guard_end(mz_os_guard *g) {
  for (int i = 0; i < 2; i++) {
    if (g->go[i] >= 0) close(g->go[i]);
    g->go[i] = -1;
  }
  if (g->watchdog > 0) {
    kill(g->watchdog, SIGKILL);
    while (waitpid(g->watchdog, NULL, 0) < 0 && errno == EINTR) {}
  }
  g->watchdog = 0;
  if (g->life >= 0) close(g->life);
  g->life = -1;
}
