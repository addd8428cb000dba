/*
 * sys.h - what differs between systems in mirza-sim, behind one interface
 * (as src/os.h is for mirza): sys_linux.c (a condition variable on the
 * monotonic clock, POLLRDHUP) or sys_posix.c (macOS, and Linux with
 * -DMIRZA_PORTABLE: the realtime clock, a peek for the peer's EOF). CMake
 * picks the file. Descriptors and close-on-exec are src/os.h's.
 */
#ifndef MIRZA_SIM_SYS_H
#define MIRZA_SIM_SYS_H

#include <pthread.h>

/* A condition variable whose timed waits sys_cond_wait_ms can bound. */
void sys_cond_init(pthread_cond_t *cv);
/* Wait on cv (mu held) at most ms milliseconds; spurious wake-ups happen. */
void sys_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms);
/* Wait up to ms (0: a look) for the peer of socket fd to close or reset
 * the connection: 1 when it did, 0 otherwise. Request bytes the peer sent
 * ahead (pipelining) do not count, and do not cut the wait short. */
int sys_peer_gone(int fd, int ms);

#endif
