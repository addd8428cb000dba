/*
 * client_int.h - the private side of client.h, shared by its units (the
 * role of curl's urldata.h / multihandle.h):
 *
 *   client.c      the libcurl multi driver: the client, the waits, our own
 *                 deadlines
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
  int short_answer;         /* mz_request.short_answer: a pause serves it to its end */
  unsigned origin;          /* its server: a hash of scheme://host:port (client.c); 0: not yet taken */
};

/* A connection libcurl kept after a transfer, looked at MZ_IDLE_GRACE_S
 * later (client.c, connections per server). */
typedef struct mz_idle {
  curl_socket_t fd;
  unsigned origin;               /* its server (mz_stream.origin) */
  struct sockaddr_storage local; /* its local address: the same connection still */
  socklen_t len;
  double at; /* when the transfer ended */
} mz_idle;

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
  size_t nfd_rx;
  double next_check;   /* no stall or header deadline before this */
  int wake[2];         /* the wake pipe (mz_client_wakeup), non-blocking */
  int eintr;           /* a signal cut the last wait short (MZ_NEXT_SIGNAL) */
  double io_now;       /* while libcurl runs a read: when it began (0: not in one), see mz_io_now */
  unsigned long ended; /* streams given their terminal event so far: a pause ends when one is */
  mz_idle *idle;       /* connections whose transfer ended, oldest first (client.c) */
  size_t nidle, idle_cap;
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

/* ---- client.c */

/* A deadline of one stream: the stall check runs no later than it. */
static inline void mz_note_deadline(mz_client *c, double t) {
  if (t < c->next_check) c->next_check = t;
}

#endif
