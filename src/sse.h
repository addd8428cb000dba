/*
 * sse.h - incremental Server-Sent Events parser (WHATWG "event stream
 * interpretation"). Pure C: no Lua, no I/O, no allocation per event once the
 * buffers have grown to the size of the largest event seen.
 *
 * Bytes are fed in arbitrary pieces (split at any byte, even inside a CRLF
 * pair or the BOM); each complete event is handed to a callback. Rules:
 *  - lines end with CR, LF or CRLF; a leading UTF-8 BOM is skipped once;
 *  - "field:value", "field: value" (one leading space removed), "field"
 *    alone (empty value); lines starting with ':' are comments;
 *  - "data" lines are joined with '\n'; "event" sets the type; "id" sets the
 *    last event id (ignored if it contains NUL); "retry" with only ASCII
 *    digits sets retry_ms; unknown fields are ignored;
 *  - a blank line dispatches the event if any data line was seen (even an
 *    empty one), then resets data and type (the id persists);
 *  - an event whose data would grow past max_event_bytes (or a single line
 *    longer than that) is a protocol error: MZ_SSE_TOOBIG, nothing more is
 *    parsed (the parser stays in the error state until reset).
 */
#ifndef MIRZA_SSE_H
#define MIRZA_SSE_H

#include <stddef.h>

#define MZ_SSE_DEFAULT_MAX (4u << 20) /* 4 MiB per event */

enum {
  MZ_SSE_OK = 0,
  MZ_SSE_STOPPED = 1, /* the callback returned nonzero */
  MZ_SSE_TOOBIG = -1, /* event or line over max_event_bytes */
  MZ_SSE_NOMEM = -2
};

typedef struct mz_sse_event {
  const char *type; /* "message" when no event: field; NUL-terminated */
  size_t type_len;
  const char *data; /* lines joined with '\n', no trailing '\n'; NUL-terminated */
  size_t data_len;
  const char *id; /* last event id, "" if none; NUL-terminated */
  size_t id_len;
} mz_sse_event;

/* Called once per dispatched event; the pointers are valid only during the
 * call. Return nonzero to stop: mz_sse_feed then returns MZ_SSE_STOPPED and
 * the rest of that buffer is not parsed yet: the parser keeps it, and the
 * next mz_sse_feed (len may be 0) parses it first, resuming right after the
 * event that stopped. Nothing is lost; mz_sse_reset drops it. */
typedef int (*mz_sse_on_event)(void *ud, const mz_sse_event *ev);

/* The struct is public so it can be embedded in a stream without its own
 * allocation; treat the fields as private except retry_ms and status. */
typedef struct mz_sse {
  mz_sse_on_event on_event;
  void *ud;
  size_t max; /* cap on one event's data and on one line */
  char *line; /* current partial line (when split across feeds) */
  size_t line_len, line_cap;
  char *data; /* data buffer of the event being built */
  size_t data_len, data_cap;
  int has_data;  /* a data field was seen for this event */
  char type[64]; /* event type (longer names are truncated) */
  size_t type_len;
  char *id; /* last event id */
  size_t id_len, id_cap;
  long retry_ms; /* last valid retry: field, -1 if none */
  int last_cr;   /* previous byte was CR: skip one LF */
  int bom_pos;   /* bytes of the BOM matched so far; -1 when done */
  char *pend;    /* bytes left unparsed by a callback stop */
  size_t pend_off, pend_len, pend_cap;
  int status;           /* sticky: MZ_SSE_OK or an error */
  unsigned long events; /* events dispatched so far */
} mz_sse;

/* max_event_bytes 0 means MZ_SSE_DEFAULT_MAX. Never fails (allocates lazily). */
void mz_sse_init(mz_sse *p, size_t max_event_bytes, mz_sse_on_event cb, void *ud);
/* Frees the buffers; the struct can be re-initialised afterwards. */
void mz_sse_free(mz_sse *p);
/* Start a new stream: forget any partial line/event, pending bytes, the
 * error state, last id, retry and BOM state (as after init); keep buffers. */
void mz_sse_reset(mz_sse *p);
/* Feed len bytes. Returns MZ_SSE_OK, MZ_SSE_STOPPED or a (sticky) error. */
int mz_sse_feed(mz_sse *p, const char *buf, size_t len);
/* End of input. Per the spec an unterminated event is discarded (not
 * dispatched). Returns 1 if such partial data was pending (so a caller can
 * tell a cut stream from a clean end), 0 otherwise. */
int mz_sse_finish(mz_sse *p);
/* A short static description of a status code. */
const char *mz_sse_strerror(int status);

#endif
