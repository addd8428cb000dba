/*
 * supervisor.c - child processes for daemons, without Lua.
 *
 * A daemon is started with fork + execvp (never a shell) as the leader of a
 * process group of its own, so that stopping it can signal everything it
 * started. Without keep_alive it is also guarded: if mirza dies, even by
 * SIGKILL, the daemon is stopped (os.h: PR_SET_PDEATHSIG on Linux, a
 * watchdog process elsewhere). Exec failures
 * travel back through a CLOEXEC pipe, so a missing program is an error of
 * mz_proc_spawn itself rather than a child that dies a moment later.
 *
 * Stopping is SIGTERM to the group, a grace period spent reaping, then
 * SIGKILL; after the leader is gone the group gets one more SIGKILL so that
 * no helper a daemon forked outlives it. Daemons we did not start (adopted
 * through a pid file) are stopped the same way, but we cannot reap them, so
 * "gone" also means "zombie waiting for someone else's wait()".
 *
 * The rest is small file plumbing: the tail of a log for error messages.
 * The per-port pid files and mkdir -p are pidfile.c's. mirza is
 * single-threaded; nothing here is meant to be called from two threads at
 * once (PDEATHSIG, for instance, fires when the *thread* that forked dies,
 * not the process). What differs between systems is os.h's.
 */
#include "supervisor.h"
#include "nofile.h"
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct mz_proc {
  pid_t pid;         /* also the process group id */
  int exited;        /* reaped: status is final */
  int status;        /* raw wait status once exited */
  int stopped;       /* mz_proc_stop has run to the end */
  int stop_result;   /* what it returned, for idempotent calls */
  mz_os_guard guard; /* dies with mirza (not for keep_alive) */
};

#define POLL_STEP_MS 10      /* sleep between checks while stopping */
#define KILL_WAIT_MS 2000    /* how long SIGKILL may take to show */
#define TAIL_MAX (64 * 1024) /* mz_file_tail reads at most this much */

/* ---- time --------------------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleep ms milliseconds even when signals (SIGCHLD...) interrupt us. */
static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* ---- spawning: the child side ------------------------------------------- */

/* What the child sends back through the pipe when it cannot exec. */
enum { STEP_FORK, STEP_SETUP, STEP_GUARD, STEP_STDIO, STEP_CHDIR, STEP_EXEC };
struct child_err {
  int step;
  int err;
};

static _Noreturn void child_fail(int errfd, int step) {
  struct child_err ce = {step, errno};
  ssize_t n;
  do n = write(errfd, &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  _exit(127);
}

/* Dispositions set to SIG_IGN survive exec (SIGPIPE is a classic one), and
 * so does the signal mask: a daemon must start with the defaults. */
static void child_reset_signals(void) {
  struct sigaction sa;
  sigset_t none;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int s = 1; s < NSIG; s++) {
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, NULL); /* EINVAL for libc-reserved ones: fine */
  }
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

/* dup2 to a standard descriptor. The parent made sure fd >= 3, so it can't
 * be clobbered by an earlier dup2 and dup2 always clears FD_CLOEXEC. */
static int child_stdio(int nullfd, int logfd) {
  if (dup2(nullfd, STDIN_FILENO) < 0) return -1;
  if (dup2(logfd, STDOUT_FILENO) < 0) return -1;
  return dup2(logfd, STDERR_FILENO) < 0 ? -1 : 0;
}

/* Runs in the forked child and never returns. Order matters: the group
 * comes first (once the parent hears back, kill(-pid) must reach us), and
 * signals are reset before the guard is armed (its SIGTERM must kill).
 * Every descriptor >= 3 but the error pipe is closed before exec: libcurl
 * sockets and the like are not necessarily CLOEXEC, and a daemon holding
 * our connections open would keep them alive after we close them. */
static _Noreturn void child_run(const mz_spawn_opts *o, mz_os_guard *g, pid_t parent, int nullfd, int logfd,
                                int errfd) {
  if ((o->keep_alive ? setsid() : setpgid(0, 0)) < 0) child_fail(errfd, STEP_SETUP);
  child_reset_signals();
  if (!o->keep_alive && mz_os_guard_child(g, parent) < 0) child_fail(errfd, STEP_GUARD);
  if (child_stdio(nullfd, logfd) < 0) child_fail(errfd, STEP_STDIO);
  if (o->cwd && chdir(o->cwd) < 0) child_fail(errfd, STEP_CHDIR);
  for (const char *const *e = o->env; e && *e; e++)
    putenv((char *)*e); /* our private copy of memory; exec copies environ */
  mz_os_close_from3(errfd);
  mz_nofile_restore(); /* the limit mirza started with, not the one it raised for its streams */
  execvp(o->argv[0], (char *const *)o->argv);
  child_fail(errfd, STEP_EXEC);
}

/* ---- spawning: the parent side ------------------------------------------ */

/* Move fd to >= 3 (keeping CLOEXEC) so the child's dup2 onto 0..2 never
 * overwrites it: possible when mirza runs with a standard fd closed. */
static int fd_high(int fd) {
  if (fd < 0 || fd >= 3) return fd;
  int hi = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int e = errno;
  close(fd);
  errno = e;
  return hi;
}

static void spawn_error(char *err, size_t len, const char *prog, const char *what, const char *arg, int e) {
  if (!err || len == 0) return;
  if (what && arg) snprintf(err, len, "cannot run '%s': %s '%s': %s", prog, what, arg, strerror(e));
  else if (what) snprintf(err, len, "cannot run '%s': %s: %s", prog, what, strerror(e));
  else snprintf(err, len, "cannot run '%s': %s", prog, strerror(e));
}

/* The descriptors a spawn needs, all CLOEXEC and >= 3; -1 when unused. */
struct spawn_fds {
  int null, log, rd, wr;
};

static void close_fds(struct spawn_fds *f) {
  if (f->log >= 0 && f->log != f->null) close(f->log);
  if (f->null >= 0) close(f->null);
  if (f->rd >= 0) close(f->rd);
  if (f->wr >= 0) close(f->wr);
  f->null = f->log = f->rd = f->wr = -1;
}

/* Report a failed open_fds step (errno still set by it) and undo. */
static int open_fail(struct spawn_fds *f, char *err, size_t len, const char *prog, const char *what, const char *arg) {
  int e = errno;
  spawn_error(err, len, prog, what, arg, e);
  close_fds(f);
  errno = e;
  return -1;
}

/* Open /dev/null, the log and the error pipe in the parent, where a failure
 * is simple to report. Returns 0, or -1 with errno and the message in err. */
static int open_fds(const mz_spawn_opts *o, struct spawn_fds *f, char *err, size_t len) {
  int pfd[2];
  const char *prog = o->argv[0];
  f->null = f->log = f->rd = f->wr = -1;
  f->null = fd_high(open("/dev/null", O_RDWR | O_CLOEXEC));
  if (f->null < 0) return open_fail(f, err, len, prog, "cannot open", "/dev/null");
  f->log = o->log_path ? fd_high(open(o->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) : f->null;
  if (f->log < 0) return open_fail(f, err, len, prog, "cannot open log", o->log_path);
  if (mz_os_pipe(pfd) < 0) return open_fail(f, err, len, prog, "pipe", NULL);
  f->rd = fd_high(pfd[0]);
  f->wr = fd_high(pfd[1]);
  if (f->rd < 0 || f->wr < 0) return open_fail(f, err, len, prog, "pipe", NULL);
  return 0;
}

/* Wait for the child's verdict: 0 bytes (EOF) means exec succeeded and
 * closed the pipe; a struct means it failed and is exiting. */
static int read_verdict(int fd, struct child_err *ce) {
  ssize_t n;
  do n = read(fd, ce, sizeof *ce);
  while (n < 0 && errno == EINTR);
  if (n == 0) return 0;
  if (n != (ssize_t)sizeof *ce) *ce = (struct child_err){STEP_SETUP, n < 0 ? errno : EIO};
  return -1;
}

static void verdict_error(const mz_spawn_opts *o, const struct child_err *ce, char *err, size_t len) {
  const char *prog = o->argv[0];
  switch (ce->step) {
  case STEP_EXEC: spawn_error(err, len, prog, NULL, NULL, ce->err); break;
  case STEP_CHDIR: spawn_error(err, len, prog, "cannot chdir to", o->cwd, ce->err); break;
  case STEP_STDIO: spawn_error(err, len, prog, "redirecting stdio", NULL, ce->err); break;
  case STEP_FORK: spawn_error(err, len, prog, "fork", NULL, ce->err); break;
  case STEP_GUARD: spawn_error(err, len, prog, "cannot guard it against mirza's death", NULL, ce->err); break;
  default: spawn_error(err, len, prog, "child setup", NULL, ce->err); break;
  }
}

/* Reap a child that is known to be exiting, retrying on EINTR. */
static void reap_blocking(pid_t pid) {
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

/* Fork and wait for the child's verdict; closes every fd in f. Returns the
 * pid of a child that has exec'd, guarded by g unless keep_alive, or -1
 * (errno, message in err) with the failed child already reaped and g
 * released. */
static pid_t fork_exec(const mz_spawn_opts *o, mz_os_guard *g, struct spawn_fds *f, char *err, size_t len) {
  struct child_err ce = {STEP_FORK, 0};
  int guard_err = 0;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) child_run(o, g, parent, f->null, f->log, f->wr);
  ce.err = errno;
  close(f->wr);
  f->wr = -1;
  /* Same call as the child's, so whichever runs first wins and the other
   * fails harmlessly. Not for keep_alive: setsid() fails on a leader. */
  if (pid > 0 && !o->keep_alive) setpgid(pid, pid);
  if (pid > 0 && !o->keep_alive && mz_os_guard_parent(g, pid, o->grace_ms) < 0) guard_err = errno;
  int failed = pid < 0 || read_verdict(f->rd, &ce) < 0;
  close_fds(f);
  if (!failed) return pid;
  if (pid > 0) reap_blocking(pid);
  mz_os_guard_end(g);
  if (guard_err) ce = (struct child_err){STEP_GUARD, guard_err};
  verdict_error(o, &ce, err, len);
  errno = ce.err;
  return -1;
}

/* Invariant on return 0: the child has exec'd and leads its own process
 * group (setpgid/setsid ran before exec, and we waited for exec). On -1 no
 * child exists any more. The handle is allocated after the fork so that a
 * failed child has nothing of ours to leak (valgrind checks it at _exit). */
int mz_proc_spawn(const mz_spawn_opts *o, mz_proc **out, char *err, size_t errlen) {
  struct spawn_fds f;
  mz_os_guard g = {{-1, -1}, -1, 0};
  *out = NULL;
  if (!o || !o->argv || !o->argv[0]) {
    spawn_error(err, errlen, "(none)", NULL, NULL, EINVAL);
    return errno = EINVAL, -1;
  }
  if (open_fds(o, &f, err, errlen) < 0) return -1;
  if (!o->keep_alive && mz_os_guard_open(&g) < 0) return open_fail(&f, err, errlen, o->argv[0], "pipe", NULL);
  pid_t pid = fork_exec(o, &g, &f, err, errlen);
  if (pid < 0) return -1;
  mz_proc *p = calloc(1, sizeof *p);
  if (!p) { /* nobody could ever stop it: don't leave it running */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    reap_blocking(pid);
    mz_os_guard_end(&g);
    spawn_error(err, errlen, o->argv[0], NULL, NULL, ENOMEM);
    return errno = ENOMEM, -1;
  }
  p->pid = pid;
  p->guard = g;
  *out = p;
  return 0;
}

/* ---- reaping and stopping our own children ------------------------------ */

pid_t mz_proc_pid(const mz_proc *p) { return p ? p->pid : -1; }

/* One waitpid. ECHILD means somebody else reaped the child (SIGCHLD set to
 * SIG_IGN, a stray waitpid(-1)): it is gone, its status unknown, so 0. */
static void proc_reap(mz_proc *p, int flags) {
  int st = 0;
  pid_t r;
  do r = waitpid(p->pid, &st, flags);
  while (r < 0 && errno == EINTR);
  if (r == p->pid && (WIFEXITED(st) || WIFSIGNALED(st))) {
    p->exited = 1;
    p->status = st;
  } else if (r < 0 && errno == ECHILD) {
    p->exited = 1;
    p->status = 0;
  }
}

int mz_proc_poll(mz_proc *p, int *status) {
  if (!p->exited) proc_reap(p, WNOHANG);
  if (p->exited && status) *status = p->status;
  return p->exited;
}

/* Signal the group; fall back to the pid if there is no such group. */
static void signal_group(pid_t pid, int sig) {
  if (kill(-pid, sig) < 0 && errno == ESRCH) kill(pid, sig);
}

/* Poll until the child exits or ms elapse; returns mz_proc_poll's answer. */
static int proc_wait(mz_proc *p, int ms) {
  int64_t deadline = now_ms() + (ms > 0 ? ms : 0);
  while (!mz_proc_poll(p, NULL)) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return 0;
    sleep_ms(left < POLL_STEP_MS ? (int)left : POLL_STEP_MS);
  }
  return 1;
}

/* SIGTERM to the group of a child not reaped yet (so the pid is still
 * ours), without waiting: the first step of mz_proc_stop. The host ending
 * on a second signal sends it to every daemon before stopping each, so
 * their graces run side by side rather than one after another. */
void mz_proc_term(mz_proc *p) {
  if (!p->stopped && !mz_proc_poll(p, NULL)) signal_group(p->pid, SIGTERM);
}

/* The group sweep at the end is once per handle: a group id, like a pid,
 * is only reserved while a member lives, so signalling it again much later
 * could hit an unrelated group that got the recycled number. The sweep
 * right after reaping is safe while survivors exist (they pin the id). */
int mz_proc_stop(mz_proc *p, int grace_ms) {
  int killed = 0;
  if (p->stopped) return p->stop_result;
  if (!mz_proc_poll(p, NULL)) {
    signal_group(p->pid, SIGTERM);
    if (!proc_wait(p, grace_ms)) {
      signal_group(p->pid, SIGKILL);
      proc_reap(p, 0);
      killed = 1;
    }
  }
  kill(-p->pid, SIGKILL); /* the daemon's own children (and its watchdog); ESRCH is the usual answer */
  mz_os_guard_end(&p->guard);
  p->stopped = 1;
  p->stop_result = killed;
  return killed;
}

/* A child not stopped keeps running (keep_alive), or is stopped by its
 * guard, as it would be at mirza's exit. */
void mz_proc_free(mz_proc *p) {
  if (!p) return;
  mz_os_guard_end(&p->guard);
  free(p);
}

/* WCOREDUMP is not POSIX, but glibc has it under _DEFAULT_SOURCE. */
char *mz_status_describe(int status, char *buf, size_t len) {
  if (!buf || len == 0) return buf;
  if (WIFEXITED(status)) snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
             WCOREDUMP(status) ? ", core dumped" : "");
  else if (WIFSTOPPED(status))
    snprintf(buf, len, "stopped by signal %d (%s)", WSTOPSIG(status), strsignal(WSTOPSIG(status)));
  else snprintf(buf, len, "unknown wait status 0x%x", (unsigned)status);
  return buf;
}

/* ---- processes we did not start ----------------------------------------- */

/* Gone = no such pid, or a zombie: a zombie of someone else's is dead and
 * only waits for its parent's wait(), which we cannot do for it. Where a
 * zombie cannot be told (os_none.c), it counts as alive until its parent
 * reaps it: a stop then waits out its grace, and SIGKILL's KILL_WAIT_MS. */
static int pid_gone(pid_t pid) {
  if (kill(pid, 0) < 0 && errno == ESRCH) return 1;
  return mz_os_pid_zombie(pid) == 1;
}

static int pid_wait_gone(pid_t pid, int ms) {
  int64_t deadline = now_ms() + (ms > 0 ? ms : 0);
  while (!pid_gone(pid)) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return 0;
    sleep_ms(left < POLL_STEP_MS ? (int)left : POLL_STEP_MS);
  }
  return 1;
}

/* Whole group only when pid leads one, and never our own group. */
static pid_t stop_target(pid_t pid) { return getpgid(pid) == pid && pid != getpgrp() ? -pid : pid; }

/* Besides the header's contract: pid <= 0 or our own pid is EINVAL (kill
 * would read those as "every process"/"ourselves"), and a process still
 * there KILL_WAIT_MS after SIGKILL (stuck in the kernel) is -1 ETIMEDOUT. */
int mz_pid_stop(pid_t pid, int grace_ms) {
  if (pid <= 0 || pid == getpid()) return errno = EINVAL, -1;
  pid_t target = stop_target(pid);
  if (kill(target, SIGTERM) < 0) return errno == ESRCH ? 0 : -1;
  if (!pid_wait_gone(pid, grace_ms)) {
    if (kill(target, SIGKILL) < 0 && errno != ESRCH) return -1;
    if (!pid_wait_gone(pid, KILL_WAIT_MS)) return errno = ETIMEDOUT, -1;
  }
  if (target < 0) kill(target, SIGKILL); /* survivors pin the group id */
  return 0;
}

int mz_pid_alive(pid_t pid) {
  if (pid <= 0) return 0; /* kill(0 or -n, 0) asks about groups */
  return kill(pid, 0) == 0 || errno == EPERM;
}

/* ---- who listens on a port --------------------------------------------- */

int mz_pid_listens(pid_t pid, int port) {
  if (pid <= 0 || port <= 0 || port > 65535) return errno = EINVAL, -1;
  return mz_os_pid_listens(pid, port);
}

/* ---- log tail ------------------------------------------------------------ */

/* Read the last (at most) max bytes of path into data; *partial tells
 * whether the read started mid-file. Returns the byte count (0 on error). */
static size_t read_tail(const char *path, char *data, size_t max, int *partial) {
  struct stat sb;
  size_t got = 0;
  off_t off = 0;
  *partial = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 0;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > (off_t)max) {
    off = sb.st_size - (off_t)max;
    *partial = 1;
  }
  while (got < max) {
    ssize_t n = pread(fd, data + got, max - got, off + (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  return got;
}

/* Start of the last n lines of data[0..len). The final line may lack its
 * '\n'. A read that began mid-file drops its cut first line, unless that
 * is all there is (one line longer than the window). */
static const char *last_lines(const char *data, size_t len, int n, int partial) {
  const char *start = data, *end = data + len, *p = end;
  const char *nl = partial ? memchr(data, '\n', len) : NULL;
  int seen = 0;
  if (nl && nl + 1 < end) start = nl + 1;
  if (p > start && p[-1] == '\n') p--;
  while (p > start) {
    if (p[-1] == '\n' && ++seen == n) break;
    p--;
  }
  return p;
}

char *mz_file_tail(const char *path, int nlines, char *buf, size_t len) {
  int partial;
  if (!buf || len == 0) return buf;
  buf[0] = '\0';
  char *data = nlines > 0 ? malloc(TAIL_MAX) : NULL;
  if (!data) return buf;
  size_t n = read_tail(path, data, TAIL_MAX, &partial);
  const char *s = last_lines(data, n, nlines, partial);
  size_t keep = (size_t)(data + n - s);
  if (keep > len - 1) { /* too long for buf: keep the end, whole UTF-8 chars */
    s += keep - (len - 1);
    while (s < data + n && ((unsigned char)*s & 0xC0) == 0x80) s++;
    keep = (size_t)(data + n - s);
  }
  memcpy(buf, s, keep);
  buf[keep] = '\0';
  free(data);
  return buf;
}
