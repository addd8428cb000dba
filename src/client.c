/*
 * client.c - the libcurl multi driver and the rest of client.h's public
 * API: the client and its wake pipe, the waits, our own deadlines (stall
 * and header timeouts). A request is made a stream in request.c, what a
 * response means is response.c, the per-stream queue is queue.c, the wait
 * itself is watch.h's backend (the units and their shared state:
 * client_int.h).
 *
 * Nothing happens between calls: every wait runs drive(), which waits on
 * libcurl's sockets, its timer and the wake pipe, runs the transfers that
 * are due (their callbacks queue events), reaps the finished ones, and
 * ends the streams past one of our deadlines. The deadlines are checked
 * only once the earliest one noted (c->next_check) may have come, so a
 * wake-up costs the sockets that are ready, not every open stream.
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

/* ------------------------------------------------------ deadlines */

/* When a running transfer times out by our own clocks (INFINITY: never).
 * Until the first response byte only header_timeout runs: a request
 * queued by the daemon gets no head for as long as it waits, and that is
 * no stall. From the first byte on, the stall timer runs. */
static double own_deadline(const mz_stream *s) {
  double t = INFINITY;
  if (s->header_s > 0 && !s->head_done) t = s->t_open + s->header_s;
  if (s->stall_s > 0 && s->got_rx && s->last_rx + s->stall_s < t) t = s->last_rx + s->stall_s;
  return t;
}

/* Bytes came on the stream's socket since its last complete header line or
 * body write (a head trickling in): the stall clock runs from them. Read
 * only when a stall is due, so a read costs one store (drive). Returns 1
 * when last_rx moved. A stale time (the same fd number for an earlier
 * connection) is older than the stream's first response line: no effect. */
static int socket_rx(const mz_client *c, mz_stream *s) {
  if (s->sock < 0 || (size_t)s->sock >= c->nfd_rx || c->fd_rx[s->sock] <= s->last_rx) return 0;
  s->last_rx = c->fd_rx[s->sock];
  return 1;
}

/* Every stream past its deadline ends with "timeout". The scan runs only
 * once the earliest deadline noted may have come (a stream's deadline only
 * moves later as bytes arrive), and notes the next one. */
static void check_stalls(mz_client *c, double now) {
  if (now < c->next_check) return;
  c->next_check = INFINITY;
  for (mz_stream *s = c->streams; s; s = s->next) {
    mz_release_held(s, now);
    if (!s->easy || s->term) continue;
    double t = own_deadline(s);
    if (now >= t && socket_rx(c, s)) t = own_deadline(s);
    if (now < t) {
      mz_note_deadline(c, t);
      continue;
    }
    mz_flush_carry(s);
    if (s->got_rx && s->stall_s > 0 && now >= s->last_rx + s->stall_s)
      mz_set_terminal(s, MZ_EV_ERROR, MZ_E_TIMEOUT,
                      "no data from %s for %.1f s (stall timeout: raise the `stall_timeout` option, or false for none)",
                      s->url, now - s->last_rx);
    else
      mz_set_terminal(
          s, MZ_EV_ERROR, MZ_E_TIMEOUT,
          "no response head from %s after %.1f s (header timeout: the daemon may be busy or queueing; raise "
          "the `header_timeout` option, or false for none)",
          s->url, now - s->t_open);
    mz_detach_easy(s); /* closes the connection: the daemon stops generating */
  }
}

/* ------------------------------------------------------ connections per server */

/* A finished request's connection carries the next request to its server
 * or is closed. libcurl keeps it for reuse (its connection cache), and a
 * server that gives each connection a thread for as long as it lives
 * (llama-server's HTTP pool, its 5 s keep-alive waits included) then holds
 * a thread on the idle connection while our requests queued behind that
 * pool get none: 64 items @64 to llama-server -np 4 (8 threads) took 35 s,
 * the idle connections freed 8 at a time by the server's keep-alive
 * timeout. So a transfer's connection, once the transfer is done, is noted
 * here (its socket, its server, its local address, the time), and looked
 * at MZ_IDLE_GRACE_S later, time for the script to send its next request
 * (a batch task sends its next item as soon as it has recorded the last):
 * in use again (a new transfer watches its socket), it is left alone;
 * idle while a request to the same server that was already waiting for
 * its response head when the transfer ended still waits, it is shut down,
 * and the server's thread is free at once (libcurl finds the connection
 * dead and closes it, as one the server closed); else it stays for the
 * next request. A request opened since does not count: it is on its way
 * (counting it, a batch of short items reconnected most of them). The
 * time, not the script's next call: tasks yield to each other between an
 * item's end and the next item's request. Each connection is looked at
 * once; nothing is noted while no transfer ends: streaming costs nothing. */

#define MZ_IDLE_GRACE_S 0.02

/* The server of a URL: a hash of its scheme and authority (the redacted
 * URL keeps host and port), never 0. */
static unsigned origin_of(const char *url) {
  const char *p = strstr(url, "://");
  size_t n = (size_t)(p ? p + 3 - url : 0);
  n += strcspn(url + n, "/?#");
  unsigned h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)url[i]) * 16777619u;
  return h ? h : 1;
}

static void idle_drop(mz_client *c, size_t i) {
  memmove(&c->idle[i], &c->idle[i + 1], (c->nidle - i - 1) * sizeof *c->idle);
  c->nidle--;
}

/* A running transfer to origin, opened before `since`, still waits for
 * its head: queued at the server (for a slot, or for a thread that an
 * idle connection holds). One opened since is on its way: no reason. */
static int waited_on(mz_client *c, unsigned origin, double since) {
  for (mz_stream *s = c->streams; s; s = s->next) {
    if (!s->easy || s->head_done || s->term || s->t_open >= since) continue;
    if (!s->origin) s->origin = origin_of(s->url);
    if (s->origin == origin) return 1;
  }
  return 0;
}

/* The transfer e of s is done (its easy handle still attached): note its
 * connection if libcurl kept it and a request to the same server waits
 * for its head (none: none can be waiting when the note is looked at,
 * and libcurl 7.88's CURLINFO_ACTIVESOCKET costs a poll and 16
 * sigactions: a fifth more CPU per short item). A note of the same socket
 * number is an older connection's, or this one's before its last
 * transfer: dropped. */
static void note_idle(mz_client *c, CURL *e, mz_stream *s) {
  curl_socket_t fd = CURL_SOCKET_BAD;
  double now = mz_io_now(c);
  if (!s->origin) s->origin = origin_of(s->url);
  if (!waited_on(c, s->origin, now)) return;
  if (curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK || fd == CURL_SOCKET_BAD) return;
  for (size_t i = 0; i < c->nidle; i++)
    if (c->idle[i].fd == fd) idle_drop(c, i--);
  if (c->nidle == c->idle_cap) {
    size_t n = c->idle_cap ? 2 * c->idle_cap : 16;
    mz_idle *p = realloc(c->idle, n * sizeof *p);
    if (!p) return; /* not noted: kept by libcurl, as before */
    c->idle = p, c->idle_cap = n;
  }
  mz_idle *d = &c->idle[c->nidle];
  d->len = sizeof d->local;
  if (getsockname(fd, (struct sockaddr *)&d->local, &d->len)) return;
  d->fd = fd, d->origin = s->origin, d->at = now;
  c->nidle++;
}

static int in_use(const mz_client *c, curl_socket_t fd) {
  for (const mz_stream *s = c->streams; s; s = s->next)
    if (s->easy && s->sock == fd) return 1;
  return 0;
}

/* The same connection: the socket number still names our local address
 * (a number libcurl closed and reused names another, or none). */
static int same_socket(const mz_idle *d) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  return !getsockname(d->fd, (struct sockaddr *)&a, &len) && len == d->len && !memcmp(&a, &d->local, len);
}

/* Each note whose time came, once (oldest first): in use again, or shut
 * down while a request to its server waits, or left to libcurl's cache.
 * The waits wake for the next one (next_stall, pause_for), apart from the
 * stall clocks: noting it in c->next_check would make every wait scan
 * every stream while items end. */
static void close_idle(mz_client *c, double now) {
  while (c->nidle && c->idle[0].at + MZ_IDLE_GRACE_S <= now) {
    mz_idle d = c->idle[0];
    idle_drop(c, 0);
    if (!in_use(c, d.fd) && waited_on(c, d.origin, d.at) && same_socket(&d)) shutdown(d.fd, SHUT_RDWR);
  }
}

/* ------------------------------------------------------ the driver */

/* libcurl's socket callback: watch `fd` for `what`, or forget it. */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *ud, void *sockp) {
  mz_client *c = ud;
  (void)sockp;
  mz_stream *s = NULL;
  if (e) curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&s);
  if (what == CURL_POLL_REMOVE && s && s->sock == fd) s->sock = CURL_SOCKET_BAD; /* its number may be reused */
  if (what != CURL_POLL_REMOVE) { /* called when the watch changes, not per read */
    if (s) s->sock = fd, s->sock_what = what;
    if (fd >= 0 && (size_t)fd >= c->nfd_rx) {
      size_t n = (size_t)fd + 64;
      double *p = realloc(c->fd_rx, n * sizeof *p);
      if (!p) return -1;
      for (size_t i = c->nfd_rx; i < n; i++) p[i] = 0;
      c->fd_rx = p;
      c->nfd_rx = n;
    }
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
      note_idle(c, m->easy_handle, s);
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
 * clock (socket_rx), then libcurl runs its transfer. */
static void socket_ready(mz_client *c, curl_socket_t fd, int ev, double now) {
  int running;
  if ((ev & CURL_CSELECT_IN) && (size_t)fd < c->nfd_rx) c->fd_rx[fd] = now;
  c->io_now = now;
  curl_multi_socket_action(c->multi, fd, ev, &running);
  c->io_now = 0;
}

/* Wait up to ms (0: only what is ready now; <0: until something happens)
 * for a socket, libcurl's timer or a wake-up, then run what is due: the
 * transfers of the ready sockets, libcurl's timeouts, finished transfers,
 * our own deadlines. Returns how many sockets were ready. */
static size_t drive(mz_client *c, int ms) {
  double now = mz_now();
  if (c->timer_at <= now) ms = 0;
  else if (c->timer_at < INFINITY) {
    double t = ceil((c->timer_at - now) * 1000.0);
    if (ms < 0 || t < ms) ms = (int)t;
  }
  mz_fired f[MZ_FIRED_MAX];
  int woken = 0;
  size_t k = mz_watch_wait(c->watch, ms, f, &woken, &c->eintr); /* a copy: socket_action edits the set */
  if (woken) drain_wake(c);
  now = k ? mz_now() : now;
  for (size_t i = 0; i < k; i++) socket_ready(c, f[i].fd, f[i].ev, now);
  run_due_timers(c);
  reap(c);
  check_stalls(c, now = mz_now());
  close_idle(c, now);
  return k;
}

/* A scheduler's look (mz_client_wait_ready_paced): every socket that
 * became ready during the pause, not only the first MZ_FIRED_MAX (a wait
 * reports at most that many, the wake pipe among them): a tick reads each
 * stream once, however many there are. Bounded by the streams there are,
 * in case sockets keep coming ready while it reads. */
static size_t drive_all(mz_client *c) {
  size_t k, total = 0, rounds = c->nstreams / (MZ_FIRED_MAX - 1) + 1;
  do total += k = drive(c, 0);
  while (k >= MZ_FIRED_MAX - 1 && rounds--);
  return total;
}

static int count_ready(const mz_client *c) {
  int n = 0;
  for (const mz_stream *s = c->streams; s; s = s->next) n += mz_ready(s);
  return n;
}

/* Seconds until the nearest stall or header deadline, or a noted
 * connection's look (close_idle), or `cap`. */
static double next_stall(const mz_client *c, double now, double cap) {
  double left = c->next_check - now;
  if (c->nidle && c->idle[0].at + MZ_IDLE_GRACE_S - now < left) left = c->idle[0].at + MZ_IDLE_GRACE_S - now;
  return left < cap ? (left > 0 ? left : 0) : cap;
}

static int any_holding(const mz_client *c) {
  for (const mz_stream *s = c->streams; s; s = s->next)
    if (s->holding) return 1;
  return 0;
}

static int any_running(const mz_client *c) {
  for (const mz_stream *s = c->streams; s; s = s->next)
    if (s->easy && !s->term) return 1;
  return 0;
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

static int pause_for(mz_client *c, long timeout_ms, int all);

/*
 * The one wait loop. Returns when `target` (or, with target NULL, any
 * stream) has something to pop, at the deadline `end`, on interrupt, or
 * when no transfer could make progress any more.
 */
static int wait_loop(mz_client *c, mz_stream *target, double end) {
  c->eintr = 0;
  for (int ms = 0;;) { /* first what is ready now, then wait */
    size_t read = drive(c, ms);
    int n = target ? mz_ready(target) : count_ready(c);
    if (n) return n;
    if ((n = interrupted(c))) return n;
    if (target ? (!target->easy && target->term) : !any_running(c)) return 0;
    double now = mz_now(), left = end - now;
    if (left <= 0) return 0;
    left = next_stall(c, now, left < 3600 ? left : 3600);
    ms = (int)ceil(left * 1000.0);
    /* The target holds what came (its hold, mz_request.hold_ms): what
     * comes meanwhile is not taken before its time either, so it waits in
     * the socket and is read in one go then, not a wake-up per frame. At
     * most MZ_HOLD_PAUSE_MS at a time: the end, when it comes during a
     * long hold, is that late at most. */
    if (target && target->holding && read > 0 && ms > 0) {
      if ((n = pause_for(c, ms < MZ_HOLD_PAUSE_MS ? ms : MZ_HOLD_PAUSE_MS, 0))) return n; /* its end: 20 ms */
      ms = 0;
    }
  }
}

static double deadline_from(long timeout_ms) {
  return timeout_ms < 0 ? INFINITY : mz_now() + (double)timeout_ms / 1000.0;
}

int mz_client_wait(mz_client *c, long timeout_ms) { return wait_loop(c, NULL, deadline_from(timeout_ms)); }

int mz_client_sleep(mz_client *c, long timeout_ms) {
  double end = mz_now() + (double)timeout_ms / 1000.0;
  c->eintr = 0;
  for (int ms = 0, rc;;) {
    drive(c, ms);
    if ((rc = interrupted(c))) return rc;
    double now = mz_now(), left = end - now;
    if (left <= 0) return 0;
    left = next_stall(c, now, left);
    ms = (int)ceil(left * 1000.0);
  }
}

/* The streams still waiting for their answer (no think, text or tool call
 * delta yet), or, with `all`, opened as short answers (served to their
 * end), whose socket is known, watched for what libcurl wants (a new
 * connection: writable): into p[1..], at most max - 1 of them; returns
 * how many entries p has with the wake pipe in p[0]. With HTTP/2 several
 * streams share a socket: it is watched for the one that registered it. */
static nfds_t fresh_sockets(const mz_client *c, struct pollfd *p, nfds_t max, int all) {
  nfds_t n = 1;
  p[0] = (struct pollfd){.fd = c->wake[0], .events = POLLIN};
  for (const mz_stream *s = c->streams; s && n < max; s = s->next)
    if (s->easy && !s->term && s->sock != CURL_SOCKET_BAD && (!s->answering || (all && s->short_answer)))
      p[n++] = (struct pollfd){.fd = s->sock, .events = mz_poll_events(s->sock_what)};
  return n;
}

/* A scheduler's tick (see client.h): what arrives for the streams under
 * way waits in their sockets' buffers and the next drive reads it together
 * (drive_all: every ready socket, one read each) instead of one read per
 * frame. Only the streams still waiting for their answer, and those opened
 * as short answers (mz_request.short_answer; not in a wait on one held
 * stream: its end comes within MZ_HOLD_PAUSE_MS), are served as their sockets come ready (up to
 * MZ_FRESH_MAX of them): a new connection sends its request once
 * connected, the head and the first token are timed to the read, not to
 * the tick (ttft), and a short answer's end or an error answer is not a
 * tick late: a stream that ends ends the pause (c->ended), so its task
 * runs and sends the next item at once. The stall clocks lose nothing:
 * drive() stamps the ready sockets before it checks them. */
static int pause_for(mz_client *c, long timeout_ms, int all) {
  c->eintr = 0;
  if (c->intr && *c->intr) return MZ_NEXT_INTERRUPTED; /* its wake byte may be drained already */
  if (timeout_ms <= 0) return interrupted(c);
  /* libcurl's timers that are due, first: a transfer added since the last
   * drive sends its request now (on a kept connection; a new one starts
   * connecting), so the daemon works through the pause instead of a tick
   * later. */
  unsigned long ended = c->ended;
  run_due_timers(c); /* the pause's own start */
  reap(c);
  double end = mz_now() + (double)timeout_ms / 1000.0;
  /* Each fresh stream wakes it a few times (connected, head, first token,
   * a heartbeat). Past this many wake-ups, or on a socket closed under us,
   * the rest of the pause watches the wake pipe alone: whatever keeps a
   * socket ready waits for the next look, the pause does not spin. */
  int rounds = 4 * MZ_FRESH_MAX;
  for (long ms = timeout_ms; ms > 0 && c->ended == ended; ms = (long)ceil((end - mz_now()) * 1000.0)) {
    struct pollfd p[MZ_FRESH_MAX + 1];
    nfds_t n = fresh_sockets(c, p, rounds > 0 ? MZ_FRESH_MAX + 1 : 1, all);
    long idle_ms = c->nidle ? (long)ceil((c->idle[0].at + MZ_IDLE_GRACE_S - mz_now()) * 1000.0) : ms;
    int r = poll(p, n, idle_ms < ms ? (idle_ms > 0 ? (int)idle_ms : 0) : ms > INT_MAX ? INT_MAX : (int)ms);
    if (r < 0 && errno == EINTR) c->eintr = 1;
    if (c->nidle) close_idle(c, mz_now()); /* not a tick late: the server's thread waits on it */
    if (r == 0 && idle_ms < ms) continue;
    if (r <= 0) break;
    if (p[0].revents) {
      drain_wake(c);
      break;
    }
    rounds--;
    double now = mz_now();
    for (nfds_t i = 1; i < n; i++) {
      short e = p[i].revents;
      if (!e) continue;
      if (e & POLLNVAL) {
        rounds = 0;
        continue;
      }
      socket_ready(c, p[i].fd, mz_poll_fired(e), now);
    }
    reap(c); /* an answer that ended before its first token (an error) is no longer fresh */
  }
  return interrupted(c);
}

int mz_client_pause(mz_client *c, long timeout_ms) { return pause_for(c, timeout_ms, 1); }

unsigned long mz_client_ended(const mz_client *c) { return c->ended; }

/* Without a tick: when every stream under way that has begun its answer
 * holds what comes (mz_request.hold_ms: its reader wants it late, a
 * collect to the end), a wait may pause that long, up to MZ_HELD_PAUSE_MS,
 * and read what came meanwhile together: one read per stream per pause
 * instead of one per token. 0 when any such stream wants each event as it
 * comes (or none has begun). The streams waiting for their answer are
 * served during the pause as at a tick. */
static long held_pause_ms(const mz_client *c) {
  double least = MZ_HELD_PAUSE_MS / 1000.0;
  int any = 0;
  for (const mz_stream *s = c->streams; s; s = s->next) {
    if (!s->easy || s->term || !s->answering) continue;
    if (s->hold_s <= 0) return 0;
    any = 1;
    if (s->hold_s < least) least = s->hold_s;
  }
  return any ? (long)(least * 1000.0) : 0;
}

/* Wait for the ready list to be non-empty (see mz_client_wait_ready). */
int mz_client_wait_ready_paced(mz_client *c, long timeout_ms, long tick_ms) {
  double end = deadline_from(timeout_ms);
  c->eintr = 0;
  for (int ms = 0, rc, look = 1, all = 0;;) {
    /* at a tick, each look (the first comes after the scheduler's own
     * pause) takes every socket that is ready; after a pause that a
     * stream's end cut short, only what is listed (the look was just
     * made: the others' tick goes on) */
    size_t read = !look ? 0 : (tick_ms > 0 || all) && ms == 0 ? drive_all(c) : drive(c, ms);
    look = 1, all = 0;
    while (c->rhead && !mz_ready(c->rhead)) mz_unmark_ready(c->rhead); /* drained meanwhile */
    if (c->rhead) return 1;
    if ((rc = interrupted(c))) return rc;
    double now = mz_now(), left = end - now;
    if (left <= 0 || (isinf(end) && !any_running(c))) return 0;
    left = left < 3600 ? left : 3600;
    ms = (int)ceil(next_stall(c, now, left) * 1000.0);
    /* Bytes came for streams that hold them: the tick, nothing read
     * meanwhile, then all at once. The pause is not cut short by a hold
     * that ends or a stall clock (c->next_check): with many streams one of
     * them is due every few milliseconds, and each look reads every
     * socket. What falls due within the tick is seen at the next look.
     * Else wait for the sockets: the first byte of an idle client, a head,
     * is read at once, as without a tick. */
    if (tick_ms > 0 && read > 0 && any_holding(c)) {
      long pause_ms = (long)ceil(left * 1000.0);
      unsigned long ended = c->ended;
      if ((rc = mz_client_pause(c, pause_ms < tick_ms ? pause_ms : tick_ms))) return rc;
      ms = 0;
      look = c->ended == ended || !c->rhead;
    } else if (tick_ms <= 0 && read > 0 && ms > 0) {
      long pause_ms = held_pause_ms(c);
      if (pause_ms <= 0) continue;
      if ((rc = mz_client_pause(c, pause_ms < ms ? pause_ms : ms))) return rc;
      ms = 0, all = 1; /* what came for every stream, read together */
    }
  }
}

int mz_client_wait_ready(mz_client *c, long timeout_ms) { return mz_client_wait_ready_paced(c, timeout_ms, 0); }

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
    int rc = wait_loop(s->c, s, deadline_from(timeout_ms));
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
  c->timer_at = c->next_check = INFINITY;
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
    free(c->fd_rx);
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
  free(c->idle);
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
