/*
 * nofile.h - the open-files limit. Every stream holds a socket: 1,024
 * streams and the process's own files exceed the usual soft limit of
 * 1,024. mz_client_new() raises the soft limit to the hard one, once per
 * process (as Go's runtime and nginx's worker_rlimit_nofile do); children
 * the supervisor starts get the limit the process started with back
 * (as Go's os/exec does): a program that closes every descriptor up to its
 * limit would crawl through a raised one. Pure C: no Lua.
 */
#ifndef MIRZA_NOFILE_H
#define MIRZA_NOFILE_H

/* Raise the soft limit to the hard one (or the largest step a system
 * allows under an unlimited hard limit: macOS), once; later calls do
 * nothing. */
void mz_nofile_raise(void);
/* The soft and hard limits now, and the soft one before the raise
 * (-1: unlimited). */
void mz_nofile(long *soft, long *hard, long *orig);
/* In a child after fork, before exec: the soft limit the process started
 * with. Async-signal-safe; nothing when it was never raised. */
void mz_nofile_restore(void);

#endif
