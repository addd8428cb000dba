/*
 * watch_epoll.c - the wait backend of watch.h on Linux: one epoll set.
 * Adding, changing or removing a socket is one epoll_ctl, and a wait costs
 * the sockets that are ready, not the number watched.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "watch.h"

const char mz_watch_backend[] = "epoll";

struct mz_watch {
  int epfd; /* libcurl's sockets and the wake pipe */
  int wake; /* the wake pipe's read end */
};

mz_watch *mz_watch_new(int wake_fd) {
  mz_watch *w = malloc(sizeof *w);
  if (!w) return NULL;
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = wake_fd};
  w->wake = wake_fd;
  w->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (w->epfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, wake_fd, &ev)) {
    mz_watch_free(w);
    return NULL;
  }
  return w;
}

void mz_watch_free(mz_watch *w) {
  if (!w) return;
  if (w->epfd >= 0) close(w->epfd);
  free(w);
}

int mz_watch_set(mz_watch *w, curl_socket_t fd, int what) {
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, fd, NULL); /* ENOENT/EBADF: gone already */
    return 0;
  }
  struct epoll_event ev = {.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u),
                           .data.fd = fd};
  if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, fd, &ev) == 0) return 0;
  return epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) ? -1 : 0;
}

size_t mz_watch_wait(mz_watch *w, int ms, mz_fired *out, int *woken, int *eintr) {
  struct epoll_event evs[MZ_FIRED_MAX];
  int n = epoll_wait(w->epfd, evs, MZ_FIRED_MAX, ms);
  if (n < 0 && errno == EINTR) *eintr = 1;
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    uint32_t r = evs[i].events;
    if (evs[i].data.fd == w->wake) {
      *woken = 1;
      continue;
    }
    out[k].fd = evs[i].data.fd;
    out[k++].ev = ((r & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) ? CURL_CSELECT_IN : 0) |
                  ((r & EPOLLOUT) ? CURL_CSELECT_OUT : 0) | ((r & EPOLLERR) ? CURL_CSELECT_ERR : 0);
  }
  return k;
}
