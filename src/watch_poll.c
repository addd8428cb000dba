/*
 * watch_poll.c - the wait backend of watch.h with poll(), for systems
 * without epoll (macOS; on Linux with cmake -DMIRZA_POLL=ON, or
 * -DMIRZA_PORTABLE=ON: scripts/test's sanitizer build).
 * The set is an array of pollfd: [0] is the wake pipe, then libcurl's
 * sockets in no order (a removal moves the last one into the hole). A
 * wait costs every socket watched; there are few (one per transfer).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include "watch.h"

const char mz_watch_backend[] = "poll";

struct mz_watch {
  struct pollfd *pfd; /* [0]: the wake pipe; then libcurl's sockets */
  size_t npfd, cappfd;
  size_t next; /* where the next wait's report starts: each socket's turn comes */
};

mz_watch *mz_watch_new(int wake_fd) {
  mz_watch *w = malloc(sizeof *w);
  if (!w || !(w->pfd = malloc(16 * sizeof *w->pfd))) {
    free(w);
    return NULL;
  }
  w->pfd[0] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
  w->npfd = 1;
  w->cappfd = 16;
  w->next = 1;
  return w;
}

void mz_watch_free(mz_watch *w) {
  if (!w) return;
  free(w->pfd);
  free(w);
}

int mz_watch_set(mz_watch *w, curl_socket_t fd, int what) {
  size_t i = 1;
  while (i < w->npfd && w->pfd[i].fd != fd) i++;
  if (what == CURL_POLL_REMOVE) {
    if (i < w->npfd) w->pfd[i] = w->pfd[--w->npfd];
    return 0;
  }
  if (i == w->npfd) {
    if (w->npfd == w->cappfd) {
      struct pollfd *p = realloc(w->pfd, 2 * w->cappfd * sizeof *p);
      if (!p) return -1;
      w->pfd = p;
      w->cappfd *= 2;
    }
    w->npfd++;
  }
  w->pfd[i] = (struct pollfd){.fd = fd, .events = mz_poll_events(what)};
  return 0;
}

size_t mz_watch_wait(mz_watch *w, int ms, mz_fired *out, int *woken, int *eintr) {
  int n = poll(w->pfd, (nfds_t)w->npfd, ms);
  if (n < 0 && errno == EINTR) *eintr = 1;
  size_t k = 0;
  if (n > 0 && w->pfd[0].revents) *woken = 1, n--;
  /* from where the last report stopped, round the set: more than
   * MZ_FIRED_MAX ready are reported over several waits, each in its turn
   * (as epoll's ready list does), not the first ones again and again */
  size_t m = w->npfd - 1, start = w->next >= 1 && w->next < w->npfd ? w->next : 1;
  for (size_t j = 0; n > 0 && j < m && k < MZ_FIRED_MAX; j++) {
    size_t i = 1 + (start - 1 + j) % m;
    short r = w->pfd[i].revents;
    if (!r) continue;
    n--;
    w->next = i + 1;
    out[k].fd = w->pfd[i].fd;
    out[k++].ev = mz_poll_fired(r);
  }
  return k;
}
