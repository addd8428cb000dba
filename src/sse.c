/*
 * sse.c - incremental Server-Sent Events parser (see sse.h for the rules).
 *
 * This is the hot path of every streamed token, so the common case does no
 * per-byte work in C: line ends are found with memchr over the caller's
 * buffer and complete lines are parsed in place. Only a line split across
 * two feeds is copied into p->line; only data values are copied (into
 * p->data, which must be NUL-terminated for the callback). Buffers grow by
 * doubling and never past the cap, so a steady stream allocates nothing.
 *
 * Memory bounds: line_cap <= max, data_cap <= max + 1 (the NUL). A line or
 * event that would need more is MZ_SSE_TOOBIG, sticky until reset.
 */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

static const unsigned char BOM[3] = {0xEF, 0xBB, 0xBF};

void mz_sse_init(mz_sse *p, size_t max_event_bytes, mz_sse_on_event cb, void *ud) {
  memset(p, 0, sizeof *p);
  p->max = max_event_bytes ? max_event_bytes : MZ_SSE_DEFAULT_MAX;
  p->on_event = cb;
  p->ud = ud;
  p->retry_ms = -1;
}

void mz_sse_free(mz_sse *p) {
  free(p->line);
  free(p->data);
  free(p->id);
  free(p->pend);
  p->line = p->data = p->id = p->pend = NULL;
  p->line_len = p->line_cap = p->data_len = p->data_cap = 0;
  p->id_len = p->id_cap = p->pend_off = p->pend_len = p->pend_cap = 0;
}

void mz_sse_reset(mz_sse *p) {
  p->line_len = p->data_len = p->id_len = 0;
  p->pend_off = p->pend_len = 0;
  p->has_data = 0;
  p->type_len = 0;
  p->retry_ms = -1;
  p->last_cr = 0;
  p->bom_pos = 0;
  p->status = MZ_SSE_OK;
  p->events = 0;
}

/* Make *buf hold at least need bytes, doubling from 256 but never past
 * limit (the caller has already checked need <= limit). 0 or MZ_SSE_NOMEM. */
static int grow(char **buf, size_t *cap, size_t need, size_t limit) {
  size_t n = *cap ? *cap : 256;
  char *nb;
  if (need <= *cap) return 0;
  while (n < need) n = n > limit / 2 ? limit : n * 2;
  if (n > limit) n = limit;
  if (n < need) n = need;
  nb = realloc(*buf, n);
  if (!nb) return MZ_SSE_NOMEM;
  *buf = nb;
  *cap = n;
  return 0;
}

static int fail(mz_sse *p, int status) {
  p->status = status;
  return status;
}

/* Append the part of a line that ends a feed. The whole line, once
 * complete, must fit in max bytes. */
static int save_partial(mz_sse *p, const char *s, size_t n) {
  if (n > p->max - p->line_len) return fail(p, MZ_SSE_TOOBIG);
  if (grow(&p->line, &p->line_cap, p->line_len + n, p->max)) return fail(p, MZ_SSE_NOMEM);
  memcpy(p->line + p->line_len, s, n);
  p->line_len += n;
  return 0;
}

/* Blank line: hand the event out if a data field was seen, then start a
 * new one. The callback's pointers stay valid because the buffers are
 * only rewound, not touched, until the next field. */
static int dispatch(mz_sse *p) {
  mz_sse_event ev;
  int has = p->has_data;
  p->has_data = 0;
  ev.type = p->type_len ? p->type : "message";
  ev.type_len = p->type_len ? p->type_len : 7;
  p->type[p->type_len] = '\0';
  p->type_len = 0;
  if (!has) return 0;
  ev.data = p->data ? p->data : "";
  ev.data_len = p->data_len;
  if (p->data) p->data[p->data_len] = '\0';
  p->data_len = 0;
  ev.id = p->id_len ? p->id : "";
  ev.id_len = p->id_len;
  p->events++;
  return p->on_event && p->on_event(p->ud, &ev) ? MZ_SSE_STOPPED : 0;
}

/* data: append v, after a '\n' if this event already has data. */
static int add_data(mz_sse *p, const char *v, size_t n) {
  size_t sep = p->has_data ? 1 : 0;
  if (p->data_len + sep > p->max || n > p->max - p->data_len - sep) return fail(p, MZ_SSE_TOOBIG);
  if (grow(&p->data, &p->data_cap, p->data_len + sep + n + 1, p->max + 1)) return fail(p, MZ_SSE_NOMEM);
  if (sep) p->data[p->data_len++] = '\n';
  memcpy(p->data + p->data_len, v, n);
  p->data_len += n;
  p->has_data = 1;
  return 0;
}

static int set_id(mz_sse *p, const char *v, size_t n) {
  if (memchr(v, '\0', n)) return 0; /* the spec ignores such ids */
  if (grow(&p->id, &p->id_cap, n + 1, p->max + 1)) return fail(p, MZ_SSE_NOMEM);
  memcpy(p->id, v, n);
  p->id[n] = '\0';
  p->id_len = n;
  return 0;
}

/* retry: only ASCII digits count; absurd values saturate instead of
 * overflowing. */
static void set_retry(mz_sse *p, const char *v, size_t n) {
  long ms = 0;
  size_t i;
  if (n == 0) return;
  for (i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return;
    ms = ms > 99999999L ? 999999999L : ms * 10 + (v[i] - '0');
  }
  p->retry_ms = ms;
}

/* One complete line, without its terminator. "data:" is tested first:
 * it is nearly every line of an LLM stream. */
static int do_line(mz_sse *p, const char *s, size_t n) {
  const char *colon, *v;
  size_t fn, vn;
  if (n == 0) return dispatch(p);
  if (n > p->max) return fail(p, MZ_SSE_TOOBIG);
  if (n >= 5 && memcmp(s, "data:", 5) == 0) {
    v = s + 5 + (n > 5 && s[5] == ' ');
    return add_data(p, v, (size_t)(s + n - v));
  }
  if (s[0] == ':') return 0; /* comment */
  colon = memchr(s, ':', n);
  fn = colon ? (size_t)(colon - s) : n;
  v = colon ? colon + 1 : s + n;
  if (colon && v < s + n && *v == ' ') v++;
  vn = (size_t)(s + n - v);
  if (fn == 4 && memcmp(s, "data", 4) == 0) return add_data(p, v, vn);
  if (fn == 5 && memcmp(s, "event", 5) == 0) {
    p->type_len = vn < sizeof p->type - 1 ? vn : sizeof p->type - 1;
    memcpy(p->type, v, p->type_len);
  } else if (fn == 2 && memcmp(s, "id", 2) == 0) {
    return set_id(p, v, vn);
  } else if (fn == 5 && memcmp(s, "retry", 5) == 0) {
    set_retry(p, v, vn);
  }
  return 0;
}

/* Match the leading BOM byte by byte (it may be split across feeds).
 * Returns the number of bytes consumed; on a mismatch the bytes matched so
 * far were text, and they start the first line. */
static size_t skip_bom(mz_sse *p, const char *s, size_t n) {
  size_t i = 0;
  while (p->bom_pos >= 0 && i < n) {
    if ((unsigned char)s[i] == BOM[p->bom_pos]) {
      i++;
      if (++p->bom_pos == 3) p->bom_pos = -1;
    } else {
      int k = p->bom_pos;
      p->bom_pos = -1;
      if (k > 0 && save_partial(p, (const char *)BOM, (size_t)k)) return n;
    }
  }
  return i;
}

/* End the line at eol, joining it to a partial line from earlier feeds. */
static int end_line(mz_sse *p, const char *s, const char *eol) {
  int rc;
  if (p->line_len == 0) return do_line(p, s, (size_t)(eol - s));
  if (save_partial(p, s, (size_t)(eol - s))) return p->status;
  rc = do_line(p, p->line, p->line_len);
  p->line_len = 0;
  return rc;
}

static const char *find(const char *s, const char *end, int c) {
  const char *q = memchr(s, c, (size_t)(end - s));
  return q ? q : end;
}

/* Parse buf[0..len). Invariant: nlf/ncr are the next LF/CR at or after s
 * (or end when none is left), each found by one memchr and searched again
 * only once s has passed it, so an LF-only stream scans for CR once per
 * buffer. *used tells how far parsing got when the callback stopped. */
static int parse(mz_sse *p, const char *buf, size_t len, size_t *used) {
  const char *s = buf, *end = buf + len, *nlf = NULL, *ncr = NULL, *eol;
  if (p->bom_pos >= 0) s += skip_bom(p, s, len);
  if (p->status) return p->status;
  if (p->last_cr && s < end) {
    p->last_cr = 0;
    if (*s == '\n') s++;
  }
  while (s < end) {
    if (!nlf || nlf < s) nlf = find(s, end, '\n');
    if (!ncr || ncr < s) ncr = find(s, end, '\r');
    eol = nlf < ncr ? nlf : ncr;
    if (eol == end) return save_partial(p, s, (size_t)(end - s));
    int rc = end_line(p, s, eol);
    s = eol + 1;
    if (*eol == '\r') {
      if (s == end) p->last_cr = 1; /* an LF may open the next feed */
      else if (*s == '\n') s++;
    }
    if (rc) {
      *used = (size_t)(s - buf);
      return rc;
    }
  }
  return 0;
}

/* Keep buf[0..len) for the next feed, after what is already pending. */
static int stash(mz_sse *p, const char *buf, size_t len) {
  size_t keep = p->pend_len - p->pend_off;
  if (p->pend_off) memmove(p->pend, p->pend + p->pend_off, keep);
  p->pend_off = 0;
  p->pend_len = keep;
  if (len > (size_t)-1 - keep) return fail(p, MZ_SSE_NOMEM);
  if (grow(&p->pend, &p->pend_cap, keep + len, (size_t)-1)) return fail(p, MZ_SSE_NOMEM);
  if (len) memcpy(p->pend + keep, buf, len);
  p->pend_len = keep + len;
  return 0;
}

/* Bytes left by an earlier stop are parsed before the new ones. If the
 * callback stops again in them, the new bytes queue up behind. */
static int drain(mz_sse *p) {
  size_t used = 0;
  int rc = parse(p, p->pend + p->pend_off, p->pend_len - p->pend_off, &used);
  if (rc == MZ_SSE_STOPPED) p->pend_off += used;
  else p->pend_off = p->pend_len = 0;
  if (p->pend_off == p->pend_len) p->pend_off = p->pend_len = 0;
  return rc;
}

int mz_sse_feed(mz_sse *p, const char *buf, size_t len) {
  size_t used = 0;
  int rc;
  if (p->status) return p->status;
  if (p->pend_len) {
    rc = drain(p);
    if (rc == MZ_SSE_STOPPED && stash(p, buf, len)) return p->status;
    if (rc) return rc;
  }
  if (len == 0) return MZ_SSE_OK;
  rc = parse(p, buf, len, &used);
  if (rc == MZ_SSE_STOPPED && stash(p, buf + used, len - used)) return p->status;
  return rc;
}

int mz_sse_finish(mz_sse *p) {
  int pending = p->line_len > 0 || p->has_data || p->type_len > 0 || p->pend_len > p->pend_off || p->bom_pos > 0;
  p->line_len = p->data_len = p->type_len = 0;
  p->pend_off = p->pend_len = 0;
  p->has_data = 0;
  p->last_cr = 0;
  if (p->bom_pos > 0) p->bom_pos = -1; /* a cut BOM went with the cut line */
  return pending;
}

const char *mz_sse_strerror(int status) {
  switch (status) {
  case MZ_SSE_OK: return "ok";
  case MZ_SSE_STOPPED: return "stopped by the event callback";
  case MZ_SSE_TOOBIG: return "SSE event or line larger than the limit";
  case MZ_SSE_NOMEM: return "out of memory in the SSE parser";
  default: return "unknown SSE status";
  }
}
