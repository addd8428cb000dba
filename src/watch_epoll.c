/*
 * watch_epoll.c - the wait backend of watch.h on Linux: two epoll sets, the
 * watched one (level-triggered, waited on) and the parked one (edge-
 * triggered: it tells which parked sockets got bytes since it was last
 * asked, and is never waited on). Adding, changing or removing a socket is
 * one epoll_ctl, parking it two, and a wait costs the sockets that are
 * ready, not the number watched.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "watch.h"

const char mz_watch_backend[] = "epoll";

struct mz_watch {
  int epfd;          /* the watched sockets and the wake pipe */
  int parked;        /* the parked sockets, edge-triggered */
  int wake;          /* the wake pipe's read end */
  unsigned char *in; /* [fd]: PARKED when in the parked set, | what libcurl wants */
  size_t nin;
};

enum { PARKED = 0x80 };

mz_watch *mz_watch_new(int wake_fd) {
  mz_watch *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = wake_fd};
  w->wake = wake_fd;
  w->epfd = epoll_create1(EPOLL_CLOEXEC);
  w->parked = epoll_create1(EPOLL_CLOEXEC);
  if (w->epfd < 0 || w->parked < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, wake_fd, &ev)) {
    mz_watch_free(w);
    return NULL;
  }
  return w;
}

void mz_watch_free(mz_watch *w) {
  if (!w) return;
  if (w->epfd >= 0) close(w->epfd);
  if (w->parked >= 0) close(w->parked);
  free(w->in);
  free(w);
}

static struct epoll_event event_of(curl_socket_t fd, int what) {
  return (struct epoll_event){
      .events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u), .data.fd = fd};
}

/* Room for fd in w->in; -1 when out of memory. */
static int track(mz_watch *w, curl_socket_t fd) {
  if ((size_t)fd < w->nin) return 0;
  size_t n = (size_t)fd + 64;
  unsigned char *p = realloc(w->in, n);
  if (!p) return -1;
  for (size_t i = w->nin; i < n; i++) p[i] = 0;
  w->in = p, w->nin = n;
  return 0;
}

int mz_watch_set(mz_watch *w, curl_socket_t fd, int what) {
  int parked = fd >= 0 && (size_t)fd < w->nin && (w->in[fd] & PARKED);
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(parked ? w->parked : w->epfd, EPOLL_CTL_DEL, fd, NULL); /* ENOENT/EBADF: gone already */
    if (fd >= 0 && (size_t)fd < w->nin) w->in[fd] = 0;
    return 0;
  }
  if (fd < 0 || track(w, fd)) return -1;
  struct epoll_event ev = event_of(fd, what);
  if (!parked && epoll_ctl(w->epfd, EPOLL_CTL_MOD, fd, &ev) && epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev)) return -1;
  w->in[fd] = (unsigned char)((w->in[fd] & PARKED) | (what & CURL_POLL_INOUT)); /* parked: taken up when back */
  return 0;
}

int mz_watch_park(mz_watch *w, curl_socket_t fd, int park) {
  if (fd < 0 || (size_t)fd >= w->nin) return -1;
  if (!!(w->in[fd] & PARKED) == !!park) return 0;
  struct epoll_event ev = park ? (struct epoll_event){.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = fd}
                               : event_of(fd, w->in[fd] & CURL_POLL_INOUT);
  if (epoll_ctl(park ? w->parked : w->epfd, EPOLL_CTL_ADD, fd, &ev)) return -1;
  epoll_ctl(park ? w->epfd : w->parked, EPOLL_CTL_DEL, fd, NULL);
  w->in[fd] ^= PARKED;
  return 0;
}

size_t mz_watch_fresh(mz_watch *w, curl_socket_t *out, size_t max) {
  struct epoll_event evs[MZ_FIRED_MAX];
  int n = epoll_wait(w->parked, evs, max < MZ_FIRED_MAX ? (int)max : MZ_FIRED_MAX, 0);
  for (int i = 0; i < n; i++) out[i] = evs[i].data.fd;
  return n > 0 ? (size_t)n : 0;
}

static int fired_of(uint32_t r) {
  return ((r & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) ? CURL_CSELECT_IN : 0) | ((r & EPOLLOUT) ? CURL_CSELECT_OUT : 0) |
         ((r & EPOLLERR) ? CURL_CSELECT_ERR : 0);
}

size_t mz_watch_wait(mz_watch *w, int ms, mz_fired *out, int *woken, int *eintr) {
  struct epoll_event evs[MZ_FIRED_MAX];
  int n = epoll_wait(w->epfd, evs, MZ_FIRED_MAX, ms);
  if (n < 0 && errno == EINTR) *eintr = 1;
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    if (evs[i].data.fd == w->wake) {
      *woken = 1;
      continue;
    }
    out[k].fd = evs[i].data.fd;
    out[k++].ev = fired_of(evs[i].events);
  }
  return k;
}
