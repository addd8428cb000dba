/*
 * os_darwin.c - os.h's facts on macOS: libproc for a process's sockets,
 * sysctl for its state and the descriptor ceiling, _NSGetExecutablePath
 * for the running binary. The mechanisms are os_posix.c's.
 *
 * Checked here by the cross-build only (it compiles and links against
 * macOS's headers and libSystem); what libproc answers at run time is
 * what Apple documents (proc_info.h) and lsof relies on.
 */
#include "os.h"

#include <errno.h>
#include <libproc.h>
#include <limits.h>
#include <mach-o/dyld.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/proc_info.h>
#include <sys/sysctl.h>

const char mz_os_facts[] = "darwin";

#define FDS_MAX 65536 /* descriptors of one process we look at */

/* 1 if fd of pid is a TCP socket listening on port. */
static int fd_listens(pid_t pid, int fd, int port) {
  struct socket_fdinfo si;
  int n = proc_pidfdinfo(pid, fd, PROC_PIDFDSOCKETINFO, &si, (int)sizeof si);
  if (n != (int)sizeof si || si.psi.soi_kind != SOCKINFO_TCP) return 0;
  const struct tcp_sockinfo *t = &si.psi.soi_proto.pri_tcp;
  return t->tcpsi_state == TSI_S_LISTEN && ntohs((uint16_t)t->tcpsi_ini.insi_lport) == port;
}

/* The descriptors of pid (proc_pidinfo PROC_PIDLISTFDS), then each socket's
 * info (PROC_PIDFDSOCKETINFO). Another user's process: EPERM, unknown. */
int mz_os_pid_listens(pid_t pid, int port) {
  int size = proc_pidinfo(pid, PROC_PIDLISTFDS, 0, NULL, 0);
  if (size <= 0) return errno == ESRCH ? 0 : -1;
  size += 32 * (int)sizeof(struct proc_fdinfo); /* room for a few opened meanwhile */
  if (size > FDS_MAX * (int)sizeof(struct proc_fdinfo)) size = FDS_MAX * (int)sizeof(struct proc_fdinfo);
  struct proc_fdinfo *fds = malloc((size_t)size);
  if (!fds) return -1;
  int got = proc_pidinfo(pid, PROC_PIDLISTFDS, 0, fds, size);
  int found = 0, e = errno;
  for (int i = 0; got > 0 && !found && i < got / (int)sizeof *fds; i++)
    found = fds[i].proc_fdtype == PROX_FDTYPE_SOCKET && fd_listens(pid, fds[i].proc_fd, port);
  free(fds);
  if (got <= 0) return e == ESRCH ? 0 : (errno = e, -1);
  return found;
}

int mz_os_pid_zombie(pid_t pid) {
  struct kinfo_proc kp;
  size_t len = sizeof kp;
  int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PID, (int)pid};
  if (sysctl(mib, 4, &kp, &len, NULL, 0) < 0 || len < sizeof kp) return -1; /* len 0: no such pid */
  return kp.kp_proc.p_stat == SZOMB;
}

/* _NSGetExecutablePath may give a path through symlinks or with "..":
 * realpath makes it the file's own. */
int mz_os_exe_path(char *buf, size_t len, const char *argv0) {
  char raw[PATH_MAX], real[PATH_MAX];
  uint32_t size = sizeof raw;
  (void)argv0;
  if (_NSGetExecutablePath(raw, &size) != 0) return errno = ENAMETOOLONG, -1;
  if (!realpath(raw, real)) return -1;
  if (strlen(real) >= len) return errno = ENAMETOOLONG, -1;
  strcpy(buf, real);
  return 0;
}

double mz_os_mtime(const struct stat *st) {
  return (double)st->st_mtimespec.tv_sec + (double)st->st_mtimespec.tv_nsec * 1e-9;
}

/* An unlimited hard limit is the macOS default, and setrlimit refuses a
 * soft limit above kern.maxfilesperproc. */
long mz_os_nofile_ceiling(void) {
  int v = 0;
  size_t len = sizeof v;
  if (sysctlbyname("kern.maxfilesperproc", &v, &len, NULL, 0) < 0 || v <= 0) return OPEN_MAX;
  return v;
}
