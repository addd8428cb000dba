/*
 * os_linux.c - os.h on Linux: the facts from /proc, the mechanisms from
 * Linux's own calls (pipe2, SOCK_CLOEXEC, close_range, PR_SET_PDEATHSIG).
 * The only file of the tree that reads /proc or includes <sys/prctl.h>.
 *
 * PR_SET_PDEATHSIG fires when the *thread* that forked dies, not the
 * process: mirza is single-threaded, and forks from its main thread.
 */
#define _GNU_SOURCE
#include "os.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

const char mz_os_facts[] = "linux";
const char mz_os_guard_kind[] = "pdeathsig";

/* ---- facts ------------------------------------------------------------------ */

/* The state letter of /proc/<pid>/stat, or 0 when unreadable. The command
 * name in parentheses may hold ')' and spaces: the state follows the last. */
static char proc_state(pid_t pid) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  char *rp = strrchr(text, ')');
  return rp && rp[1] == ' ' ? rp[2] : 0;
}

int mz_os_pid_zombie(pid_t pid) {
  char st = proc_state(pid);
  if (!st) return -1;
  return st == 'Z' || st == 'X';
}

#define LISTEN_MAX 16 /* listening sockets on one port we look at (SO_REUSEPORT) */

/* Add to inodes[*n] the inodes of the LISTEN (state 0A) sockets of one
 * /proc/net/tcp* table whose local port is port. Lines look like
 * "  0: 0100007F:1F90 00000000:0000 0A ... uid timeout inode ...". */
static void listen_inodes(const char *table, int port, unsigned long *inodes, int *n) {
  char line[512];
  FILE *f = fopen(table, "re");
  if (!f) return;
  while (*n < LISTEN_MAX && fgets(line, sizeof line, f)) {
    unsigned lport, st;
    unsigned long inode;
    char *colon = strchr(line, ':');                      /* after the slot number */
    char *pcolon = colon ? strchr(colon + 1, ':') : NULL; /* before the local port */
    if (!pcolon) continue;
    if (sscanf(pcolon + 1, "%x %*s %x %*s %*s %*s %*s %*s %lu", &lport, &st, &inode) != 3) continue;
    if ((int)lport == port && st == 0x0A && inode != 0) inodes[(*n)++] = inode;
  }
  fclose(f);
}

/* 1 if fd link text is "socket:[inode]" for one of the inodes. */
static int is_listen_fd(const char *link, const unsigned long *inodes, int n) {
  unsigned long ino;
  if (sscanf(link, "socket:[%lu]", &ino) != 1) return 0;
  for (int i = 0; i < n; i++)
    if (inodes[i] == ino) return 1;
  return 0;
}

/* The inodes of the port's LISTEN entries of /proc/net/tcp and tcp6,
 * matched against the "socket:[inode]" links of /proc/<pid>/fd. */
int mz_os_pid_listens(pid_t pid, int port) {
  unsigned long inodes[LISTEN_MAX];
  char dir[64], path[64 + 256], link[64];
  int n = 0, found = 0;
  listen_inodes("/proc/net/tcp", port, inodes, &n);
  listen_inodes("/proc/net/tcp6", port, inodes, &n);
  if (n == 0) return 0;
  snprintf(dir, sizeof dir, "/proc/%ld/fd", (long)pid);
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -1;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    ssize_t len = readlink(path, link, sizeof link - 1);
    if (len <= 0) continue;
    link[len] = '\0';
    found = is_listen_fd(link, inodes, n);
  }
  closedir(d);
  return found;
}

int mz_os_exe_path(char *buf, size_t len, const char *argv0) {
  (void)argv0;
  if (len == 0) return errno = ERANGE, -1;
  ssize_t n = readlink("/proc/self/exe", buf, len - 1);
  if (n < 0) return -1;
  if ((size_t)n >= len - 1) return errno = ENAMETOOLONG, -1;
  buf[n] = '\0';
  return 0;
}

double mz_os_mtime(const struct stat *st) { return (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec * 1e-9; }

long mz_os_nofile_ceiling(void) { return -1; }

/* ---- mechanisms --------------------------------------------------------------- */

int mz_os_pipe(int fd[2]) { return pipe2(fd, O_CLOEXEC); }

int mz_os_socket(int domain, int type, int protocol) { return socket(domain, type | SOCK_CLOEXEC, protocol); }

#define FD_CLOSE_LIMIT 65536 /* the fallback close loop never goes past this */

void mz_os_close_from3(int keep) {
#ifdef SYS_close_range /* kernel 5.9+; the loop below otherwise */
  int ok = 1;
  if (keep > 3 && syscall(SYS_close_range, 3u, (unsigned)keep - 1, 0u) < 0) ok = 0;
  if (ok && syscall(SYS_close_range, (unsigned)(keep < 3 ? 3 : keep + 1), ~0u, 0u) == 0) return;
#endif
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > FD_CLOSE_LIMIT) max = FD_CLOSE_LIMIT;
  for (int fd = 3; fd < max; fd++) {
    if (fd != keep) close(fd);
  }
}

int mz_os_guard_open(mz_os_guard *g) {
  g->go[0] = g->go[1] = g->life = -1;
  g->watchdog = 0;
  return 0;
}

/* Signals were reset before this, so SIGTERM kills; the getppid() check
 * closes the window where the parent died before prctl took effect. */
int mz_os_guard_child(mz_os_guard *g, pid_t parent) {
  (void)g;
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0) return -1;
  if (getppid() != parent) _exit(127); /* orphaned already: nobody to serve */
  return 0;
}

int mz_os_guard_parent(mz_os_guard *g, pid_t child, int grace_ms) {
  (void)g, (void)child, (void)grace_ms;
  return 0;
}

void mz_os_guard_end(mz_os_guard *g) { (void)g; }
