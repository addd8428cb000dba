/*
 * client.c - the libcurl multi driver and the rest of client.h's public
 * API: the client and its wake pipe, the waits. A request is made a stream
 * in request.c, what a response means is response.c, the per-stream queue
 * is queue.c, when a stream is read and its timed looks (holds, stall and
 * header deadlines) are due.c, connections per server conn.c, the wait
 * itself is watch.h's backend (the units and their shared state:
 * client_int.h).
 *
 * Nothing happens between calls: every wait runs drive(), which waits on
 * the watched sockets, libcurl's timer, the earliest look due and the wake
 * pipe, runs the transfers that are ready (their callbacks queue events),
 * reaps the finished ones, and runs the looks that are due. A wake-up
 * costs the sockets that are ready and the looks that are due, not every
 * open stream. When a stream is read is decided by one rule (due.c): as
 * its bytes come until it answers a reader that holds what comes, then at
 * most an eighth of its answer's age late.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"
#include "nofile.h"
#include "mirza.h"

double mz_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------ the driver */

/* libcurl's socket callback: watch `fd` for `what`, or forget it (a
 * parked socket, due.c, is changed where it is: watch.h). */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *ud, void *sockp) {
  mz_client *c = ud;
  (void)sockp;
  mz_stream *s = NULL;
  if (e) curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&s);
  if (what == CURL_POLL_REMOVE) {
    if (s && s->sock == fd) s->sock = CURL_SOCKET_BAD, s->parked = 0; /* its number may be reused */
    if (fd >= 0 && (size_t)fd < c->nfd_rx && (!s || c->fd_owner[fd] == s)) c->fd_owner[fd] = NULL;
    return mz_watch_set(c->watch, fd, what);
  }
  if (fd >= 0 && (size_t)fd >= c->nfd_rx) { /* called when the watch changes, not per read */
    size_t n = (size_t)fd + 64;
    double *p = realloc(c->fd_rx, n * sizeof *p);
    if (p) c->fd_rx = p;
    mz_stream **o = p ? realloc(c->fd_owner, n * sizeof *o) : NULL;
    if (!o) return -1;
    c->fd_owner = o;
    for (size_t i = c->nfd_rx; i < n; i++) p[i] = 0, o[i] = NULL;
    c->nfd_rx = n;
  }
  if (s) {
    if (s->parked && s->sock != fd) mz_due_unpark(c, s);
    s->sock = fd, s->sock_what = what;
    if (fd >= 0) c->fd_owner[fd] = s;
  }
  return mz_watch_set(c->watch, fd, what); /* -1: libcurl fails the transfer */
}

/* libcurl's timer callback: run its timeouts in timeout_ms (-1: none). */
static int on_timer(CURLM *m, long timeout_ms, void *ud) {
  mz_client *c = ud;
  (void)m;
  c->timer_at = timeout_ms < 0 ? INFINITY : mz_now() + (double)timeout_ms / 1000.0;
  return 0;
}

/* The transfers libcurl finished: their end queued, their handle gone. */
static void reap(mz_client *c) {
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(c->multi, &left))) {
    if (m->msg != CURLMSG_DONE) continue;
    mz_stream *s = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&s);
    if (s && s->rec) { /* the recording is whole: on disk before the last event is read */
      fclose(s->rec);
      s->rec = NULL;
    }
    if (s) {
      mz_on_complete(s, m->data.result);
      mz_conn_done(c, m->easy_handle, s);
      mz_detach_easy(s);
    }
  }
}

/* Empty the wake pipe (mz_client_wake's bytes). */
static void drain_wake(mz_client *c) {
  char buf[64];
  while (read(c->wake[0], buf, sizeof buf) > 0) {}
}

/* libcurl's timeouts, when due: a transfer just added starts this way. */
static void run_due_timers(mz_client *c) {
  double now = mz_now();
  if (c->timer_at > now) return;
  int running;
  c->timer_at = INFINITY; /* on_timer may set it again from inside */
  c->io_now = now;
  curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  c->io_now = 0;
}

/* Socket fd came ready for ev (CURL_CSELECT_*): bytes stamp its progress
 * clock (due.c's socket_rx), libcurl runs its transfer, and the rule says
 * when the stream is read next (due.c). */
void mz_socket_ready(mz_client *c, curl_socket_t fd, int ev, double now) {
  int running;
  mz_stream *s = fd >= 0 && (size_t)fd < c->nfd_rx ? c->fd_owner[fd] : NULL;
  if (s) s->reads++;
  if ((ev & CURL_CSELECT_IN) && s && !s->parked) c->fd_rx[fd] = now; /* parked: read blind, bytes or not */
  c->io_now = now;
  curl_multi_socket_action(c->multi, fd, ev, &running);
  c->io_now = 0;
  if (s && c->fd_owner[fd] == s) mz_due_read(c, s, now);
}

/* Wait up to ms (0: only what is ready now; <0: until something happens)
 * for a socket, libcurl's timer, a look due (due.c, conn.c) or a wake-up,
 * then run what is due: the transfers of the ready sockets, libcurl's
 * timeouts, finished transfers, the looks. Returns how many sockets were
 * ready. */
static size_t drive(mz_client *c, int ms) {
  double now = mz_now(), at = c->timer_at;
  if (mz_due_next(c) < at) at = mz_due_next(c);
  if (mz_conn_next(c) < at) at = mz_conn_next(c);
  if (at <= now) ms = 0;
  else if (at < INFINITY) {
    double t = ceil((at - now) * 1000.0);
    if (ms < 0 || t < ms) ms = (int)t;
  }
  mz_fired f[MZ_FIRED_MAX];
  int woken = 0;
  size_t k = mz_watch_wait(c->watch, ms, f, &woken, &c->eintr); /* a copy: socket_action edits the set */
  if (woken) drain_wake(c);
  now = k ? mz_now() : now;
  for (size_t i = 0; i < k; i++) mz_socket_ready(c, f[i].fd, f[i].ev, now);
  run_due_timers(c);
  now = mz_now();
  mz_due_run(c, now); /* parked streams read, deadlines checked */
  reap(c);
  mz_conn_run(c, now);
  return k;
}

static int count_ready(const mz_client *c) {
  int n = 0;
  for (const mz_stream *s = c->streams; s; s = s->next) n += mz_ready(s);
  return n;
}

/* Why a wait must return early: the interrupt flag (the mirza host's
 * handler), or a signal that cut the wait short (EINTR: stock lua5.4's
 * SIGINT handler, which raises from a hook once Lua runs again); 0: none. */
static int interrupted(mz_client *c) {
  if (c->intr && *c->intr) return MZ_NEXT_INTERRUPTED;
  if (!c->eintr) return 0;
  c->eintr = 0;
  return MZ_NEXT_SIGNAL;
}

/* What a wait waits for (without a target stream: with one, that it has
 * something to pop). */
enum { UNTIL_ANY, UNTIL_LISTED, UNTIL_END };

/* Whether it has come: > 0 done. */
static int arrived(mz_client *c, int until, const mz_stream *target) {
  if (target) return mz_ready(target);
  switch (until) {
  case UNTIL_ANY: return count_ready(c); /* mirza.wait's count: the scheduler waits with UNTIL_LISTED */
  case UNTIL_LISTED:
    while (c->rhead && !mz_ready(c->rhead)) mz_unmark_ready(c->rhead); /* drained meanwhile */
    return c->rhead != NULL;
  default: return 0;
  }
}

/*
 * The one wait. Drives every transfer (drive: the read rule of due.c
 * decides which socket is watched when) until `target` has something to
 * pop (or, without one, what `until` waits for has come), the deadline
 * `end`, an interrupt, or no transfer can make progress any more (`target`
 * over; nothing running for a wait without a deadline).
 */
static int wait_until(mz_client *c, int until, mz_stream *target, double end) {
  c->eintr = 0;
  for (int ms = 0;;) { /* first what is ready now, then wait */
    drive(c, ms);
    int n = arrived(c, until, target);
    if (n) return n;
    if ((n = interrupted(c))) return n;
    if (target               ? !target->easy && target->term
        : until == UNTIL_ANY ? c->nrunning == 0
                             : until == UNTIL_LISTED && isinf(end) && c->nrunning == 0)
      return 0;
    double left = end - mz_now();
    if (left <= 0) return 0;
    ms = (int)ceil((left < 3600 ? left : 3600) * 1000.0);
  }
}

static double deadline_from(long timeout_ms) {
  return timeout_ms < 0 ? INFINITY : mz_now() + (double)timeout_ms / 1000.0;
}

int mz_client_wait(mz_client *c, long timeout_ms) { return wait_until(c, UNTIL_ANY, NULL, deadline_from(timeout_ms)); }

int mz_client_sleep(mz_client *c, long timeout_ms) {
  int rc = wait_until(c, UNTIL_END, NULL, mz_now() + (double)timeout_ms / 1000.0);
  return rc < 0 ? rc : 0;
}

int mz_client_wait_ready(mz_client *c, long timeout_ms) {
  return wait_until(c, UNTIL_LISTED, NULL, deadline_from(timeout_ms));
}

size_t mz_client_ready(mz_client *c, mz_stream **out, size_t n) {
  size_t k = 0;
  while (k < n && c->rhead) {
    mz_stream *s = c->rhead;
    mz_unmark_ready(s);
    if (mz_ready(s)) out[k++] = s; /* skip streams drained since they were listed */
  }
  return k;
}

int mz_stream_next(mz_stream *s, long timeout_ms, const mz_event **ev) {
  mz_release_popped(s);
  if (s->term_popped) return MZ_NEXT_END;
  if (!mz_ready(s)) {
    int rc = wait_until(s->c, UNTIL_END, s, deadline_from(timeout_ms));
    if (rc == MZ_NEXT_INTERRUPTED) return rc;
    if (!mz_ready(s)) return rc == MZ_NEXT_SIGNAL ? rc : MZ_NEXT_TIMEOUT;
  }
  *ev = mz_pop(s);
  return MZ_NEXT_EVENT;
}

/* ------------------------------------------------------ the client */

/* curl_global_init/cleanup are reference-counted by libcurl: one pair per
 * client keeps several Lua states (or tests) independent. */
mz_client *mz_client_new(volatile sig_atomic_t *interrupt) {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return NULL;
  mz_nofile_raise();
  mz_client *c = calloc(1, sizeof *c);
  if (c) c->wake[0] = c->wake[1] = -1;
  if (!c || !(c->multi = curl_multi_init()) || pipe(c->wake)) goto fail;
  for (int i = 0; i < 2; i++) {
    fcntl(c->wake[i], F_SETFL, fcntl(c->wake[i], F_GETFL) | O_NONBLOCK);
    fcntl(c->wake[i], F_SETFD, FD_CLOEXEC);
  }
  if (!(c->watch = mz_watch_new(c->wake[0]))) goto fail;
  c->timer_at = INFINITY;
  curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
  curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
  curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
  c->intr = interrupt;
  return c;
fail:
  if (c) {
    if (c->multi) curl_multi_cleanup(c->multi);
    for (int i = 0; i < 2; i++)
      if (c->wake[i] >= 0) close(c->wake[i]);
    mz_watch_free(c->watch);
    free(c);
  }
  curl_global_cleanup();
  return NULL;
}

void mz_client_free(mz_client *c) {
  if (!c) return;
  while (c->streams) mz_stream_close(c->streams);
  curl_multi_cleanup(c->multi); /* may still call on_socket: the set goes after */
  close(c->wake[0]);
  close(c->wake[1]);
  mz_watch_free(c->watch);
  free(c->fd_rx);
  free(c->fd_owner);
  free(c->due);
  free(c->due_now);
  free(c->idle);
  free(c->origins);
  free(c);
  curl_global_cleanup();
}

/* Async-signal-safe: one write to a non-blocking pipe (a full pipe already
 * wakes the poll). */
void mz_client_wakeup(mz_client *c) {
  if (c) {
    ssize_t r = write(c->wake[1], "", 1);
    (void)r;
  }
}

size_t mz_client_streams(const mz_client *c) { return c->nstreams; }
