/*
 * due.c - when a stream is read (the one rule), and the heap of the timed
 * looks at the streams (client_int.h).
 *
 * The rule. A stream is read as its bytes come (its socket watched) while
 * it is *eager*: no answer yet (the connection, the head, the first token
 * are read to the byte, and ttft with them), or a reader that takes each
 * event (no hold: a script that prints tokens), or a connection that may
 * carry other streams (HTTP/2), or one that measures the server's step
 * until the read after its first token's (mz_request.step). Once it
 * answers to a reader that holds what comes (mz_request.hold_ms: a batch
 * item, a collect, a merging turn), it is *lazy*: its socket is parked
 * (watch.h: kept, not waited on) and looked at on two clocks. Its *end*
 * is looked for every
 *
 *     gap = min((age - MZ_READ_YOUNG) / MZ_READ_AGE_DIV, hold,
 *               MZ_READ_GAP_MAX, stall / 4)
 *
 * (age: how long it has been answering; its first 16 ms count for
 * nothing, so an answer is read as it comes until 32 ms, where the gap
 * passes MZ_READ_GAP_MIN: a 4-token answer's end is not parked; the
 * measurements are in docs/performance.md): a peek at what its socket
 * holds (one recv(MSG_PEEK), no libcurl, no parsing) reads it at once when
 * the transfer's end is there (the chunked body's last chunk, "[DONE]",
 * the connection closed, an error) or much has come; and its *middle* is
 * read every min(hold, MZ_READ_GAP_MAX, stall / 4), whatever came
 * meanwhile in one go. So an answer's end is read at most an eighth of
 * the answer's age after it came (a 40 ms answer 3 ms late, a 30 ms one
 * at once, none more than 250 ms), and frees its slot as late at most,
 * whatever its length: nothing depends on max_tokens or a guess of the
 * length; while the middle of a long answer, which no reader waits for (it
 * holds), costs a read per 250 ms (256 streams of 80 tokens at 40 tokens/s:
 * ~11 reads each, as many as a 250 ms tick; reading the middle at the end's
 * gap made it ~25, twice the CPU). A TLS stream's socket cannot be looked
 * into: it is read at the end's gap. Looks due together are made in one
 * wake-up (the times are on grids shared by the streams of a like gap). A
 * gap below MZ_READ_GAP_MIN is not taken: the stream is read as its bytes
 * come until its gap grows past it. Parking is one epoll_ctl in a stream's
 * life; libcurl forgets the socket when the transfer ends, and the watch
 * with it.
 *
 * The heap. Every timed look at a stream is one entry, keyed by the
 * earliest of: its parked socket's next read, its held events' hand-over
 * (queue.c), its stall or header deadline (noted when it starts; a
 * deadline only moves later as bytes come, so a look that comes early
 * notes the new one). A wait sleeps until the top key at most and runs
 * the looks that are due: a wake-up costs what is due, never a walk of
 * every open stream.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "client_int.h"
#include "mirza.h"

#define MZ_READ_AGE_DIV 8.0
#define MZ_READ_GAP_MAX 0.25
#define MZ_READ_GAP_MIN 0.002
#define MZ_READ_YOUNG 0.016

/* ------------------------------------------------------ the heap */

static void put(mz_client *c, size_t i, mz_stream *s) {
  c->due[i] = s;
  s->due_pos = i + 1;
}

static void sift_up(mz_client *c, size_t i) {
  mz_stream *s = c->due[i];
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (c->due[up]->due_at <= s->due_at) break;
    put(c, i, c->due[up]);
    i = up;
  }
  put(c, i, s);
}

static void sift_down(mz_client *c, size_t i) {
  mz_stream *s = c->due[i];
  for (;;) {
    size_t l = 2 * i + 1, m = l;
    if (l >= c->ndue) break;
    if (l + 1 < c->ndue && c->due[l + 1]->due_at < c->due[l]->due_at) m = l + 1;
    if (c->due[m]->due_at >= s->due_at) break;
    put(c, i, c->due[m]);
    i = m;
  }
  put(c, i, s);
}

static void remove_at(mz_client *c, size_t i) {
  mz_stream *s = c->due[i];
  s->due_pos = 0;
  s->due_at = INFINITY;
  if (i == --c->ndue) return;
  mz_stream *m = c->due[c->ndue];
  put(c, i, m);
  if (i > 0 && m->due_at < c->due[(i - 1) / 2]->due_at) sift_up(c, i);
  else sift_down(c, i);
}

int mz_due_reserve(mz_client *c, size_t n) {
  if (n <= c->due_cap) return 0;
  size_t cap = c->due_cap ? c->due_cap : 64;
  while (cap < n) cap *= 2;
  mz_stream **p = realloc(c->due, cap * sizeof *p), **q = p ? realloc(c->due_now, cap * sizeof *q) : NULL;
  if (p) c->due = p;
  if (!q) return -1;
  c->due_now = q, c->due_cap = cap;
  return 0;
}

void mz_due_at(mz_stream *s, double t) {
  mz_client *c = s->c;
  if (!(t < INFINITY)) return;
  if (s->due_pos) {
    if (t >= s->due_at) return;
    s->due_at = t;
    sift_up(c, s->due_pos - 1);
    return;
  }
  if (c->ndue == c->due_cap && mz_due_reserve(c, c->ndue + 1)) return; /* reserved when it opened: never */
  s->due_at = t;
  put(c, c->ndue++, s);
  sift_up(c, c->ndue - 1);
}

void mz_due_drop(mz_stream *s) {
  if (s->due_pos) remove_at(s->c, s->due_pos - 1);
}

double mz_due_next(const mz_client *c) { return c->ndue ? c->due[0]->due_at : INFINITY; }

/* ------------------------------------------------------ the rule */

/* The time of the next read: the last point of a grid of step G (a power
 * of two seconds, at most a quarter of the gap) at or before now + gap, so
 * it is no later than the rule says and no sooner than three quarters of
 * it; the streams read at a like gap share the grid's points, and one
 * wake-up reads them together (256 streams at 40 tokens/s: about 100
 * wake-ups in their 2 s). */
static double on_grid(double now, double gap) {
  int e;
  frexp(gap / 4, &e);              /* gap / 4 = m * 2^e, 0.5 <= m < 1 */
  double step = ldexp(1.0, e - 1); /* <= gap / 4 */
  double t = floor((now + gap) / step) * step;
  return t > now ? t : now + gap;
}

/* The longest a lazy stream goes unread: its hold (its reader waits no
 * longer), MZ_READ_GAP_MAX, a quarter of its stall timeout. */
static double longest_gap(const mz_stream *s) {
  double gap = s->hold_s < MZ_READ_GAP_MAX ? s->hold_s : MZ_READ_GAP_MAX;
  if (s->stall_s > 0 && gap > s->stall_s / 4) gap = s->stall_s / 4;
  return gap;
}

/* The rule's gap for s at `now` (how late its end may be read); 0: read
 * it as its bytes come. */
static double gap_of(const mz_stream *s, double now) {
  if (!s->answering || s->hold_s <= 0 || s->term || !s->easy || s->multiplexed || (s->step && !s->next_at)) return 0;
  double gap = (now - s->answer_at - MZ_READ_YOUNG) / MZ_READ_AGE_DIV, most = longest_gap(s);
  if (gap > most) gap = most;
  return gap < MZ_READ_GAP_MIN ? 0 : gap;
}

/* How often its middle is read: what no reader waits for (it holds) at
 * the longest gap; at the end's gap when its end cannot be looked for. */
static double middle_gap(const mz_stream *s, double gap) { return s->sealed ? gap : longest_gap(s); }

void mz_due_unpark(mz_client *c, mz_stream *s) {
  if (!s->parked) return;
  s->parked = 0;
  if (s->sock != CURL_SOCKET_BAD) mz_watch_park(c->watch, s->sock, 0);
}

/* The next look at parked s: its end looked for a gap from now, its middle
 * read a middle gap from its last read. */
static void next_look(mz_stream *s, double now, double gap) {
  s->peek_at = on_grid(now, gap);
  if (s->peek_at >= s->read_at) s->peek_at = INFINITY; /* the read comes first */
  mz_due_at(s, s->peek_at < s->read_at ? s->peek_at : s->read_at);
}

void mz_due_read(mz_client *c, mz_stream *s, double now) {
  double gap = gap_of(s, now);
  if (gap <= 0 || s->sock == CURL_SOCKET_BAD) return;
  if (!s->parked) {
    if (mz_watch_park(c->watch, s->sock, 1)) return; /* stays watched: read as it comes */
    s->parked = 1;
  }
  s->fresh = 0; /* just read: what comes next is news */
  s->read_at = on_grid(now, middle_gap(s, gap));
  next_look(s, now, gap);
}

/* Whether what a parked socket holds should be read now: the transfer's end
 * is there (the last chunk of a chunked body: a "0" line, then the blank
 * line; "[DONE]"; the connection closed; an error), or MZ_PEEK_MAX bytes
 * came (a look copies no more: its tail is out of sight). 16 KB is more
 * than the 250 ms of a middle's gap bring at 200 tokens/s, so a fast
 * answer's middle is read at its gap, not a kilobyte at a time (256 such
 * streams of 400 tokens: 15 % less CPU than with 1 KB). Looked at without
 * taking it (MSG_PEEK): libcurl reads it later as if it had just come. The
 * end is at the tail: only the last 64 bytes are searched. A false "yes"
 * costs a read; a "no" for an end the text does not show (trailers, another
 * framing) leaves it to the middle's read. */
int mz_due_worth_reading(curl_socket_t fd) {
  char b[MZ_PEEK_MAX];
  ssize_t n = recv(fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  if (n == 0 || (size_t)n == sizeof b) return 1;
  size_t len = (size_t)n, from = len > 64 ? len - 64 : 0;
  const char *tail = b + from;
  size_t tn = len - from;
  if (tn >= 5 && memcmp(b + len - 4, "\r\n\r\n", 4) == 0) {
    if (from == 0 && memcmp(b, "0\r\n", 3) == 0) return 1;
    for (size_t i = 0; i + 5 <= tn; i++)
      if (tail[i] == '\r' && memcmp(tail + i, "\r\n0\r\n", 5) == 0) return 1;
  }
  for (size_t i = 0; i + 6 <= tn; i++)
    if (tail[i] == '[' && memcmp(tail + i, "[DONE]", 6) == 0) return 1;
  return 0;
}

/* ------------------------------------------------------ the looks */

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

/* The look at s whose time came: its parked socket due for a read, its held
 * events handed over, its own deadlines checked (past one: it ends with
 * "timeout"); then its next look noted. */
static void look(mz_client *c, mz_stream *s, double now) {
  if (s->parked && !s->read_due && s->sock != CURL_SOCKET_BAD) {
    int fresh = s->fresh; /* bytes came since its last look (watch.h's parked set says which) */
    if (now >= s->peek_at) s->fresh = 0;
    if (now >= s->read_at || (now >= s->peek_at && fresh && mz_due_worth_reading(s->sock))) { /* read below */
      s->read_due = 1;
      c->due_now[c->ndue_now++] = s;
    } else if (now >= s->peek_at) {
      double gap = gap_of(s, now);
      next_look(s, now, gap > 0 ? gap : MZ_READ_GAP_MIN);
    } else {
      mz_due_at(s, s->peek_at < s->read_at ? s->peek_at : s->read_at);
    }
  }
  mz_release_held(s, now); /* not yet: notes its time again */
  if (!s->easy || s->term) return;
  double t = own_deadline(s);
  if (now >= t && socket_rx(c, s)) t = own_deadline(s);
  if (now < t) {
    mz_due_at(s, t);
    return;
  }
  mz_flush_carry(s);
  if (s->got_rx && s->stall_s > 0 && now >= s->last_rx + s->stall_s)
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_TIMEOUT,
                    "no data from %s for %.1f s (stall timeout: raise the `stall_timeout` option, or false for none)",
                    s->url, now - s->last_rx);
  else
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_TIMEOUT,
                    "no response head from %s after %.1f s (header timeout: the daemon may be busy or queueing; raise "
                    "the `header_timeout` option, or false for none)",
                    s->url, now - s->t_open);
  mz_detach_easy(s); /* closes the connection: the daemon stops generating */
}

/* The parked streams due (c->due_now: their middle's time came, or their
 * end was seen) are read, whatever came for them (libcurl reads their
 * sockets: what is there, or nothing yet), and the rule sets each one's
 * next looks (mz_due_read, from mz_socket_ready). */
static void read_parked(mz_client *c, double now) {
  for (size_t i = 0; i < c->ndue_now; i++) {
    mz_stream *s = c->due_now[i];
    s->read_due = 0;
    if (s->parked && s->sock != CURL_SOCKET_BAD) mz_socket_ready(c, s->sock, CURL_CSELECT_IN, now);
  }
  c->ndue_now = 0;
}

/* Which parked streams got bytes since they were last looked at: a look
 * for an end where nothing came is not made (the young answers' gaps are
 * shorter than their tokens' pace). */
static void note_fresh(mz_client *c) {
  curl_socket_t fd[MZ_FIRED_MAX];
  size_t k, rounds = c->nstreams / MZ_FIRED_MAX + 1;
  do {
    k = mz_watch_fresh(c->watch, fd, MZ_FIRED_MAX);
    for (size_t i = 0; i < k; i++)
      if (fd[i] >= 0 && (size_t)fd[i] < c->nfd_rx && c->fd_owner[fd[i]]) c->fd_owner[fd[i]]->fresh = 1;
  } while (k == MZ_FIRED_MAX && rounds--);
}

void mz_due_run(mz_client *c, double now) {
  if (c->ndue && c->due[0]->due_at <= now) note_fresh(c);
  while (c->ndue && c->due[0]->due_at <= now) {
    mz_stream *s = c->due[0];
    remove_at(c, 0);
    look(c, s, now);
  }
  if (c->ndue_now) read_parked(c, now);
}
