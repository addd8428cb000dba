/*
 * supervisor.h - child processes for daemons (MTPLX, llama-server,
 * mirza-sim): spawn without a shell (argv arrays only) in a process group
 * of their own, stdout/stderr appended to a log file, non-blocking reaping,
 * graceful stop of the whole group (SIGTERM, grace period, SIGKILL), and
 * the per-port pid files that let a later run adopt and stop a daemon it
 * did not start (those and mkdir -p are in pidfile.c). Pure C
 * (POSIX/Linux): no Lua.
 *
 * Health checks over HTTP are not here: they use the client (client.h) and
 * are driven from Lua (lua/mirza/daemon.lua).
 */
#ifndef MIRZA_SUPERVISOR_H
#define MIRZA_SUPERVISOR_H

#include <stddef.h>
#include <sys/types.h>

typedef struct mz_proc mz_proc;

typedef struct mz_spawn_opts {
  const char *const *argv; /* NULL-terminated; argv[0] looked up in PATH */
  const char *const *env;  /* extra "NAME=value" entries (NULL-terminated) or NULL */
  const char *cwd;         /* or NULL */
  const char *log_path;    /* stdout+stderr appended here (created 0644); NULL: /dev/null */
  int keep_alive;          /* 0: the child is guarded so it cannot outlive us (os.h:
                               PR_SET_PDEATHSIG, or a watchdog); 1: it may (setsid) */
  int grace_ms;            /* the watchdog's SIGTERM -> SIGKILL delay when mirza died */
} mz_spawn_opts;

/* Spawn. On success returns 0 and *out (owned by the caller, free with
 * mz_proc_free). If the program cannot be executed (not found, not
 * executable, bad cwd, log file not writable) returns -1 with a message in
 * err naming the program and strerror, and no child is left behind (exec
 * failure is reported back through a CLOEXEC pipe). */
int mz_proc_spawn(const mz_spawn_opts *o, mz_proc **out, char *err, size_t errlen);

pid_t mz_proc_pid(const mz_proc *p);

/* Non-blocking reap (waitpid WNOHANG). Returns 1 if the child has exited
 * (the raw wait status in *status when status is non-NULL; later calls keep
 * returning 1 and the same status), 0 if it is still running. */
int mz_proc_poll(mz_proc *p, int *status);

/* Stop the process group: SIGTERM, wait up to grace_ms (reaping), then
 * SIGKILL and reap. Idempotent: returns at once if already exited. Returns
 * 1 if SIGKILL was needed, 0 otherwise. */
int mz_proc_stop(mz_proc *p, int grace_ms);

/* SIGTERM to the group, no wait (mz_proc_stop's first step; nothing once
 * the child is reaped or stopped): to stop several children side by side,
 * each gets this first, then mz_proc_stop. */
void mz_proc_term(mz_proc *p);

/* Release the handle. If the child still runs it is left running (the
 * caller decided: keep_alive) and is not reaped by us any more. */
void mz_proc_free(mz_proc *p);

/* "exited with status 1", "killed by signal 9 (Killed)", ... into buf. */
char *mz_status_describe(int status, char *buf, size_t len);

/* Stop a process we did not spawn (adopted daemon): SIGTERM to its group
 * (or to the pid alone if it leads no group of its own), poll kill(pid, 0)
 * until gone or grace_ms elapsed, then SIGKILL. Returns 0 when it is gone,
 * -1 (errno set) if it could not be signalled (ESRCH counts as gone: 0). */
int mz_pid_stop(pid_t pid, int grace_ms);
/* 1 if a process with this pid exists (kill(pid,0) succeeds or EPERM). */
int mz_pid_alive(pid_t pid);

/* Whether process pid holds a TCP socket listening on port (IPv4 or IPv6,
 * any local address; os.h's mz_os_pid_listens). Returns 1 (yes), 0 (no, or
 * no such process), -1 (errno) when it cannot be told: EACCES/EPERM for
 * another user's process, ENOSYS where the system cannot say, EINVAL for a
 * pid <= 0 or a port out of 1..65535. Used before trusting a pid a daemon
 * reports. */
int mz_pid_listens(pid_t pid, int port);

/* The last n lines of a file (a log), at most len-1 bytes, into buf (NUL-
 * terminated; "" when missing or empty). Reads only the file's tail. */
char *mz_file_tail(const char *path, int nlines, char *buf, size_t len);

/* ---- pidfile.c: the pid files, mkdir -p */

/* Pid files: "$XDG_RUNTIME_DIR/mirza/daemon-<port>.pid", falling back to
 * "/tmp/mirza-<uid>/daemon-<port>.pid" (directory created 0700). The file
 * holds "<pid>\n". Path helper returns buf or NULL on overflow. */
char *mz_pidfile_path(int port, char *buf, size_t len);
int mz_pidfile_write(int port, pid_t pid); /* 0 or -1 (errno) */
pid_t mz_pidfile_read(int port);           /* pid, or 0 if none/unreadable */
int mz_pidfile_remove(int port);           /* 0 (also when absent) or -1 */

/* mkdir -p without a shell: every missing component of dir (modified in
 * place and restored) made with mode, less the umask (a parent also gets
 * u+wx). 0 when dir is a directory at the end (one already there is
 * fine), or -1 with errno: ENOTDIR when it, or a component on the way, is
 * not one; ENOENT for "". mz_mkdir_p is mz_mkdir_mode(dir, 0700). */
int mz_mkdir_mode(char *dir, mode_t mode);
int mz_mkdir_p(char *dir);

#endif
