/*
 * client_int.h - the private side of client.h, shared by its units (the
 * role of curl's urldata.h / multihandle.h):
 *
 *   client.c      the libcurl multi driver: the client, the waits
 *   due.c         when a stream is read (the one rule), and every timed
 *                 look at a stream (a read's due time, a hold, a stall
 *                 or header deadline): one heap
 *   conn.c        connections per server: an idle one is closed while a
 *                 request to its server waits
 *   request.c     a request made a stream: headers, the easy handle's
 *                 options, its socket; mz_stream_open and mz_stream_close
 *   queue.c       the per-stream event queue: arena, items, ready list,
 *                 terminal event, UTF-8 carry, pop (no curl, no sockets)
 *   response.c    what a response means: status, content type, SSE ->
 *                 frames -> queued events, the finish paths, Retry-After
 *   watch_*.c     the wait backend (watch.h), one file per system call
 *   url.c         URL redaction and the clear-text check (pure text)
 *
 * Nothing here is seen outside src/client*.c, request.c, queue.c,
 * response.c and the unit tests of the queue (tests/c/test_queue.c builds
 * a stream by hand).
 */
#ifndef MIRZA_CLIENT_INT_H
#define MIRZA_CLIENT_INT_H

#include <curl/curl.h>
#include <stdio.h>
#include <sys/socket.h>

#include "client.h"
#include "sse.h"
#include "watch.h"

/* A growable byte buffer; p is NUL-terminated after mz_buf_add. */
typedef struct mz_buf {
  char *p;
  size_t len, cap;
} mz_buf;

/* One queued event. Its text is arena[off..off+len): items are laid out
 * in the arena in queue order, back to back (see queue.c). */
typedef struct item {
  mz_evtype type;
  int index;
  size_t off, len; /* text in the arena */
  cJSON *json;     /* owned until popped */
} item;

enum { MODE_UNKNOWN, MODE_SSE, MODE_JSON, MODE_ERRBODY, MODE_PLAIN };

/* Choices whose partial UTF-8 characters are held back (queue.c); those
 * of a higher index (n > 4) are repaired at once. */
#define MZ_CARRY_CHOICES 4

struct mz_stream {
  mz_client *c;
  mz_stream *prev, *next;
  CURL *easy;
  struct curl_slist *hdrs;
  char *url;              /* redacted (mz_redact_url): only for messages */
  int plain, mode, abort; /* abort: make the write callback fail */
  long status;
  mz_sse sse;
  mz_buf arena, body;
  item *q;
  size_t qhead, qlen, qcap;
  cJSON *popped_json;                 /* json of the last popped event */
  char carry[MZ_CARRY_CHOICES][2][4]; /* held-back partial UTF-8 per choice: [0] think, [1] text */
  size_t carry_len[MZ_CARRY_CHOICES][2];
  char finish_reason[32];
  char done_id[96];      /* the completion id: the first frame "id" (done.id), "" if none */
  int no_done;           /* ended cleanly after a finish_reason, no [DONE] */
  size_t invalid_utf8;   /* ill-formed sequences replaced by U+FFFD */
  int skip_bad;          /* on_bad_frame = "skip" */
  int merge;             /* join queued deltas of one channel (mz_request.merge) */
  size_t skipped_frames; /* malformed frames skipped */
  cJSON *usage, *timings, *stats, *extra;
  cJSON *meta;                  /* what the server said of itself and of each choice (response.c), for done */
  double last_rx, stall_s;      /* last byte received (head or body) */
  double retry_after;           /* of an HTTP error: seconds, or -1 */
  double t_open, header_s;      /* header_timeout: until the head is complete */
  int got_rx, head_done;        /* a response byte came; the final head ended */
  curl_socket_t sock;           /* the socket libcurl last watched for it (stall clock) */
  int sock_what;                /* what libcurl watches it for (CURL_POLL_IN/OUT/INOUT) */
  int parked;                   /* its socket is in the parked set: read only when due (due.c) */
  int read_due;                 /* parked, due for a read this look (due.c) */
  double read_at;               /* parked: when it is read next, whatever came */
  double peek_at;               /* parked: when it is looked at for its end next (due.c) */
  int fresh;                    /* parked: bytes came since it was last looked at */
  int sealed;                   /* TLS: what its socket holds cannot be looked at (no peek) */
  double due_at;                /* its key in the client's due heap; INFINITY: not in it */
  size_t due_pos;               /* its index in the heap + 1; 0: not in it */
  int multiplexed;              /* HTTP/2 or later: its socket may carry other streams (never parked) */
  size_t reads;                 /* reads of its socket (the driver's; tests) */
  long connect_ms, deadline_ms; /* to name the clock that fired (0: none) */
  mz_buf headers;               /* "name: value\n" lines, names in lowercase */
  /* the terminal event */
  mz_evtype term; /* 0 while none */
  int term_popped;
  const char *term_code;
  char term_msg[512];
  cJSON *term_json;
  mz_event cur; /* what next() handed out */
  char errbuf[CURL_ERROR_SIZE];
  int sock_errno;           /* why libcurl got no socket (open_socket); 0: it did */
  mz_stream *rprev, *rnext; /* the client's ready list (see queue.c) */
  int listed;               /* on the ready list */
  FILE *rec;                /* record_path: the response as received; NULL when off */
  double hold_s;            /* mz_request.hold_ms in seconds; 0: off */
  double held_until;        /* holding: when the queue is handed over */
  double pushed_at;         /* hold_s: when the last event was queued; 0: none yet */
  int holding;              /* queued events not yet handed over (hold_s) */
  double first_at;          /* the first think/text delta queued; 0: none */
  int answering;            /* a think, text or tool call delta was queued */
  double answer_at;         /* when the first of them was */
  int step;                 /* mz_request.step */
  double next_at;           /* step: when the first delta read after answer_at's read was; 0: none yet */
  unsigned origin;          /* its server: a hash of scheme://host:port (conn.c) */
  mz_stream *oprev, *onext; /* its server's streams in the order opened (conn.c) */
};

/* A connection libcurl kept after a transfer, looked at MZ_IDLE_GRACE_S
 * later (conn.c). */
typedef struct mz_idle {
  curl_socket_t fd;
  unsigned origin;               /* its server (mz_stream.origin) */
  struct sockaddr_storage local; /* its local address: the same connection still */
  socklen_t len;
  double at; /* when the transfer ended */
} mz_idle;

/* A server the client sent to: its streams in the order opened, those
 * still waiting for their head first once looked at (conn.c). */
typedef struct mz_origin {
  unsigned hash;
  mz_stream *head, *tail;
} mz_origin;

/* The driver is event-based (curl_multi_socket_action): libcurl tells
 * which sockets to watch (on_socket) and when its next timeout is due
 * (on_timer); one wait (watch.h: epoll on Linux, poll elsewhere or with
 * cmake -DMIRZA_POLL=ON, scripts/test's sanitizer build) covers them and
 * the wake pipe, and only the transfers whose socket is ready are run. A
 * wake-up costs the sockets that are ready, not every open transfer
 * (curl_multi_perform tries a read on each; poll() asks each socket). */
struct mz_client {
  CURLM *multi;
  mz_stream *streams;
  size_t nstreams;
  volatile sig_atomic_t *intr;
  mz_stream *rhead, *rtail; /* streams that became ready, oldest first */
  mz_watch *watch;          /* libcurl's sockets and the wake pipe */
  double timer_at;          /* libcurl's next timeout (INFINITY: none) */
  double *fd_rx;            /* [fd]: when that socket last became readable */
  mz_stream **fd_owner;     /* [fd]: the stream libcurl watches that socket for, or NULL */
  size_t nfd_rx;
  size_t nrunning;     /* streams whose transfer is attached (easy) */
  int wake[2];         /* the wake pipe (mz_client_wakeup), non-blocking */
  int eintr;           /* a signal cut the last wait short (MZ_NEXT_SIGNAL) */
  double io_now;       /* while libcurl runs a read: when it began (0: not in one), see mz_io_now */
  mz_stream **due;     /* the due heap (due.c): the earliest due_at first */
  mz_stream **due_now; /* the parked streams due at this look (due.c), room for due_cap */
  size_t ndue_now;
  size_t ndue, due_cap;
  mz_idle *idle; /* connections whose transfer ended, oldest first (conn.c) */
  size_t nidle, idle_cap;
  mz_origin *origins; /* the servers sent to (conn.c) */
  size_t norigins;
};

/* The time of the read libcurl is running, for its callbacks' stamps (the
 * stall clock, the first token, a hold's gap): one clock read per socket
 * read instead of one or two per frame; outside a read, the clock. */
static inline double mz_io_now(const mz_client *c) { return c->io_now > 0 ? c->io_now : mz_now(); }

/* ---- queue.c: buffers, the event queue, the ready list */

int mz_buf_reserve(mz_buf *b, size_t extra); /* room for extra more bytes; -1: out of memory */
int mz_buf_add(mz_buf *b, const char *p, size_t len);
void mz_buf_free(mz_buf *b);

/* The terminal event, once: later calls are ignored (the first cause wins). */
void mz_set_terminal(mz_stream *s, mz_evtype t, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void mz_out_of_memory(mz_stream *s); /* terminal "io" error, and abort the transfer */
/* Queue a think/text delta (esc: p is a raw JSON string body, unescaped
 * while copied), or a json-carrying event (json owned from here on). */
void mz_push_text(mz_stream *s, mz_evtype t, int index, const char *p, size_t len, int esc);
void mz_push_json(mz_stream *s, mz_evtype t, int index, cJSON *json);
void mz_flush_carry(mz_stream *s); /* the stream is over: held-back bytes -> U+FFFD */
void mz_unmark_ready(mz_stream *s);
int mz_release_held(mz_stream *s, double now); /* hand a held queue over once its time came */
const mz_event *mz_pop(mz_stream *s);          /* only when mz_ready(s) */
void mz_queue_free(mz_stream *s);              /* everything the queue and the terminal event own */

/* Before each pop: drop the json the previous pop handed out (the caller
 * has copied what it needs by now, see client.h). Inline with mz_ready:
 * both run once per event, from client.c. */
static inline void mz_release_popped(mz_stream *s) {
  cJSON_Delete(s->popped_json);
  s->popped_json = NULL;
}

/* Something to pop: a queued event not held back, or the terminal event
 * not yet popped. */
static inline int mz_ready(const mz_stream *s) {
  return (s->qhead < s->qlen && !s->holding) || (s->term && !s->term_popped);
}

/* ---- response.c: libcurl's callbacks for one transfer, and its end */

size_t mz_on_write(char *p, size_t size, size_t n, void *ud);
size_t mz_on_header(char *p, size_t size, size_t n, void *ud);
int mz_on_sse_event(void *ud, const mz_sse_event *e);
/* The transfer is over (rc from libcurl): queue its terminal event. The
 * easy handle is still attached (the driver detaches it after). */
void mz_on_complete(mz_stream *s, CURLcode rc);

/* ---- request.c */

/* The transfer out of the multi handle and freed (see request.c). */
void mz_detach_easy(mz_stream *s);

/* ---- due.c: when a stream is read; its timed looks */

/* Look at s no later than t (a hold's hand-over, a stall or header
 * deadline, a parked read): an earlier look already due stays. */
void mz_due_at(mz_stream *s, double t);
void mz_due_drop(mz_stream *s);             /* out of the heap (closed) */
int mz_due_reserve(mz_client *c, size_t n); /* room for n streams' entries; -1: out of memory */
double mz_due_next(const mz_client *c);     /* the earliest look due; INFINITY: none */
void mz_due_run(mz_client *c, double now);
/* Its socket was just read (the driver): parked until its next read is
 * due when the rule says so (due.c). */
void mz_due_read(mz_client *c, mz_stream *s, double now);
void mz_due_unpark(mz_client *c, mz_stream *s); /* watched again now */
/* 1 when what parked socket fd holds is worth reading now: its transfer's
 * end, or MZ_PEEK_MAX bytes (due.c; looked at, not taken). */
#define MZ_PEEK_MAX 16384
int mz_due_worth_reading(curl_socket_t fd);
/* Socket fd came ready for ev (CURL_CSELECT_*), or a parked one's read is
 * due (due.c): libcurl runs its transfer (client.c). */
void mz_socket_ready(mz_client *c, curl_socket_t fd, int ev, double now);

/* ---- conn.c: connections per server */

void mz_conn_open(mz_stream *s);  /* s opened: listed under its server */
void mz_conn_close(mz_stream *s); /* s closed: off the list */
/* The transfer e of s is done (its easy handle still attached). */
void mz_conn_done(mz_client *c, CURL *e, mz_stream *s);
double mz_conn_next(const mz_client *c); /* the next idle connection's look; INFINITY: none */
void mz_conn_run(mz_client *c, double now);

#endif
