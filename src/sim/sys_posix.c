/*
 * sys_posix.c - sys.h with POSIX alone (macOS; Linux with -DMIRZA_PORTABLE,
 * which is how CI runs it). Timed waits use the realtime clock, the only
 * one POSIX promises a condition variable: a step of the wall clock
 * lengthens or shortens one wait of at most a scheduler slice. A peer's
 * close shows as a readable socket whose peek reads 0 bytes (macOS has no
 * POLLRDHUP, and reports POLLHUP only once both directions are closed).
 */
#include "sys.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

void sys_cond_init(pthread_cond_t *cv) { pthread_cond_init(cv, NULL); }

void sys_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(cv, mu, &ts);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Pipelined request bytes keep the socket readable until they are read:
 * poll would return at once again and again, so the rest of the wait is
 * slept instead (a close behind those bytes shows at the next look). */
int sys_peer_gone(int fd, int ms) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  double until = now_ms() + ms;
  if (poll(&pfd, 1, ms) <= 0) return 0;
  if (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
  char b;
  ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
  double left = until - now_ms();
  if (left > 0) {
    long us = (long)(left * 1e3);
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
  }
  return 0;
}
