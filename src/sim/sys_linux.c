/*
 * sys_linux.c - sys.h on Linux: timed waits on the monotonic clock
 * (pthread_condattr_setclock), a peer's close seen by POLLRDHUP.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "sys.h"

#include <poll.h>
#include <time.h>

void sys_cond_init(pthread_cond_t *cv) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
}

void sys_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(cv, mu, &ts);
}

int sys_peer_gone(int fd, int ms) {
  struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
  if (poll(&pfd, 1, ms) <= 0) return 0;
  return (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}
