/*
 * fuzz_sse.c - the incremental SSE parser (src/sse.h).
 *
 * Input: one config byte, then the stream. The same bytes are parsed three
 * ways: in one feed; in pieces whose sizes come from a PRNG seeded by the
 * input (byte by byte when the config says so, to split every CRLF and
 * BOM); and in one feed with the callback stopping every few events and
 * the caller resuming with empty feeds. All three must dispatch exactly
 * the same events, end in the same status and report the same pending
 * state at finish. Each event must hold its documented shape: data and id
 * NUL-terminated at their lengths, no CR in data, no CR/LF/NUL in the id,
 * the type at most 63 bytes, data no longer than the limit.
 */
#include <string.h>

#include "fuzz.h"
#include "sse.h"

/* Events dispatched, serialised as (len, bytes) triples. */
typedef struct {
  unsigned char *buf;
  size_t len, cap;
  size_t max;
  unsigned stop_every, count;
} log_t;

static void put(log_t *l, const void *p, size_t n) {
  if (l->len + n + sizeof n > l->cap) {
    size_t cap = (l->cap ? l->cap * 2 : 4096) + n + sizeof n;
    unsigned char *nb = realloc(l->buf, cap);
    FUZZ_CHECK(nb != NULL, "out of memory");
    l->buf = nb;
    l->cap = cap;
  }
  memcpy(l->buf + l->len, &n, sizeof n);
  memcpy(l->buf + l->len + sizeof n, p, n);
  l->len += sizeof n + n;
}

static int on_event(void *ud, const mz_sse_event *ev) {
  log_t *l = ud;
  FUZZ_CHECK(ev->data[ev->data_len] == '\0', "data not NUL-terminated");
  FUZZ_CHECK(ev->id[ev->id_len] == '\0', "id not NUL-terminated");
  FUZZ_CHECK(ev->type[ev->type_len] == '\0', "type not NUL-terminated");
  FUZZ_CHECK(ev->type_len > 0 && ev->type_len < 64, "type length %zu", ev->type_len);
  FUZZ_CHECK(ev->data_len <= l->max, "data %zu over the limit %zu", ev->data_len, l->max);
  FUZZ_CHECK(!memchr(ev->data, '\r', ev->data_len), "CR inside data");
  FUZZ_CHECK(!memchr(ev->id, '\0', ev->id_len) && !memchr(ev->id, '\n', ev->id_len) &&
                 !memchr(ev->id, '\r', ev->id_len),
             "line break or NUL inside the id");
  put(l, ev->type, ev->type_len);
  put(l, ev->data, ev->data_len);
  put(l, ev->id, ev->id_len);
  l->count++;
  return l->stop_every && l->count % l->stop_every == 0;
}

typedef struct {
  int status, pending;
  long retry;
} outcome;

/* Feed until the parser accepts or fails; a stop is resumed at once. */
static int feed(mz_sse *p, const char *s, size_t n) {
  int rc = mz_sse_feed(p, s, n);
  for (int guard = 0; rc == MZ_SSE_STOPPED; guard++) {
    FUZZ_CHECK(guard <= (int)n + 2, "parser keeps stopping without progress");
    rc = mz_sse_feed(p, s, 0);
  }
  return rc;
}

/* mode 0: one feed; 1: random pieces; 2: byte by byte. */
static outcome run(const char *s, size_t n, size_t max, int mode, unsigned stop_every, uint32_t seed, log_t *l) {
  mz_sse p;
  outcome o = {0, 0, -1};
  size_t off = 0, k;
  memset(l, 0, sizeof *l);
  l->max = max ? max : MZ_SSE_DEFAULT_MAX;
  l->stop_every = stop_every;
  mz_sse_init(&p, max, on_event, l);
  while (off < n && o.status == 0) {
    k = mode == 0 ? n - off : mode == 2 ? 1 : 1 + fuzz_next(&seed) % 17;
    if (k > n - off) k = n - off;
    o.status = feed(&p, s + off, k);
    off += k;
  }
  o.retry = p.retry_ms;
  if (o.status == 0) o.pending = mz_sse_finish(&p);
  mz_sse_free(&p);
  return o;
}

static void same(const log_t *a, const log_t *b, outcome oa, outcome ob, const char *what) {
  FUZZ_CHECK(oa.status == ob.status, "%s: status %d vs %d", what, oa.status, ob.status);
  FUZZ_CHECK(a->count == b->count, "%s: %u vs %u events", what, a->count, b->count);
  FUZZ_CHECK(a->len == b->len && (!a->len || memcmp(a->buf, b->buf, a->len) == 0), "%s: events differ", what);
  FUZZ_CHECK(oa.pending == ob.pending, "%s: pending at finish %d vs %d", what, oa.pending, ob.pending);
  FUZZ_CHECK(oa.status != 0 || oa.retry == ob.retry, "%s: retry %ld vs %ld", what, oa.retry, ob.retry);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  log_t whole, pieces, stopped;
  outcome ow, op, os;
  size_t max;
  if (size < 1) return 0;
  /* small limits make the TOOBIG path reachable; 0 is the default 4 MiB */
  max = (data[0] & 3) == 0 ? 0 : (size_t)(data[0] & 3) * 24;
  const char *s = (const char *)data + 1;
  size_t n = size - 1;
  ow = run(s, n, max, 0, 0, 0, &whole);
  op = run(s, n, max, (data[0] & 4) ? 2 : 1, 0, (uint32_t)size * 2654435761u ^ data[0], &pieces);
  os = run(s, n, max, 0, 1 + (data[0] >> 4) % 3, 0, &stopped);
  same(&whole, &pieces, ow, op, "pieces");
  same(&whole, &stopped, ow, os, "callback stops");
  free(whole.buf);
  free(pieces.buf);
  free(stopped.buf);
  return 0;
}
