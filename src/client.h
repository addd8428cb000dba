/*
 * client.h - the libcurl *multi* driver: HTTP requests to an LLM daemon,
 * streamed responses parsed (sse.c) and decoded (decode.c) into a queue of
 * events per stream. Pure C: no Lua.
 *
 * Pull model: nothing happens between calls. mz_client_wait() drives every
 * open transfer at once (one curl multi handle, connections reused across
 * requests); mz_stream_next() pops one event of one stream, driving the
 * others while it waits. No callback ever leaves C: bytes are buffered,
 * parsed and queued inside curl's write callback, and handed out later.
 *
 * Every stream ends with exactly one terminal event, DONE or ERROR, after
 * everything received before it (a failure never drops text: a partial
 * UTF-8 character held back for joining is flushed, as U+FFFD, before it).
 * Text is always valid UTF-8: ill-formed input is repaired as browsers'
 * TextDecoder does and counted in done.invalid_utf8.
 */
#ifndef MIRZA_CLIENT_H
#define MIRZA_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <cJSON.h>

typedef struct mz_client mz_client;
typedef struct mz_stream mz_stream;

typedef enum mz_evtype {
  MZ_EV_THINK = 1, /* reasoning delta: text */
  MZ_EV_TEXT,      /* answer delta: text */
  MZ_EV_TOOL_CALL, /* json = delta.tool_calls array */
  MZ_EV_PROGRESS,  /* json = mtplx_progress */
  MZ_EV_HEARTBEAT, /* json = mtplx_progress with heartbeat: true */
  MZ_EV_DONE,      /* terminal; json = {finish_reason, usage, stats, timings, extra} */
  MZ_EV_ERROR,     /* terminal; text = message, code, status; json = server error */
  MZ_EV_RESPONSE   /* terminal, plain requests: text = body, status */
} mz_evtype;

/* Valid until the next call into the client for this client (next/wait/
 * close): copy what you need at once. */
typedef struct mz_event {
  mz_evtype type;
  int index;        /* choice index */
  const char *text; /* think/text delta, error message, response body */
  size_t len;
  cJSON *json;      /* see mz_evtype; may be NULL; owned by the stream */
  const char *code; /* error token (mirza.h MZ_E_*) for MZ_EV_ERROR */
  long status;      /* HTTP status (0 if no response) */
  const char *body; /* error/response: raw body (may be NULL) */
  size_t body_len;
  const char *headers; /* error/response: the response headers as "name:
                          value\n" lines, names in lowercase (may be NULL) */
  size_t headers_len;
  double retry_after; /* error: Retry-After in seconds from now, or -1 */
  size_t deltas;      /* think/text: deltas joined in this event (1 unless
                         the request merges, see mz_request.merge) */
} mz_event;

typedef struct mz_request {
  const char *url;
  const char *method; /* NULL: POST if body, else GET */
  const char *body;   /* copied */
  size_t body_len;
  const char *const *headers; /* "Name: value", NULL-terminated, or NULL */
  const char *api_key;        /* -> Authorization: Bearer (never logged) */
  int plain;                  /* 1: not a stream: one MZ_EV_RESPONSE at the end */
  long connect_timeout_ms;    /* TCP connect; 0: 10 s */
  long stall_timeout_ms;      /* no byte (head or body) for this long once the
                                  first one came -> "timeout"; 0: none */
  long deadline_ms;           /* whole request; 0: none */
  size_t max_event_bytes;     /* SSE event cap; 0: MZ_SSE_DEFAULT_MAX */
  long header_timeout_ms;     /* from the start until the whole response
                                  head came (a queued request waits that
                                  long) -> "timeout"; 0: none */
  int skip_bad_frames;        /* 1: a malformed frame is skipped (counted in
                                  done.skipped_frames); 0: "protocol" error */
  const char *record_path;    /* record the response into this file (created
                                  or truncated): the head as received, then
                                  the body as delivered (de-chunked,
                                  decoded); NULL: off (one NULL check per
                                  callback) */
  int merge;                  /* 1: a think/text delta comes joined with the
                                  deltas of the same channel and choice
                                  queued right behind it (what arrived
                                  together: one event, ev->deltas > 1); it
                                  never waits for more */
  long hold_ms;               /* >0: events are handed over (the stream is
                                  ready) at most this long after the first
                                  one still queued came, all at once, not
                                  as each read queues one: fewer wake-ups
                                  for a reader that wants the whole answer
                                  (with merge: one event per channel run).
                                  The end, an error, a timeout come at
                                  once (as read: see client.c's rule of
                                  when a stream is read). 0: as they come */
  int step;                   /* 1: read as its bytes come until the
                                  first delta read after the first one's
                                  read, and that delta handed over at once
                                  (no hold): mz_stream_step() is then the
                                  time between the two, the server's decode
                                  step at its load (mirza.limit's rounds) */
} mz_request;

/* MZ_NEXT_SIGNAL: a signal handler ran during the wait (EINTR) and the
 * interrupt flag is not set (stock lua5.4's SIGINT handler, which only
 * sets a hook): the caller runs its own handling, then may wait again. */
enum { MZ_NEXT_EVENT = 1, MZ_NEXT_TIMEOUT = 0, MZ_NEXT_END = -1, MZ_NEXT_INTERRUPTED = -2, MZ_NEXT_SIGNAL = -3 };

/* One client per Lua state (or test). NULL on failure. `interrupt`, when
 * set non-zero (from a signal handler) makes waits return early. */
mz_client *mz_client_new(volatile sig_atomic_t *interrupt);
/* Closes every stream still open (cancelling transfers) and frees. */
void mz_client_free(mz_client *c);
/* Wake a wait in progress; async-signal-safe (one write to a non-blocking
 * pipe). */
void mz_client_wakeup(mz_client *c);

/* Start a request. Returns the stream, or NULL with a message in err
 * (invalid arguments or out of memory; network failures come later as an
 * MZ_EV_ERROR event). The transfer starts on the next wait/next. */
mz_stream *mz_stream_open(mz_client *c, const mz_request *r, char *err, size_t errlen);
/* Pop the next event, waiting up to timeout_ms (<0: forever, 0: poll).
 * Returns MZ_NEXT_EVENT (*ev set), MZ_NEXT_TIMEOUT, MZ_NEXT_END (the
 * terminal event was already popped), MZ_NEXT_INTERRUPTED or
 * MZ_NEXT_SIGNAL (as do the waits below). */
int mz_stream_next(mz_stream *s, long timeout_ms, const mz_event **ev);
/* Events queued and not yet popped. */
size_t mz_stream_pending(const mz_stream *s);
/* 1 once the terminal event is queued (the transfer is over). */
int mz_stream_finished(const mz_stream *s);
/* When the first think or text delta was queued (mz_now() seconds), as
 * read, whatever hold_ms delays its handing over; 0 before any. */
double mz_stream_first_at(const mz_stream *s);
/* mz_request.step: the time from the first think, text or tool call delta
 * to the first one read after it (seconds, both as read); 0 before, or
 * without step. */
double mz_stream_step(const mz_stream *s);
/* Cancel (closes the connection if the transfer is still running: the
 * daemon stops generating) and free. NULL is fine. */
void mz_stream_close(mz_stream *s);

/* Drive all transfers: returns the number of streams with something to
 * pop (>0 at once when events are already queued), 0 on timeout, or
 * MZ_NEXT_INTERRUPTED. timeout_ms <0: until something is ready. */
int mz_client_wait(mz_client *c, long timeout_ms);
/* Keep every transfer flowing for timeout_ms whatever is ready (events
 * pile up in their queues). Returns 0, or MZ_NEXT_INTERRUPTED. */
int mz_client_sleep(mz_client *c, long timeout_ms);
/* The ready list, for schedulers: which streams changed, not how many.
 * A stream is listed when an event or its terminal event is queued, at most
 * once, until taken off by mz_client_ready(); closing unlinks it.
 * mz_client_wait_ready() drives every transfer until the list is non-empty
 * (returns 1), the timeout (0; with timeout_ms < 0 also when nothing is
 * running any more: it never hangs on an idle client) or an interrupt
 * (MZ_NEXT_INTERRUPTED). Unlike mz_client_wait() it does not return at once
 * for events that were already queued and reported: it waits for news.
 * mz_client_ready() takes up to n streams off the list, oldest first,
 * skipping any drained since they were listed, and never blocks. */
int mz_client_wait_ready(mz_client *c, long timeout_ms);
size_t mz_client_ready(mz_client *c, mz_stream **out, size_t n);
/* Number of open streams. */
size_t mz_client_streams(const mz_client *c);

/* The URL as it may be shown: userinfo (`user:pass@`) becomes
 * `[redacted]@`, and the value of each query parameter whose name looks
 * like a credential (contains auth, cookie, key, token, secret, password
 * or passwd, any case: mz_is_secret) becomes
 * `[redacted]`. malloc'd (free it); NULL when out of memory. */
char *mz_redact_url(const char *url);
/* 1 when a name (header or query parameter) looks like a credential: the
 * one list of credential words, also Lua's (mirza.core.is_secret). */
int mz_is_secret(const char *name, size_t len);
/* 1 when url goes in clear (http://, or no scheme) to a host that is not
 * loopback (127.0.0.0/8, ::1, localhost, *.localhost): a credential sent
 * there can be read on the way. Decided from the text alone (no DNS). */
int mz_url_plain_remote(const char *url);

/* Monotonic clock in seconds. */
double mz_now(void);

#endif
