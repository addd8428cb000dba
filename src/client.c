/*
 * client.c - libcurl multi driver: requests, the write callback feeding
 * sse.c and decode.c, per-stream event queues, stall/deadline handling.
 *
 * Memory: each stream owns one byte arena (text of queued events) and one
 * array of queue items; both are reset when the queue drains, so a steady
 * stream does no allocation per token beyond cJSON's own parse. The
 * terminal event (done/error/response) is kept apart from the queue in
 * fixed storage, so a failure can always be reported, even out of memory.
 */
#include "client.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#if defined(__linux__) && !defined(MZ_USE_POLL)
#include <sys/epoll.h>
#else
#include <poll.h>
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "decode.h"
#include "fastframe.h"
#include "mirza.h"
#include "sse.h"

#define ERRBODY_MAX (64u << 10)   /* error bodies: what we keep */
#define HEADERS_MAX (16u << 10)   /* response headers kept for ev.headers */
#define PLAINBODY_MAX (64u << 20) /* plain responses */

typedef struct mz_buf {
  char *p;
  size_t len, cap;
} mz_buf;

typedef struct item {
  mz_evtype type;
  int index;
  size_t off, len; /* text in the arena */
  cJSON *json;     /* owned until popped */
} item;

enum { MODE_UNKNOWN, MODE_SSE, MODE_JSON, MODE_ERRBODY, MODE_PLAIN };

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
  cJSON *popped_json; /* json of the last popped event */
  char carry[2][4];   /* held-back partial UTF-8: [0] think, [1] text */
  size_t carry_len[2];
  char finish_reason[32];
  char done_id[96];      /* the completion id: the first frame "id" (done.id), "" if none */
  int no_done;           /* ended cleanly after a finish_reason, no [DONE] */
  size_t invalid_utf8;   /* ill-formed sequences replaced by U+FFFD */
  int skip_bad;          /* on_bad_frame = "skip" */
  int merge;             /* join queued deltas of one channel (mz_request.merge) */
  size_t skipped_frames; /* malformed frames skipped */
  cJSON *usage, *timings, *stats, *extra;
  double last_rx, stall_s;      /* last byte received (head or body) */
  double retry_after;           /* of an HTTP error: seconds, or -1 */
  double t_open, header_s;      /* header_timeout: until the head is complete */
  int got_rx, head_done;        /* a response byte came; the final head ended */
  curl_socket_t sock;           /* the socket libcurl last watched for it (stall clock) */
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
  mz_stream *rprev, *rnext; /* the client's ready list (see mark_ready) */
  int listed;               /* on the ready list */
  FILE *rec;                /* record_path: the response as received; NULL when off */
};

/* The driver is event-based (curl_multi_socket_action): libcurl tells
 * which sockets to watch (on_socket) and when its next timeout is due
 * (on_timer); one wait (epoll on Linux, poll elsewhere or with
 * MZ_USE_POLL: cmake -DMIRZA_POLL=ON, scripts/test's sanitizer build) covers them and the
 * wake pipe, and only the transfers whose socket is ready are run. A
 * wake-up costs the sockets that are ready, not every open transfer
 * (curl_multi_perform tries a read on each; poll() asks each socket). */
struct mz_client {
  CURLM *multi;
  mz_stream *streams;
  size_t nstreams;
  volatile sig_atomic_t *intr;
  mz_stream *rhead, *rtail; /* streams that became ready, oldest first */
#if defined(__linux__) && !defined(MZ_USE_POLL)
  int epfd; /* libcurl's sockets and the wake pipe */
#else
  struct pollfd *pfd; /* [0]: the wake pipe; then libcurl's sockets */
  size_t npfd, cappfd;
#endif
  double timer_at; /* libcurl's next timeout (INFINITY: none) */
  double *fd_rx;   /* [fd]: when that socket last became readable */
  size_t nfd_rx;
  double next_check; /* no stall or header deadline before this */
  int wake[2];       /* the wake pipe (mz_client_wakeup), non-blocking */
  int eintr;         /* a signal cut the last wait short (MZ_NEXT_SIGNAL) */
};

double mz_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- buffers */

static int buf_reserve(mz_buf *b, size_t extra) {
  if (b->cap - b->len >= extra) return 0;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap - b->len < extra) {
    if (cap > SIZE_MAX / 2) return -1;
    cap *= 2;
  }
  char *p = realloc(b->p, cap);
  if (!p) return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}

static int buf_add(mz_buf *b, const char *p, size_t len) {
  if (buf_reserve(b, len + 1)) return -1;
  memcpy(b->p + b->len, p, len);
  b->len += len;
  b->p[b->len] = '\0';
  return 0;
}

static void buf_free(mz_buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

/* ------------------------------------------------------- redaction */

int mz_is_secret(const char *name, size_t len) {
  static const char *const words[] = {"auth", "cookie", "key", "token", "secret", "password", "passwd", NULL};
  for (int w = 0; words[w]; w++) {
    size_t n = strlen(words[w]);
    for (size_t i = 0; i + n <= len; i++)
      if (strncasecmp(name + i, words[w], n) == 0) return 1;
  }
  return 0;
}

/* Where the userinfo of url ends (its '@'), or NULL: the authority runs
 * from after "scheme://" (or the start, for a scheme-less URL as libcurl
 * guesses it) to the first '/', '?' or '#'. */
static const char *userinfo_end(const char *url, const char **start) {
  const char *a = url, *sep = strstr(url, "://");
  if (sep && sep > url && isalpha((unsigned char)*url) &&
      strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-") == (size_t)(sep - url))
    a = sep + 3;
  const char *end = a + strcspn(a, "/?#"), *at = NULL;
  for (const char *p = a; p < end; p++)
    if (*p == '@') at = p;
  *start = a;
  return at;
}

/* One pass of the rule into out (cap bytes, NUL-terminated when cap > 0);
 * returns the length of the whole result, like snprintf. */
static size_t redact_into(const char *url, char *out, size_t cap) {
  size_t n = 0;
#define PUT(p, len)                                                                                                    \
  do {                                                                                                                 \
    size_t l_ = (len);                                                                                                 \
    if (n < cap) memcpy(out + n, (p), l_ < cap - n ? l_ : cap - n);                                                    \
    n += l_;                                                                                                           \
  } while (0)
  const char *a, *at = userinfo_end(url, &a), *p = url;
  if (at) {
    PUT(url, (size_t)(a - url));
    PUT("[redacted]", 10);
    p = at;
  }
  while (*p) { /* as record.lua's gsub("([?&])([^=&#]+)=([^&#]*)") */
    size_t k = (*p == '?' || *p == '&') ? strcspn(p + 1, "=&#") : 0;
    if (!k || p[1 + k] != '=') {
      PUT(p, 1);
      p++;
      continue;
    }
    const char *v = p + 2 + k;
    size_t vl = strcspn(v, "&#");
    PUT(p, 2 + k);
    if (mz_is_secret(p + 1, k)) PUT("[redacted]", 10);
    else PUT(v, vl);
    p = v + vl;
  }
#undef PUT
  if (cap) out[n < cap ? n : cap - 1] = '\0';
  return n;
}

/* A host name or address literal (len bytes) that means this machine. */
static int loopback_host(const char *h, size_t len) {
  char buf[256];
  struct in_addr a4;
  struct in6_addr a6;
  if (len && h[len - 1] == '.') len--; /* "localhost." */
  if (!len || len >= sizeof buf) return 0;
  memcpy(buf, h, len);
  buf[len] = '\0';
  if (buf[0] == '[') { /* [::1], [::ffff:127.0.0.1], a zone after % */
    buf[strcspn(buf, "]%")] = '\0';
    if (inet_pton(AF_INET6, buf + 1, &a6) != 1) return 0;
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return 1;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  if (inet_aton(buf, &a4)) return (ntohl(a4.s_addr) >> 24) == 127; /* also 127.1, as libcurl reads it */
  if (strcasecmp(buf, "localhost") == 0) return 1;
  const char *dot = strrchr(buf, '.'); /* a name under .localhost (RFC 6761) */
  return dot && dot > buf && strcasecmp(dot, ".localhost") == 0;
}

int mz_url_plain_remote(const char *url) {
  const char *a, *at = userinfo_end(url, &a), *sep = strstr(url, "://");
  if (a != url && !(sep + 3 == a && sep - url == 4 && strncasecmp(url, "http", 4) == 0)) return 0; /* https, ... */
  const char *h = at ? at + 1 : a, *end = h + strcspn(h, "/?#");
  const char *colon = *h == '[' ? memchr(h, ']', (size_t)(end - h)) : h;
  colon = colon ? memchr(colon, ':', (size_t)(end - colon)) : NULL;
  size_t len = (size_t)((colon ? colon : end) - h);
  return len > 0 && !loopback_host(h, len);
}

char *mz_redact_url(const char *url) {
  size_t n = redact_into(url, NULL, 0);
  char *out = malloc(n + 1);
  if (out) redact_into(url, out, n + 1);
  return out;
}

/* ------------------------------------------------------- ready list */

/*
 * The ready list: an intrusive FIFO of the streams that got an event (or
 * their terminal event) queued since they were last taken off it by
 * mz_client_ready(). Each stream is on it at most once, so marking is O(1)
 * and a scheduler wakes exactly the streams that changed, however many are
 * open. Closing a stream unlinks it.
 */
static void mark_ready(mz_stream *s) {
  mz_client *c = s->c;
  if (s->listed) return;
  s->listed = 1;
  s->rnext = NULL;
  s->rprev = c->rtail;
  if (c->rtail) c->rtail->rnext = s;
  else c->rhead = s;
  c->rtail = s;
}

static void unmark_ready(mz_stream *s) {
  mz_client *c = s->c;
  if (!s->listed) return;
  if (s->rprev) s->rprev->rnext = s->rnext;
  else c->rhead = s->rnext;
  if (s->rnext) s->rnext->rprev = s->rprev;
  else c->rtail = s->rprev;
  s->listed = 0;
  s->rprev = s->rnext = NULL;
}

/* ------------------------------------------------------- terminal events */

/* Record the terminal event once; later calls are ignored so the first
 * cause wins (a protocol error is not overwritten by the abort it causes). */
static void set_terminal(mz_stream *s, mz_evtype t, const char *code, const char *fmt, ...) {
  if (s->term) return;
  mark_ready(s);
  s->term = t;
  s->term_code = code;
  s->term_msg[0] = '\0';
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->term_msg, sizeof s->term_msg, fmt, ap);
    va_end(ap);
  }
}

static item *q_push(mz_stream *s, mz_evtype t, int index) {
  if (s->qlen == s->qcap) {
    size_t cap = s->qcap ? s->qcap * 2 : 64;
    item *q = realloc(s->q, cap * sizeof *q);
    if (!q) return NULL;
    s->q = q;
    s->qcap = cap;
  }
  mark_ready(s);
  item *it = &s->q[s->qlen++];
  it->type = t;
  it->index = index;
  it->off = s->arena.len;
  it->len = 0;
  it->json = NULL;
  return it;
}

static void out_of_memory(mz_stream *s) {
  set_terminal(s, MZ_EV_ERROR, MZ_E_IO, "out of memory");
  s->abort = 1;
}

/* Queue a json-carrying event, taking ownership of json. */
static void push_json(mz_stream *s, mz_evtype t, int index, cJSON *json) {
  item *it = json ? q_push(s, t, index) : NULL;
  if (!it) {
    cJSON_Delete(json);
    out_of_memory(s);
    return;
  }
  it->json = json;
}

/* The new text at arena[off..off+len) as valid UTF-8: scanned once (the
 * common case ends there), and only when ill-formed rewritten past the end
 * of the arena and moved back. Returns the new length. */
static size_t repair_utf8(mz_stream *s, size_t off, size_t len) {
  size_t v = mz_utf8_valid(s->arena.p + off, len), bad = len - v;
  if (v == len) return len;
  if (buf_reserve(&s->arena, len + 3 * bad + 1)) { /* arena.len is still off */
    out_of_memory(s);
    return len;
  }
  char *tail = s->arena.p + off + v, *out = s->arena.p + off + len;
  size_t n = mz_utf8_repair(tail, bad, out, &s->invalid_utf8);
  memmove(tail, out, n);
  return v + n;
}

/*
 * Queue a text delta. For choice 0 a trailing incomplete UTF-8 sequence is
 * held back (at most 3 bytes per channel) and put in front of the next
 * delta of the same channel, so Lua only ever sees whole characters.
 * With esc, p is a raw JSON string body, unescaped while copied (the
 * output is never longer, so the reservation holds).
 */
static void push_text_esc(mz_stream *s, mz_evtype t, int index, const char *p, size_t len, int esc) {
  int ch = t == MZ_EV_THINK ? 0 : 1;
  size_t held = index == 0 ? s->carry_len[ch] : 0;
  if (buf_reserve(&s->arena, held + len + 1)) {
    out_of_memory(s);
    return;
  }
  size_t off = s->arena.len;
  memcpy(s->arena.p + off, s->carry[ch], held);
  if (esc) len = mz_json_unescape(p, len, s->arena.p + off + held);
  else memcpy(s->arena.p + off + held, p, len);
  size_t total = held + len, keep = total;
  if (index == 0) {
    keep = mz_utf8_complete(s->arena.p + off, total);
    s->carry_len[ch] = total - keep;
    memcpy(s->carry[ch], s->arena.p + off + keep, total - keep);
  }
  if (keep == 0) return;
  keep = repair_utf8(s, off, keep);
  item *it = q_push(s, t, index);
  if (!it) {
    out_of_memory(s);
    return;
  }
  it->off = off;
  it->len = keep;
  s->arena.len = off + keep;
}

static void push_text(mz_stream *s, mz_evtype t, int index, const char *p, size_t len) {
  push_text_esc(s, t, index, p, len, 0);
}

/* The stream is over: a held-back partial character will never be
 * completed, so it becomes one U+FFFD (counted), never silently dropped. */
static void flush_carry(mz_stream *s) {
  for (int ch = 0; ch < 2; ch++) {
    if (!s->carry_len[ch]) continue;
    s->carry_len[ch] = 0;
    s->invalid_utf8++;
    item *it = q_push(s, ch == 0 ? MZ_EV_THINK : MZ_EV_TEXT, 0);
    if (!it || buf_add(&s->arena, "\xEF\xBF\xBD", 3)) {
      out_of_memory(s);
      return;
    }
    it->len = 3;
  }
}

/* ------------------------------------------------------- frame handling */

static void replace(cJSON **slot, cJSON *v) {
  cJSON_Delete(*slot);
  *slot = v;
}

/* Take a top-level item out of the frame's tree (NULL-safe). */
static cJSON *take(mz_frame *f, const cJSON *it) {
  return it ? cJSON_DetachItemViaPointer(f->root, (cJSON *)it) : NULL;
}

static int known_key(const char *k) {
  static const char *const keys[] = {"id",      "object", "created", "model",       "system_fingerprint",
                                     "choices", "usage",  "timings", "mtplx_stats", "mtplx_progress",
                                     "error",   NULL};
  for (int i = 0; keys[i]; i++)
    if (strcmp(k, keys[i]) == 0) return 1;
  return 0;
}

/* Unknown top-level fields are kept (last value wins) in done.extra. */
static void keep_unknown(mz_stream *s, mz_frame *f) {
  if (!s->extra && !(s->extra = cJSON_CreateObject())) return;
  for (cJSON *it = f->root->child; it;) {
    cJSON *nx = it->next;
    if (it->string && !known_key(it->string)) {
      const char *k = it->string;
      cJSON_DeleteItemFromObjectCaseSensitive(s->extra, k);
      cJSON *v = cJSON_DetachItemViaPointer(f->root, it);
      cJSON_AddItemToObject(s->extra, v->string, v);
    }
    it = nx;
  }
}

static cJSON *make_done(mz_stream *s) {
  cJSON *d = cJSON_CreateObject();
  if (!d) return NULL;
  if (s->finish_reason[0]) cJSON_AddStringToObject(d, "finish_reason", s->finish_reason);
  if (s->done_id[0]) cJSON_AddStringToObject(d, "id", s->done_id);
  if (s->usage) cJSON_AddItemToObject(d, "usage", s->usage);
  if (s->stats) cJSON_AddItemToObject(d, "stats", s->stats);
  if (s->timings) cJSON_AddItemToObject(d, "timings", s->timings);
  if (s->extra) cJSON_AddItemToObject(d, "extra", s->extra);
  if (s->no_done) cJSON_AddTrueToObject(d, "no_done_marker");
  if (s->invalid_utf8) cJSON_AddNumberToObject(d, "invalid_utf8", (double)s->invalid_utf8);
  if (s->skipped_frames) cJSON_AddNumberToObject(d, "skipped_frames", (double)s->skipped_frames);
  s->usage = s->stats = s->timings = s->extra = NULL;
  return d;
}

static void finish_done(mz_stream *s) {
  flush_carry(s);
  set_terminal(s, MZ_EV_DONE, NULL, NULL);
  s->term_json = make_done(s);
}

static void handle_choice(mz_stream *s, const mz_choice *c) {
  if (c->reasoning_len) push_text(s, MZ_EV_THINK, c->index, c->reasoning, c->reasoning_len);
  if (c->content_len) push_text(s, MZ_EV_TEXT, c->index, c->content, c->content_len);
  if (c->tool_calls) push_json(s, MZ_EV_TOOL_CALL, c->index, cJSON_Duplicate(c->tool_calls, 1));
  if (c->finish_reason && (c->index == 0 || !s->finish_reason[0]))
    snprintf(s->finish_reason, sizeof s->finish_reason, "%s", c->finish_reason);
}

static void handle_error_value(mz_stream *s, mz_frame *f) {
  const char *type = NULL;
  char code[64] = "";
  const char *msg = mz_error_message(f->error, &type, code, sizeof code);
  flush_carry(s);
  set_terminal(s, MZ_EV_ERROR, MZ_E_SERVER, "server error: %s", msg ? msg : "(no message)");
  s->term_json = take(f, f->error);
}

/* One decoded payload: text first, then side data, then errors/end, so
 * everything a frame carries is queued before the terminal event. */
static void handle_frame(mz_stream *s, mz_frame *f) {
  if (f->done) {
    finish_done(s);
    return;
  }
  mz_choice c;
  /* token frames (the fast path) skip the id; the role and finish frames carry it too */
  if (f->id && !s->done_id[0]) snprintf(s->done_id, sizeof s->done_id, "%s", f->id);
  for (int i = 0; i < f->nchoices; i++)
    if (mz_frame_choice(f, i, &c) == 0) handle_choice(s, &c);
  if (f->progress) push_json(s, f->heartbeat ? MZ_EV_HEARTBEAT : MZ_EV_PROGRESS, 0, take(f, f->progress));
  if (f->usage) replace(&s->usage, take(f, f->usage));
  if (f->timings) replace(&s->timings, take(f, f->timings));
  if (f->stats) replace(&s->stats, take(f, f->stats));
  if (f->unknown) keep_unknown(s, f);
  if (f->error) handle_error_value(s, f);
}

/* A token frame read by the fast path: same events as handle_choice. */
static void handle_fast(mz_stream *s, const mz_fast *f) {
  if (f->reasoning.len) push_text_esc(s, MZ_EV_THINK, f->index, f->reasoning.p, f->reasoning.len, f->reasoning.esc);
  if (f->content.len) push_text_esc(s, MZ_EV_TEXT, f->index, f->content.p, f->content.len, f->content.esc);
}

static int on_sse_event(void *ud, const mz_sse_event *e) {
  mz_stream *s = ud;
  char err[128];
  mz_frame f;
  if (s->term) return 1;
  int is_error = e->type_len == 5 && memcmp(e->type, "error", 5) == 0;
  if (!is_error && strcmp(e->type, "message") != 0) return 0; /* other event types: not ours */
  mz_fast ff;                                                 /* most frames are plain tokens: no cJSON tree for them */
  if (!is_error && mz_fast_frame(e->data, e->data_len, &ff)) {
    handle_fast(s, &ff);
    return s->term ? 1 : 0;
  }
  int bad = mz_frame_decode(&f, e->data, e->data_len, err, sizeof err) != 0;
  if (is_error && (bad || !f.error)) { /* event: error, plain text or no error object */
    flush_carry(s);
    set_terminal(s, MZ_EV_ERROR, MZ_E_SERVER, "server error: %.200s", e->data);
  } else if (bad) {
    if (s->skip_bad) { /* a server known to emit junk */
      s->skipped_frames++;
      mz_frame_free(&f);
      return 0;
    }
    flush_carry(s);
    set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "malformed frame (%s): %.80s", err, e->data);
    s->abort = 1;
  } else {
    handle_frame(s, &f);
  }
  mz_frame_free(&f);
  return s->term ? 1 : 0;
}

/* ------------------------------------------------------ curl callbacks */

/* Decide how to read the body from the status and content type. */
static void classify(mz_stream *s) {
  char *ct = NULL;
  curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &s->status);
  curl_easy_getinfo(s->easy, CURLINFO_CONTENT_TYPE, &ct);
  if (s->status >= 300) s->mode = MODE_ERRBODY; /* redirects are not followed */
  else if (s->plain) s->mode = MODE_PLAIN;
  else if (ct && strstr(ct, "json") && !strstr(ct, "event-stream")) s->mode = MODE_JSON;
  else s->mode = MODE_SSE;
}

/* A deadline of one stream: the stall check runs no later than it. */
static void note_deadline(mz_client *c, double t) {
  if (t < c->next_check) c->next_check = t;
}

/* A response byte came: the stall timer runs from now. */
static void received(mz_stream *s) {
  s->last_rx = mz_now();
  if (!s->got_rx) {
    s->got_rx = 1;
    if (s->stall_s > 0) note_deadline(s->c, s->last_rx + s->stall_s);
  }
}

static size_t on_write(char *p, size_t size, size_t n, void *ud) {
  mz_stream *s = ud;
  size_t len = size * n;
  if (s->rec) fwrite(p, 1, len, s->rec); /* recording: the bytes before any parsing */
  received(s);
  if (s->mode == MODE_UNKNOWN) classify(s);
  if (s->abort) return 0;
  if (s->term) return len; /* read to the end so the connection is reused */
  if (s->mode == MODE_SSE) {
    int rc = mz_sse_feed(&s->sse, p, len);
    if (rc < 0) {
      flush_carry(s);
      set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "%s (limit %zu bytes)", mz_sse_strerror(rc), s->sse.max);
      s->abort = 1;
    }
    return s->abort ? 0 : len;
  }
  size_t cap = s->mode == MODE_ERRBODY ? ERRBODY_MAX : PLAINBODY_MAX;
  size_t room = s->body.len < cap ? cap - s->body.len : 0;
  if (room && buf_add(&s->body, p, len < room ? len : room)) out_of_memory(s);
  if (len > room && s->mode != MODE_ERRBODY) {
    set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "response body over %u bytes", PLAINBODY_MAX);
    return 0;
  }
  return s->abort ? 0 : len;
}

/* One line of the response head into a recording: a header whose name
 * looks like a credential (Set-Cookie, ...: mz_is_secret) as "Name:
 * [redacted]", the line end kept. */
static void record_header(FILE *f, const char *p, size_t len) {
  const char *colon = memchr(p, ':', len);
  if (colon && colon > p && !(len >= 5 && memcmp(p, "HTTP/", 5) == 0) && mz_is_secret(p, (size_t)(colon - p))) {
    size_t eol = len;
    while (eol && (p[eol - 1] == '\n' || p[eol - 1] == '\r')) eol--;
    fwrite(p, 1, (size_t)(colon - p), f);
    fputs(": [redacted]", f);
    fwrite(p + eol, 1, len - eol, f);
    return;
  }
  fwrite(p, 1, len, f);
}

/* One line of the response head. Every line counts as received data for
 * the stall timer (a slow head is no stall). A status line starts a new
 * head (after a 1xx), so only the final response's headers are kept. */
static size_t on_header(char *p, size_t size, size_t n, void *ud) {
  mz_stream *s = ud;
  size_t len = size * n, name;
  if (s->rec) record_header(s->rec, p, len); /* recording: status line, headers, blank line */
  received(s);
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) {
    s->headers.len = 0;
    return len;
  }
  while (len && (p[len - 1] == '\n' || p[len - 1] == '\r')) len--;
  if (!len) { /* the blank line: a final head unless 1xx */
    long st = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &st);
    s->head_done = st >= 200;
    return size * n;
  }
  const char *colon = memchr(p, ':', len);
  if (!colon || colon == p || s->headers.len + len + 2 > HEADERS_MAX) return size * n;
  name = (size_t)(colon - p);
  size_t at = s->headers.len;
  if (buf_add(&s->headers, p, len) || buf_add(&s->headers, "\n", 1)) return size * n;
  for (size_t i = 0; i < name; i++) s->headers.p[at + i] = (char)tolower((unsigned char)s->headers.p[at + i]);
  return size * n;
}

/* The value of a kept response header (name in lowercase), trimmed, into
 * out; NULL when absent. */
static const char *header_value(const mz_stream *s, const char *name, char *out, size_t outlen) {
  size_t n = strlen(name);
  for (const char *l = s->headers.p, *end = l + s->headers.len; l && l < end;) {
    const char *nl = memchr(l, '\n', (size_t)(end - l));
    if (!nl) break;
    if ((size_t)(nl - l) > n && memcmp(l, name, n) == 0 && l[n] == ':') {
      const char *v = l + n + 1;
      while (v < nl && (*v == ' ' || *v == '\t')) v++;
      size_t vl = (size_t)(nl - v);
      while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
      snprintf(out, outlen, "%.*s", (int)vl, v);
      return out;
    }
    l = nl + 1;
  }
  return NULL;
}

/* Retry-After in seconds from now: delta-seconds or an HTTP-date (a date
 * in the past is 0); -1 when absent or unreadable. */
static double retry_after(const mz_stream *s) {
  char v[128], *end;
  if (!header_value(s, "retry-after", v, sizeof v) || !*v) return -1;
  errno = 0;
  long secs = strtol(v, &end, 10);
  if (*end == '\0' && end != v && !errno) return secs < 0 ? -1 : (double)secs;
  time_t t = curl_getdate(v, NULL);
  if (t == (time_t)-1) return -1;
  double d = difftime(t, time(NULL));
  return d > 0 ? d : 0;
}

/* ------------------------------------------------------ completion */

/* A 3xx: not followed (a redirect silently re-sending a chat request is
 * rarely what a local setup wants): a clear error naming the target. */
static void finish_redirect(mz_stream *s) {
  char *to = NULL, *shown;
  curl_easy_getinfo(s->easy, CURLINFO_REDIRECT_URL, &to);
  shown = to ? mz_redact_url(to) : NULL; /* a Location may carry credentials too */
  const char *reason = mz_http_reason(s->status);
  set_terminal(s, MZ_EV_ERROR, MZ_E_HTTP, "HTTP %ld%s%s to %s (redirects are not followed: use that url)", s->status,
               *reason ? " " : "", reason,
               shown ? shown
               : to  ? "(a url)"
                     : "(no Location)");
  free(shown);
}

static void finish_http_error(mz_stream *s) {
  char msg[sizeof s->term_msg];
  s->retry_after = retry_after(s);
  if (s->status < 400) {
    finish_redirect(s);
    return;
  }
  mz_http_error_message(s->status, s->body.p, s->body.len, msg, sizeof msg);
  set_terminal(s, MZ_EV_ERROR, MZ_E_HTTP, "%s", msg);
  s->term_json = mz_http_error_object(s->body.p, s->body.len); /* ev.error */
}

/* A 200 with a JSON body where a stream was asked for: a non-streamed
 * chat.completion (some servers ignore "stream"). Same events as a stream. */
static void finish_json_body(mz_stream *s) {
  mz_frame f;
  char err[128];
  if (mz_frame_decode(&f, s->body.p ? s->body.p : "", s->body.len, err, sizeof err) != 0) {
    set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "malformed response (%s)", err);
  } else {
    handle_frame(s, &f);
    finish_done(s);
  }
  mz_frame_free(&f);
}

/* Which of libcurl's two clocks ended the transfer, and what to change. */
static const char *which_clock(const mz_stream *s) {
  curl_off_t connected = 0;
  curl_easy_getinfo(s->easy, CURLINFO_CONNECT_TIME_T, &connected);
  if (!connected && s->connect_ms && (!s->deadline_ms || s->connect_ms <= s->deadline_ms))
    return "connect timeout: no TCP connection in time; raise the `timeout` option (engine, batch: `connect_timeout`), "
           "or check the address";
  return "deadline: the whole request took longer than the `deadline` option; raise it, or false for none";
}

static void finish_transport_error(mz_stream *s, CURLcode rc) {
  const char *code = MZ_E_IO;
  int closed = 0;
  switch (rc) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_COULDNT_RESOLVE_HOST: code = MZ_E_REFUSED; break;
  case CURLE_OPERATION_TIMEDOUT: code = MZ_E_TIMEOUT; break;
  case CURLE_PARTIAL_FILE:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_SEND_ERROR:
    code = MZ_E_CLOSED;
    closed = 1;
    break;
  default: break;
  }
  flush_carry(s);
  const char *why = s->errbuf[0] ? s->errbuf : curl_easy_strerror(rc);
  if (closed && s->status) set_terminal(s, MZ_EV_ERROR, code, "connection closed mid-stream (%s)", why);
  else if (rc == CURLE_OPERATION_TIMEDOUT)
    set_terminal(s, MZ_EV_ERROR, code, "%s: %s (%s)", s->url, why, which_clock(s));
  else set_terminal(s, MZ_EV_ERROR, code, "%s: %s", s->url, why);
}

static void detach_easy(mz_stream *s) {
  if (!s->easy) return;
  curl_multi_remove_handle(s->c->multi, s->easy);
  curl_easy_cleanup(s->easy);
  s->easy = NULL;
}

static void on_complete(mz_stream *s, CURLcode rc) {
  if (s->mode == MODE_UNKNOWN && rc == CURLE_OK) classify(s);
  if (s->mode == MODE_ERRBODY && (rc == CURLE_OK || s->body.len)) finish_http_error(s);
  else if (rc != CURLE_OK) finish_transport_error(s, rc);
  else if (s->mode == MODE_PLAIN) set_terminal(s, MZ_EV_RESPONSE, NULL, NULL);
  else if (s->mode == MODE_JSON) finish_json_body(s);
  else if (!s->term) {
    int partial = mz_sse_finish(&s->sse);
    if (!s->term && !partial && s->finish_reason[0]) {
      s->no_done = 1; /* servers and proxies that never send [DONE] */
      finish_done(s);
    } else if (!s->term) {
      flush_carry(s);
      set_terminal(s, MZ_EV_ERROR, MZ_E_CLOSED, "stream ended without [DONE]%s",
                   partial ? " (cut inside an event)" : "");
    }
  }
  detach_easy(s);
}

/* ------------------------------------------------------ the driver */

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
    if (!s->easy || s->term) continue;
    double t = own_deadline(s);
    if (now >= t && socket_rx(c, s)) t = own_deadline(s);
    if (now < t) {
      note_deadline(c, t);
      continue;
    }
    flush_carry(s);
    if (s->got_rx && s->stall_s > 0 && now >= s->last_rx + s->stall_s)
      set_terminal(s, MZ_EV_ERROR, MZ_E_TIMEOUT,
                   "no data from %s for %.1f s (stall timeout: raise the `stall_timeout` option, or false for none)",
                   s->url, now - s->last_rx);
    else
      set_terminal(s, MZ_EV_ERROR, MZ_E_TIMEOUT,
                   "no response head from %s after %.1f s (header timeout: the daemon may be busy or queueing; raise "
                   "the `header_timeout` option, or false for none)",
                   s->url, now - s->t_open);
    detach_easy(s); /* closes the connection: the daemon stops generating */
  }
}

/* ---- the watch set: libcurl's sockets and the wake pipe */

typedef struct fired {
  curl_socket_t fd;
  int ev; /* CURL_CSELECT_* */
} fired;

enum { FIRED_MAX = 64 }; /* per wait; level-triggered: the rest come next time */

#if defined(__linux__) && !defined(MZ_USE_POLL)
static int watch_init(mz_client *c) {
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = c->wake[0]};
  c->epfd = epoll_create1(EPOLL_CLOEXEC);
  return c->epfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->wake[0], &ev) ? -1 : 0;
}

static void watch_free(mz_client *c) {
  if (c->epfd >= 0) close(c->epfd);
}

static int watch_set(mz_client *c, curl_socket_t fd, int what) {
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(c->epfd, EPOLL_CTL_DEL, fd, NULL); /* ENOENT/EBADF: gone already */
    return 0;
  }
  struct epoll_event ev = {.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u),
                           .data.fd = fd};
  if (epoll_ctl(c->epfd, EPOLL_CTL_MOD, fd, &ev) == 0) return 0;
  return epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev) ? -1 : 0;
}

static size_t watch_wait(mz_client *c, int ms, fired *out, int *woken) {
  struct epoll_event evs[FIRED_MAX];
  int n = epoll_wait(c->epfd, evs, FIRED_MAX, ms);
  if (n < 0 && errno == EINTR) c->eintr = 1;
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    uint32_t r = evs[i].events;
    if (evs[i].data.fd == c->wake[0]) {
      *woken = 1;
      continue;
    }
    out[k].fd = evs[i].data.fd;
    out[k++].ev = ((r & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) ? CURL_CSELECT_IN : 0) |
                  ((r & EPOLLOUT) ? CURL_CSELECT_OUT : 0) | ((r & EPOLLERR) ? CURL_CSELECT_ERR : 0);
  }
  return k;
}
#else
static int watch_init(mz_client *c) {
  if (!(c->pfd = malloc(16 * sizeof *c->pfd))) return -1;
  c->pfd[0] = (struct pollfd){.fd = c->wake[0], .events = POLLIN};
  c->npfd = 1;
  c->cappfd = 16;
  return 0;
}

static void watch_free(mz_client *c) { free(c->pfd); }

static int watch_set(mz_client *c, curl_socket_t fd, int what) {
  size_t i = 1;
  while (i < c->npfd && c->pfd[i].fd != fd) i++;
  if (what == CURL_POLL_REMOVE) {
    if (i < c->npfd) c->pfd[i] = c->pfd[--c->npfd];
    return 0;
  }
  if (i == c->npfd) {
    if (c->npfd == c->cappfd) {
      struct pollfd *p = realloc(c->pfd, 2 * c->cappfd * sizeof *p);
      if (!p) return -1;
      c->pfd = p;
      c->cappfd *= 2;
    }
    c->npfd++;
  }
  c->pfd[i] = (struct pollfd){
      .fd = fd, .events = (short)(((what & CURL_POLL_IN) ? POLLIN : 0) | ((what & CURL_POLL_OUT) ? POLLOUT : 0))};
  return 0;
}

static size_t watch_wait(mz_client *c, int ms, fired *out, int *woken) {
  int n = poll(c->pfd, (nfds_t)c->npfd, ms);
  if (n < 0 && errno == EINTR) c->eintr = 1;
  size_t k = 0;
  if (n > 0 && c->pfd[0].revents) *woken = 1, n--;
  for (size_t i = 1; n > 0 && i < c->npfd && k < FIRED_MAX; i++) {
    short r = c->pfd[i].revents;
    if (!r) continue;
    n--;
    out[k].fd = c->pfd[i].fd;
    out[k++].ev = ((r & (POLLIN | POLLHUP)) ? CURL_CSELECT_IN : 0) | ((r & POLLOUT) ? CURL_CSELECT_OUT : 0) |
                  ((r & (POLLERR | POLLNVAL)) ? CURL_CSELECT_ERR : 0);
  }
  return k;
}
#endif

/* libcurl's socket callback: watch `fd` for `what`, or forget it. */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *ud, void *sockp) {
  mz_client *c = ud;
  (void)sockp;
  if (what != CURL_POLL_REMOVE) { /* called when the watch changes, not per read */
    mz_stream *s = NULL;
    if (e) curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&s);
    if (s) s->sock = fd;
    if (fd >= 0 && (size_t)fd >= c->nfd_rx) {
      size_t n = (size_t)fd + 64;
      double *p = realloc(c->fd_rx, n * sizeof *p);
      if (!p) return -1;
      for (size_t i = c->nfd_rx; i < n; i++) p[i] = 0;
      c->fd_rx = p;
      c->nfd_rx = n;
    }
  }
  return watch_set(c, fd, what); /* -1: libcurl fails the transfer */
}

/* libcurl's timer callback: run its timeouts in timeout_ms (-1: none). */
static int on_timer(CURLM *m, long timeout_ms, void *ud) {
  mz_client *c = ud;
  (void)m;
  c->timer_at = timeout_ms < 0 ? INFINITY : mz_now() + (double)timeout_ms / 1000.0;
  return 0;
}

/* Wait up to ms (0: only what is ready now; <0: until something happens)
 * for a socket, libcurl's timer or a wake-up, then run what is due: the
 * transfers of the ready sockets, libcurl's timeouts, finished transfers,
 * our own deadlines. */
static void drive(mz_client *c, int ms) {
  double now = mz_now();
  if (c->timer_at <= now) ms = 0;
  else if (c->timer_at < INFINITY) {
    double t = ceil((c->timer_at - now) * 1000.0);
    if (ms < 0 || t < ms) ms = (int)t;
  }
  fired f[FIRED_MAX];
  int woken = 0, running, left;
  size_t k = watch_wait(c, ms, f, &woken); /* a copy: socket_action edits the set */
  if (woken) {
    char buf[64];
    while (read(c->wake[0], buf, sizeof buf) > 0) {}
  }
  now = k ? mz_now() : now;
  for (size_t i = 0; i < k; i++) {
    if ((f[i].ev & CURL_CSELECT_IN) && (size_t)f[i].fd < c->nfd_rx) /* bytes: progress (socket_rx) */
      c->fd_rx[f[i].fd] = now;
    curl_multi_socket_action(c->multi, f[i].fd, f[i].ev, &running);
  }
  if (c->timer_at <= mz_now()) {
    c->timer_at = INFINITY; /* on_timer may set it again from inside */
    curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  }
  CURLMsg *m;
  while ((m = curl_multi_info_read(c->multi, &left))) {
    if (m->msg != CURLMSG_DONE) continue;
    mz_stream *s = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&s);
    if (s && s->rec) { /* the recording is whole: on disk before the last event is read */
      fclose(s->rec);
      s->rec = NULL;
    }
    if (s) on_complete(s, m->data.result);
  }
  check_stalls(c, mz_now());
}

static int ready(const mz_stream *s) { return s->qhead < s->qlen || (s->term && !s->term_popped); }

static int count_ready(const mz_client *c) {
  int n = 0;
  for (const mz_stream *s = c->streams; s; s = s->next) n += ready(s);
  return n;
}

/* Seconds until the nearest stall or header deadline (or `cap`). */
static double next_stall(const mz_client *c, double now, double cap) {
  double left = c->next_check - now;
  return left < cap ? (left > 0 ? left : 0) : cap;
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

/*
 * The one wait loop. Returns when `target` (or, with target NULL, any
 * stream) has something to pop, at the deadline `end`, on interrupt, or
 * when no transfer could make progress any more.
 */
static int wait_loop(mz_client *c, mz_stream *target, double end) {
  c->eintr = 0;
  for (int ms = 0;;) { /* first what is ready now, then wait */
    drive(c, ms);
    int n = target ? ready(target) : count_ready(c);
    if (n) return n;
    if ((n = interrupted(c))) return n;
    if (target ? (!target->easy && target->term) : !any_running(c)) return 0;
    double now = mz_now(), left = end - now;
    if (left <= 0) return 0;
    left = next_stall(c, now, left < 3600 ? left : 3600);
    ms = (int)ceil(left * 1000.0);
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

/* Wait for the ready list to be non-empty (see mz_client_wait_ready). */
int mz_client_wait_ready(mz_client *c, long timeout_ms) {
  double end = deadline_from(timeout_ms);
  c->eintr = 0;
  for (int ms = 0, rc;;) {
    drive(c, ms);
    while (c->rhead && !ready(c->rhead)) unmark_ready(c->rhead); /* drained meanwhile */
    if (c->rhead) return 1;
    if ((rc = interrupted(c))) return rc;
    double now = mz_now(), left = end - now;
    if (left <= 0 || (isinf(end) && !any_running(c))) return 0;
    left = next_stall(c, now, left < 3600 ? left : 3600);
    ms = (int)ceil(left * 1000.0);
  }
}

size_t mz_client_ready(mz_client *c, mz_stream **out, size_t n) {
  size_t k = 0;
  while (k < n && c->rhead) {
    mz_stream *s = c->rhead;
    unmark_ready(s);
    if (ready(s)) out[k++] = s; /* skip streams drained since they were listed */
  }
  return k;
}

/* Drop what the previous pop handed out, and reset the arena when the
 * queue has drained: the caller has copied it by now (see client.h). */
static void release_popped(mz_stream *s) {
  cJSON_Delete(s->popped_json);
  s->popped_json = NULL;
  if (s->qhead == s->qlen && s->qlen) {
    s->qhead = s->qlen = 0;
    s->arena.len = 0;
  }
}

/* Join the deltas queued right behind `it` (same channel and choice, their
 * text next in the arena: q_push and push_text lay them out back to back)
 * into e: no copy, e->len only grows. */
static void merge_run(mz_stream *s, mz_event *e, const item *it) {
  size_t end = it->off + it->len;
  while (s->qhead < s->qlen) {
    const item *nx = &s->q[s->qhead];
    if (nx->type != it->type || nx->index != it->index || nx->json || nx->off != end) break;
    end += nx->len;
    e->len += nx->len;
    e->deltas++;
    s->qhead++;
  }
}

static const mz_event *pop(mz_stream *s) {
  mz_event *e = &s->cur;
  memset(e, 0, sizeof *e);
  e->retry_after = -1;
  if (s->qhead < s->qlen) {
    item *it = &s->q[s->qhead++];
    e->type = it->type;
    e->index = it->index;
    e->text = s->arena.p ? s->arena.p + it->off : "";
    e->len = it->len;
    e->json = s->popped_json = it->json;
    e->deltas = 1;
    if (s->merge && (e->type == MZ_EV_TEXT || e->type == MZ_EV_THINK)) merge_run(s, e, it);
    return e;
  }
  s->term_popped = 1;
  e->retry_after = s->term == MZ_EV_ERROR ? s->retry_after : -1;
  e->headers = s->headers.p;
  e->headers_len = s->headers.len;
  e->type = s->term;
  e->code = s->term_code;
  e->status = s->status;
  e->json = s->term_json;
  if (s->term == MZ_EV_RESPONSE) {
    e->text = e->body = s->body.p ? s->body.p : "";
    e->len = e->body_len = s->body.len;
  } else {
    e->text = s->term_msg;
    e->len = strlen(s->term_msg);
    e->body = s->body.p;
    e->body_len = s->body.len;
  }
  return e;
}

int mz_stream_next(mz_stream *s, long timeout_ms, const mz_event **ev) {
  release_popped(s);
  if (s->term_popped) return MZ_NEXT_END;
  if (!ready(s)) {
    int rc = wait_loop(s->c, s, deadline_from(timeout_ms));
    if (rc == MZ_NEXT_INTERRUPTED) return rc;
    if (!ready(s)) return rc == MZ_NEXT_SIGNAL ? rc : MZ_NEXT_TIMEOUT;
  }
  *ev = pop(s);
  return MZ_NEXT_EVENT;
}

size_t mz_stream_pending(const mz_stream *s) { return s->qlen - s->qhead + (s->term && !s->term_popped); }

int mz_stream_finished(const mz_stream *s) { return s->term != 0; }

/* ------------------------------------------------------ open / close */

static int has_header(const char *const *h, const char *name) {
  size_t n = strlen(name);
  for (; h && *h; h++)
    if (strncasecmp(*h, name, n) == 0 && (*h)[n] == ':') return 1;
  return 0;
}

static int add_header(mz_stream *s, const char *h) {
  struct curl_slist *l = curl_slist_append(s->hdrs, h);
  if (!l) return -1;
  s->hdrs = l;
  return 0;
}

static int build_headers(mz_stream *s, const mz_request *r) {
  int rc = 0;
  if (r->body && !has_header(r->headers, "Content-Type")) rc |= add_header(s, "Content-Type: application/json");
  if (!has_header(r->headers, "Accept"))
    rc |= add_header(s, r->plain ? "Accept: application/json" : "Accept: text/event-stream");
  rc |= add_header(s, "Expect:"); /* no 100-continue round trip */
  for (const char *const *h = r->headers; h && *h; h++) rc |= add_header(s, *h);
  if (r->api_key && *r->api_key) {
    char auth[1024];
    if (snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->api_key) >= (int)sizeof auth) return -1;
    rc |= add_header(s, auth);
    memset(auth, 0, sizeof auth);
  }
  return rc;
}

static int setup_easy(mz_stream *s, const mz_request *r) {
  CURL *e = s->easy;
  int rc = 0;
  rc |= curl_easy_setopt(e, CURLOPT_URL, r->url);
  rc |= curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)s);
  rc |= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  rc |= curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
  rc |= curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  rc |= curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
  rc |= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
  rc |= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  rc |= curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  rc |= curl_easy_setopt(e, CURLOPT_USERAGENT, "mirza/" MIRZA_VERSION);
  rc |= curl_easy_setopt(e, CURLOPT_HTTPHEADER, s->hdrs);
  /* libcurl decodes any Content-Encoding it supports (gzip, deflate, ...),
   * also when the script sent its own Accept-Encoding header */
  rc |= curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
  long cto = r->connect_timeout_ms > 0 ? r->connect_timeout_ms : r->connect_timeout_ms < 0 ? 0L : 10000L;
  rc |= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, cto); /* 0: libcurl's own, 300 s */
  if (r->deadline_ms > 0) rc |= curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, r->deadline_ms);
  if (r->body) {
    rc |= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    rc |= curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, r->body);
  } else if (r->method && strcmp(r->method, "POST") == 0) {
    rc |= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, 0L);
    rc |= curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, "");
  }
  if (r->method && strcmp(r->method, "GET") != 0 && strcmp(r->method, "POST") != 0)
    rc |= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
  return rc;
}

mz_stream *mz_stream_open(mz_client *c, const mz_request *r, char *err, size_t errlen) {
  if (!r->url || !*r->url) {
    snprintf(err, errlen, "missing url");
    return NULL;
  }
  mz_stream *s = calloc(1, sizeof *s);
  if (!s || !(s->url = mz_redact_url(r->url)) || !(s->easy = curl_easy_init())) goto oom; /* for messages */
  s->c = c;
  s->plain = r->plain;
  s->skip_bad = r->skip_bad_frames;
  s->merge = r->merge;
  s->stall_s = (double)r->stall_timeout_ms / 1000.0;
  s->header_s = (double)r->header_timeout_ms / 1000.0;
  s->last_rx = s->t_open = mz_now();
  s->sock = CURL_SOCKET_BAD;
  s->connect_ms = r->connect_timeout_ms > 0 ? r->connect_timeout_ms : r->connect_timeout_ms < 0 ? 0 : 10000;
  s->deadline_ms = r->deadline_ms > 0 ? r->deadline_ms : 0;
  s->retry_after = -1;
  if (s->header_s > 0) note_deadline(c, s->t_open + s->header_s);
  mz_sse_init(&s->sse, r->max_event_bytes, on_sse_event, s);
  if (build_headers(s, r)) goto oom;
  if (setup_easy(s, r)) {
    snprintf(err, errlen, "invalid request options");
    goto fail;
  }
  if (r->record_path && !(s->rec = fopen(r->record_path, "wb"))) {
    snprintf(err, errlen, "cannot record into %s: %s", r->record_path, strerror(errno));
    goto fail;
  }
  if (curl_multi_add_handle(c->multi, s->easy) != CURLM_OK) goto oom;
  s->next = c->streams;
  if (c->streams) c->streams->prev = s;
  c->streams = s;
  c->nstreams++;
  return s;
oom:
  snprintf(err, errlen, "out of memory");
fail:
  if (s) {
    if (s->rec) fclose(s->rec);
    if (s->easy) curl_easy_cleanup(s->easy);
    curl_slist_free_all(s->hdrs);
    mz_sse_free(&s->sse);
    free(s->url);
    free(s);
  }
  return NULL;
}

void mz_stream_close(mz_stream *s) {
  if (!s) return;
  mz_client *c = s->c;
  detach_easy(s);
  unmark_ready(s);
  if (s->prev) s->prev->next = s->next;
  else c->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  c->nstreams--;
  for (size_t i = s->qhead; i < s->qlen; i++) cJSON_Delete(s->q[i].json);
  cJSON_Delete(s->popped_json);
  cJSON_Delete(s->term_json);
  cJSON_Delete(s->usage);
  cJSON_Delete(s->timings);
  cJSON_Delete(s->stats);
  cJSON_Delete(s->extra);
  curl_slist_free_all(s->hdrs);
  mz_sse_free(&s->sse);
  buf_free(&s->arena);
  buf_free(&s->body);
  buf_free(&s->headers);
  if (s->rec) fclose(s->rec);
  free(s->q);
  free(s->url);
  free(s);
}

/* curl_global_init/cleanup are reference-counted by libcurl: one pair per
 * client keeps several Lua states (or tests) independent. */
mz_client *mz_client_new(volatile sig_atomic_t *interrupt) {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return NULL;
  mz_client *c = calloc(1, sizeof *c);
  if (c) c->wake[0] = c->wake[1] = -1;
#if defined(__linux__) && !defined(MZ_USE_POLL)
  if (c) c->epfd = -1;
#endif
  if (!c || !(c->multi = curl_multi_init()) || pipe(c->wake)) goto fail;
  for (int i = 0; i < 2; i++) {
    fcntl(c->wake[i], F_SETFL, fcntl(c->wake[i], F_GETFL) | O_NONBLOCK);
    fcntl(c->wake[i], F_SETFD, FD_CLOEXEC);
  }
  if (watch_init(c)) goto fail;
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
    watch_free(c);
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
  watch_free(c);
  free(c->fd_rx);
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
