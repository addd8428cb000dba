/*
 * os.h - what differs between the systems mirza runs on, behind one
 * interface (as libuv keeps src/unix/linux.c, darwin.c and kqueue.c behind
 * uv-common.h). Nothing else in the tree reads /proc, includes
 * <sys/prctl.h> or <libproc.h>, or tests __APPLE__/__linux__: it calls these.
 * No Lua.
 *
 * Two groups, each implemented by one file that CMake picks:
 *
 *   facts      which pid listens on a port, whether a pid is a zombie, the
 *              running executable's path, a file's mtime, the descriptor
 *              ceiling: os_linux.c (/proc), os_darwin.c (libproc, sysctl,
 *              _NSGetExecutablePath) or os_none.c (POSIX only: what cannot be
 *              known is said to be unknown, and callers take the safe answer)
 *   mechanisms close-on-exec pipes and sockets, closing inherited
 *              descriptors, and the parent-death guard of a started daemon:
 *              os_linux.c (pipe2, SOCK_CLOEXEC, close_range, PR_SET_PDEATHSIG)
 *              or os_posix.c (fcntl, a close loop, a watchdog process)
 *
 *   Linux                     os_linux.c
 *   macOS                     os_darwin.c + os_posix.c
 *   Linux, -DMIRZA_PORTABLE   os_none.c   + os_posix.c (what CI runs for the
 *                             code paths macOS takes, the whole suite on it)
 *
 * mz_os_facts and mz_os_guard_kind name the pair a build has (mirza.core
 * .platform() shows them), so a test can say why it skips.
 */
#ifndef MIRZA_OS_H
#define MIRZA_OS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* ---- facts ---------------------------------------------------------------- */

/* "linux", "darwin" or "none": which facts this build can know. */
extern const char mz_os_facts[];

/* Whether pid holds a TCP socket listening on port (IPv4 or IPv6, any
 * address). 1 yes, 0 no (or no such process), -1 with errno when it cannot
 * be told: EACCES/EPERM (another user's process), ENOSYS (not on this
 * system). Used before trusting a pid a daemon reports: unknown is untrusted. */
int mz_os_pid_listens(pid_t pid, int port);

/* 1 if pid is a zombie (dead, waiting for its parent's wait()), 0 if it
 * runs (or is stopped), -1 when unknown (no such pid, or not knowable
 * here: ENOSYS). */
int mz_os_pid_zombie(pid_t pid);

/* The running executable's absolute path into buf: 0, or -1 (errno). argv0
 * (the process's argv[0], may be NULL) is only used where the system
 * cannot say: resolved against the working directory or PATH. */
int mz_os_exe_path(char *buf, size_t len, const char *argv0);

/* A file's modification time in seconds, with its sub-second part. */
double mz_os_mtime(const struct stat *st);

/* The highest open-files soft limit this system lets a process set beside
 * its hard limit (macOS: kern.maxfilesperproc, under an unlimited hard
 * limit that setrlimit refuses), or -1 when the hard limit is the answer. */
long mz_os_nofile_ceiling(void);

/* ---- mechanisms ------------------------------------------------------------ */

/* "pdeathsig" or "watchdog": how a started daemon dies with mirza. */
extern const char mz_os_guard_kind[];

/* pipe(2) with both ends close-on-exec. 0, or -1 (errno). */
int mz_os_pipe(int fd[2]);
/* socket(2), close-on-exec. The descriptor, or -1 (errno). */
int mz_os_socket(int domain, int type, int protocol);
/* In a child after fork, before exec: close every descriptor >= 3 but
 * keep (-1: none). Async-signal-safe. */
void mz_os_close_from3(int keep);

/*
 * The parent-death guard: a daemon started without keep_alive dies when
 * mirza does, even by SIGKILL. Linux arms PR_SET_PDEATHSIG in the child.
 * Elsewhere a watchdog does it: a small process forked by mirza into the
 * daemon's process group, blocked reading a pipe whose only writer is
 * mirza. mirza's death closes the pipe (the kernel does that, whatever
 * killed it); the watchdog then sends the group SIGTERM, waits up to the
 * grace for the daemon, and SIGKILLs the group, itself included (where
 * PDEATHSIG only sends the daemon SIGTERM). It ignores SIGTERM, so a
 * normal stop's final SIGKILL of the group is what ends it, and the
 * supervisor reaps it (mz_os_guard_end).
 *
 * The daemon does not exec until the guard is up: the child waits for the
 * parent's go (a byte on a pipe); a parent that died before giving it
 * leaves the child an EOF, and the child exits. So there is no window in
 * which mirza can die and leave an unguarded daemon, as the getppid()
 * check closes it for PDEATHSIG.
 *
 * Call order, for one spawn: open (parent, before fork); child (in the
 * child, after it has its process group and default signals); parent
 * (after fork, once the child leads its group); end (after the group's
 * final SIGKILL, or when the spawn failed). Each is safe on a guard whose
 * earlier steps failed or were skipped.
 */
typedef struct mz_os_guard {
  int go[2];      /* parent -> child: "the guard is up", -1 when unused */
  int life;       /* the write end the watchdog waits on, -1 when unused */
  pid_t watchdog; /* 0 when none */
} mz_os_guard;

/* Before fork. 0, or -1 (errno). */
int mz_os_guard_open(mz_os_guard *g);
/* In the child: 0, or -1 (errno: the spawn fails with it). Exits the
 * child (127) when the parent is gone already. Async-signal-safe. */
int mz_os_guard_child(mz_os_guard *g, pid_t parent);
/* In the parent, child leading its own group: 0, or -1 (errno; the child
 * exits on its own, unguarded children are never left). */
int mz_os_guard_parent(mz_os_guard *g, pid_t child, int grace_ms);
/* Release what the guard holds: a watchdog still running stands down
 * (killed and reaped, the daemon left as it is). Idempotent. */
void mz_os_guard_end(mz_os_guard *g);

#endif
