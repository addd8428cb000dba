/*
 * watch_poll.c - the wait backend of watch.h with poll(), for systems
 * without epoll (macOS; on Linux with cmake -DMIRZA_POLL=ON, or
 * -DMIRZA_PORTABLE=ON: scripts/test's sanitizer build).
 * Each set is an array of pollfd: the watched one's [0] is the wake pipe,
 * then libcurl's sockets in no order (a removal moves the last one into
 * the hole); the parked one holds the parked sockets, which no wait
 * polls. A wait costs every socket watched; there are few (one per
 * transfer).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include "watch.h"

const char mz_watch_backend[] = "poll";

typedef struct set {
  struct pollfd *p;
  size_t n, cap;
  size_t next; /* where the next report starts: each socket's turn comes */
} set;

struct mz_watch {
  set on;     /* [0]: the wake pipe; then libcurl's sockets */
  set parked; /* mz_watch_park's */
};

static int grow(set *s) {
  if (s->n < s->cap) return 0;
  size_t cap = s->cap ? 2 * s->cap : 16;
  struct pollfd *p = realloc(s->p, cap * sizeof *p);
  if (!p) return -1;
  s->p = p, s->cap = cap;
  return 0;
}

static size_t find(const set *s, size_t from, curl_socket_t fd) {
  size_t i = from;
  while (i < s->n && s->p[i].fd != fd) i++;
  return i;
}

mz_watch *mz_watch_new(int wake_fd) {
  mz_watch *w = calloc(1, sizeof *w);
  if (!w || grow(&w->on)) {
    free(w);
    return NULL;
  }
  w->on.p[0] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
  w->on.n = 1;
  w->on.next = 1;
  return w;
}

void mz_watch_free(mz_watch *w) {
  if (!w) return;
  free(w->on.p);
  free(w->parked.p);
  free(w);
}

int mz_watch_set(mz_watch *w, curl_socket_t fd, int what) {
  set *s = &w->on;
  size_t i = find(s, 1, fd);
  if (i == s->n) {
    size_t j = find(&w->parked, 0, fd);
    if (j < w->parked.n) s = &w->parked, i = j;
  }
  if (what == CURL_POLL_REMOVE) {
    if (i < s->n) s->p[i] = s->p[--s->n];
    return 0;
  }
  if (i == s->n) {
    if (grow(s)) return -1;
    s->n++;
  }
  s->p[i] = (struct pollfd){.fd = fd, .events = mz_poll_events(what)};
  return 0;
}

int mz_watch_park(mz_watch *w, curl_socket_t fd, int park) {
  set *from = park ? &w->on : &w->parked, *to = park ? &w->parked : &w->on;
  size_t i = find(from, park ? 1 : 0, fd);
  if (i == from->n) return find(to, park ? 0 : 1, fd) < to->n ? 0 : -1;
  if (grow(to)) return -1;
  to->p[to->n++] = from->p[i];
  from->p[i] = from->p[--from->n];
  return 0;
}

/* Report the ready entries of s from `first` on, round the set from
 * where the last report stopped (as epoll's ready list does). */
static size_t report(set *s, size_t first, int n, mz_fired *out, size_t max) {
  size_t k = 0, m = s->n - first, start = s->next >= first && s->next < s->n ? s->next : first;
  for (size_t j = 0; n > 0 && j < m && k < max; j++) {
    size_t i = first + (start - first + j) % m;
    short r = s->p[i].revents;
    if (!r) continue;
    n--;
    s->next = i + 1;
    out[k].fd = s->p[i].fd;
    out[k++].ev = mz_poll_fired(r);
  }
  return k;
}

size_t mz_watch_wait(mz_watch *w, int ms, mz_fired *out, int *woken, int *eintr) {
  int n = poll(w->on.p, (nfds_t)w->on.n, ms);
  if (n < 0 && errno == EINTR) *eintr = 1;
  if (n > 0 && w->on.p[0].revents) *woken = 1, n--;
  return n > 0 ? report(&w->on, 1, n, out, MZ_FIRED_MAX) : 0; /* [0]: the wake pipe */
}

/* poll() has no edges: every parked socket with bytes (or closed) counts
 * as fresh, each in its turn across calls (a parked socket is watched for
 * what libcurl wants of it: reading, as it answers). */
size_t mz_watch_fresh(mz_watch *w, curl_socket_t *out, size_t max) {
  set *s = &w->parked;
  if (!s->n) return 0;
  int n = poll(s->p, (nfds_t)s->n, 0);
  mz_fired f[MZ_FIRED_MAX];
  size_t k = n > 0 ? report(s, 0, n, f, max < MZ_FIRED_MAX ? max : MZ_FIRED_MAX) : 0;
  for (size_t i = 0; i < k; i++) out[i] = f[i].fd;
  return k;
}
