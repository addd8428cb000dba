/*
 * test_sse.c - behaviour of the SSE parser (src/sse.h).
 *
 * Every recorded stream (every .sse file in tests/fixtures/traces and in
 * tests/fixtures) is fed whole, byte by byte and split in two at every
 * offset, also with its line ends rewritten to CRLF and to lone CR and with a BOM in front; each
 * way must give the same events (type, data, id) and the same finish result.
 * Streams made only of "data: " lines are also checked against the lines
 * themselves, so "the same" is also "right". The rest are the rules of the
 * spec one by one, the size cap and the stop/resume contract.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "sse.h"

#define FEED(p, lit) mz_sse_feed((p), (lit), sizeof(lit) - 1)

/* ---- recording events ---- */

typedef struct {
  char *type, *data, *id;
  size_t data_len;
} rec_ev;

typedef struct {
  rec_ev *v;
  size_t n, cap;
  int stop; /* the callback asks to stop after every event */
} rec;

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  assert_non_null(d);
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static int on_event(void *ud, const mz_sse_event *ev) {
  rec *r = ud;
  /* the contract: every string NUL-terminated at its length */
  assert_int_equal(ev->type[ev->type_len], '\0');
  assert_int_equal(ev->data[ev->data_len], '\0');
  assert_int_equal(ev->id[ev->id_len], '\0');
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 16;
    r->v = realloc(r->v, r->cap * sizeof *r->v);
    assert_non_null(r->v);
  }
  r->v[r->n].type = dup_n(ev->type, ev->type_len);
  r->v[r->n].data = dup_n(ev->data, ev->data_len);
  r->v[r->n].id = dup_n(ev->id, ev->id_len);
  r->v[r->n].data_len = ev->data_len;
  r->n++;
  return r->stop;
}

static void rec_free(rec *r) {
  size_t i;
  for (i = 0; i < r->n; i++) {
    free(r->v[i].type);
    free(r->v[i].data);
    free(r->v[i].id);
  }
  free(r->v);
  memset(r, 0, sizeof *r);
}

static void rec_equal(const rec *a, const rec *b, const char *what) {
  size_t i;
  if (a->n != b->n) fail_msg("%s: %zu events, expected %zu", what, b->n, a->n);
  for (i = 0; i < a->n; i++) {
    if (strcmp(a->v[i].type, b->v[i].type) || strcmp(a->v[i].id, b->v[i].id) || a->v[i].data_len != b->v[i].data_len ||
        memcmp(a->v[i].data, b->v[i].data, a->v[i].data_len))
      fail_msg("%s: event %zu differs: [%s|%s|%s] vs [%s|%s|%s]", what, i, a->v[i].type, a->v[i].id, a->v[i].data,
               b->v[i].type, b->v[i].id, b->v[i].data);
  }
}

/* Feed buf in pieces of `step` bytes (0 = whole), with an extra cut at
 * `cut` (0 = none); returns mz_sse_finish's result. */
static int run(const char *buf, size_t len, size_t step, size_t cut, rec *r) {
  mz_sse p;
  size_t off = 0;
  int pending;
  mz_sse_init(&p, 0, on_event, r);
  while (off < len) {
    size_t n = step ? step : len - off;
    if (cut > off && cut < off + n) n = cut - off;
    if (n > len - off) n = len - off;
    assert_int_equal(mz_sse_feed(&p, buf + off, n), MZ_SSE_OK);
    off += n;
  }
  assert_int_equal(p.events, r->n);
  pending = mz_sse_finish(&p);
  mz_sse_free(&p);
  return pending;
}

/* Whole, byte by byte, and every two-piece split agree with ref. */
static void check_all_splits(const char *buf, size_t len, const rec *ref, int ref_pending, const char *name) {
  rec r = {0};
  size_t cut;
  char what[512];
  snprintf(what, sizeof what, "%s byte by byte", name);
  assert_int_equal(run(buf, len, 1, 0, &r), ref_pending);
  rec_equal(ref, &r, what);
  rec_free(&r);
  for (cut = 1; cut < len; cut++) {
    snprintf(what, sizeof what, "%s split at %zu", name, cut);
    assert_int_equal(run(buf, len, 0, cut, &r), ref_pending);
    rec_equal(ref, &r, what);
    rec_free(&r);
  }
}

/* ---- fixtures ---- */

typedef struct {
  char path[64][1200];
  int n, ntraces;
} fixture_list;

static int list_dir(fixture_list *fl, const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int found = 0;
  if (!d) fail_msg("cannot open fixture dir %s", dir);
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l < 5 || strcmp(e->d_name + l - 4, ".sse") != 0 || fl->n == 64) continue;
    snprintf(fl->path[fl->n++], sizeof fl->path[0], "%s/%s", dir, e->d_name);
    found++;
  }
  closedir(d);
  return found;
}

static fixture_list *fixtures(void) {
  static fixture_list fl;
  if (fl.n) return &fl;
  fl.ntraces = list_dir(&fl, fixture_dir(1));
  list_dir(&fl, fixture_dir(0));
  assert_true(fl.ntraces >= 4);
  assert_true(fl.n - fl.ntraces >= 9);
  return &fl;
}

/* Rewrite every line end (CRLF, CR or LF) as eol. */
static char *with_eol(const char *s, size_t len, const char *eol, size_t *out_len) {
  char *o = malloc(len * 2 + 1);
  size_t i, n = 0, el = strlen(eol);
  assert_non_null(o);
  for (i = 0; i < len; i++) {
    if (s[i] == '\r' || s[i] == '\n') {
      if (s[i] == '\r' && i + 1 < len && s[i + 1] == '\n') i++;
      memcpy(o + n, eol, el);
      n += el;
    } else {
      o[n++] = s[i];
    }
  }
  *out_len = n;
  return o;
}

/* For streams of only "data: X" lines and blank lines (LF), the events are
 * the X's: an independent check that the parser is right, not only stable. */
static void check_plain_data(const char *s, size_t len, const rec *r, const char *name) {
  const char *p = s, *end = s + len;
  size_t k = 0;
  for (p = s; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl || memchr(p, '\r', (size_t)(end - p))) return; /* not plain */
    if (nl > p && (nl - p < 6 || memcmp(p, "data: ", 6) != 0)) return;
    p = nl + 1;
  }
  for (p = s; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl > p) {
      if (k >= r->n) fail_msg("%s: missing event %zu", name, k);
      if ((size_t)(nl - p - 6) != r->v[k].data_len || memcmp(p + 6, r->v[k].data, r->v[k].data_len))
        fail_msg("%s: event %zu is not its data line", name, k);
      assert_string_equal(r->v[k].type, "message");
      k++;
    }
    p = nl + 1;
  }
  assert_int_equal(k, r->n);
}

static void test_fixtures_every_split(void **state) {
  fixture_list *fl = fixtures();
  int i;
  (void)state;
  for (i = 0; i < fl->n; i++) {
    size_t len;
    char *buf = fixture_slurp(fl->path[i], &len);
    rec ref = {0};
    int pending = run(buf, len, 0, 0, &ref);
    assert_true(ref.n > 0);
    check_plain_data(buf, len, &ref, fl->path[i]);
    check_all_splits(buf, len, &ref, pending, fl->path[i]);
    rec_free(&ref);
    free(buf);
  }
}

/* Many pieces of random sizes (fixed seed, so failures reproduce). */
static void test_fixtures_random_pieces(void **state) {
  fixture_list *fl = fixtures();
  unsigned seed = 12345;
  int i, k;
  (void)state;
  for (i = 0; i < fl->n; i++) {
    size_t len;
    char *buf = fixture_slurp(fl->path[i], &len);
    rec ref = {0};
    int pending = run(buf, len, 0, 0, &ref);
    for (k = 0; k < 200; k++) {
      rec r = {0};
      mz_sse p;
      size_t off = 0;
      mz_sse_init(&p, 0, on_event, &r);
      while (off < len) {
        size_t n;
        seed = seed * 1103515245u + 12345u;
        n = 1 + (seed >> 16) % 97;
        if (n > len - off) n = len - off;
        assert_int_equal(mz_sse_feed(&p, buf + off, n), MZ_SSE_OK);
        off += n;
      }
      assert_int_equal(mz_sse_finish(&p), pending);
      rec_equal(&ref, &r, fl->path[i]);
      mz_sse_free(&p);
      rec_free(&r);
    }
    rec_free(&ref);
    free(buf);
  }
}

static void test_fixtures_crlf_and_cr(void **state) {
  static const char *eols[] = {"\r\n", "\r"};
  fixture_list *fl = fixtures();
  int i, e;
  (void)state;
  for (i = 0; i < fl->n; i++) {
    size_t len, lf_len, v_len;
    char *buf = fixture_slurp(fl->path[i], &len), *lf = with_eol(buf, len, "\n", &lf_len);
    rec ref = {0}, r = {0};
    int pending = run(lf, lf_len, 0, 0, &ref);
    for (e = 0; e < 2; e++) {
      char *v = with_eol(buf, len, eols[e], &v_len);
      char name[1300];
      snprintf(name, sizeof name, "%s with %s", fl->path[i], e ? "CR" : "CRLF");
      assert_int_equal(run(v, v_len, 0, 0, &r), pending);
      rec_equal(&ref, &r, name);
      rec_free(&r);
      check_all_splits(v, v_len, &ref, pending, name);
      free(v);
    }
    rec_free(&ref);
    free(lf);
    free(buf);
  }
}

static void test_fixtures_with_bom(void **state) {
  fixture_list *fl = fixtures();
  int i;
  (void)state;
  for (i = 0; i < fl->n; i++) {
    size_t len;
    char *buf = fixture_slurp(fl->path[i], &len), *b = malloc(len + 3);
    rec ref = {0}, r = {0};
    int pending = run(buf, len, 0, 0, &ref);
    memcpy(b, "\xEF\xBB\xBF", 3);
    memcpy(b + 3, buf, len);
    assert_int_equal(run(b, len + 3, 0, 0, &r), pending);
    rec_equal(&ref, &r, "with BOM");
    rec_free(&r);
    check_all_splits(b, len + 3, &ref, pending, fl->path[i]);
    rec_free(&ref);
    free(b);
    free(buf);
  }
}

/* ---- the rules one by one ---- */

/* Parse a literal whole and byte by byte (both must agree); r gets the events. */
static int parse_str(const char *s, rec *r) {
  rec b = {0};
  int pending = run(s, strlen(s), 0, 0, r);
  assert_int_equal(run(s, strlen(s), 1, 0, &b), pending);
  rec_equal(r, &b, s);
  rec_free(&b);
  return pending;
}

static void expect(const rec *r, size_t i, const char *type, const char *data, const char *id) {
  assert_true(i < r->n);
  assert_string_equal(r->v[i].type, type);
  assert_string_equal(r->v[i].data, data);
  assert_string_equal(r->v[i].id, id);
}

static void test_bom_only_once(void **state) {
  rec r = {0};
  (void)state;
  parse_str("\xEF\xBB\xBF"
            "data: a\n\n",
            &r);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "a", "");
  rec_free(&r);
  /* a second BOM is text: the line's field name is then unknown */
  parse_str("\xEF\xBB\xBF\xEF\xBB\xBF"
            "data: a\n\ndata: b\n\n",
            &r);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "b", "");
  rec_free(&r);
  /* a BOM prefix that is not a BOM stays text */
  parse_str("\xEF\xBB"
            "data: a\n\ndata: b\n\n",
            &r);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "b", "");
  rec_free(&r);
  parse_str("\xEF\ndata: c\n\n", &r);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "c", "");
  rec_free(&r);
  /* a lone partial BOM at the end of input is pending data */
  assert_int_equal(parse_str("\xEF\xBB", &r), 1);
  rec_free(&r);
}

static void test_comments(void **state) {
  rec r = {0};
  (void)state;
  assert_int_equal(parse_str(": hello\n:\n\n: ping\n\ndata: a\n: between\ndata: b\n\n: bye\n", &r), 0);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "a\nb", "");
  rec_free(&r);
}

static void test_multiline_data(void **state) {
  rec r = {0};
  (void)state;
  parse_str("data: one\ndata: two\ndata:three\n\ndata:\ndata\ndata: x\n\n", &r);
  assert_int_equal(r.n, 2);
  expect(&r, 0, "message", "one\ntwo\nthree", "");
  expect(&r, 1, "message", "\n\nx", "");
  rec_free(&r);
}

static void test_data_forms(void **state) {
  rec r = {0};
  (void)state;
  parse_str("data\n\ndata:x\n\ndata: x\n\ndata:  x\n\ndata :x\n\nDATA: x\n\n", &r);
  assert_int_equal(r.n, 4); /* "data :x" and "DATA" are other fields */
  expect(&r, 0, "message", "", "");
  expect(&r, 1, "message", "x", "");
  expect(&r, 2, "message", "x", "");
  expect(&r, 3, "message", " x", "");
  rec_free(&r);
  parse_str("data: a:b\n\n", &r);
  expect(&r, 0, "message", "a:b", "");
  rec_free(&r);
}

static void test_empty_data_event(void **state) {
  rec r = {0};
  (void)state;
  parse_str("\n\n\ndata:\n\n\n\nevent: x\n\ndata\n\n", &r);
  assert_int_equal(r.n, 2); /* blank lines alone and event-only blocks dispatch nothing */
  expect(&r, 0, "message", "", "");
  expect(&r, 1, "message", "", "");
  assert_int_equal(r.v[0].data_len, 0);
  rec_free(&r);
}

static int count_cb(void *ud, const mz_sse_event *ev) {
  (void)ev;
  (*(int *)ud)++;
  return 0;
}

static void test_event_id_retry(void **state) {
  rec r = {0};
  mz_sse p;
  int n = 0;
  static const char s[] = "event: delta\nid: 7\nretry: 1500\ndata: a\n\n"
                          "data: b\n\n"                    /* type resets, id persists */
                          "id\ndata: c\n\n"                /* empty id clears it */
                          "id: x\0y\ndata: d\n\n"          /* an id with NUL is ignored */
                          "event:\nfoo: bar\ndata: e\n\n"; /* empty type, unknown field */
  (void)state;
  mz_sse_init(&p, 0, on_event, &r);
  assert_int_equal(p.retry_ms, -1);
  assert_int_equal(mz_sse_feed(&p, s, sizeof s - 1), MZ_SSE_OK);
  assert_int_equal(r.n, 5);
  expect(&r, 0, "delta", "a", "7");
  expect(&r, 1, "message", "b", "7");
  expect(&r, 2, "message", "c", "");
  expect(&r, 3, "message", "d", "");
  expect(&r, 4, "message", "e", "");
  assert_int_equal(p.retry_ms, 1500);
  assert_int_equal(FEED(&p, "retry: 12a\nretry:\nretry: -5\n\n"), MZ_SSE_OK);
  assert_int_equal(p.retry_ms, 1500);
  assert_int_equal(FEED(&p, "retry:0\n\n"), MZ_SSE_OK);
  assert_int_equal(p.retry_ms, 0);
  assert_int_equal(p.events, 5);
  mz_sse_free(&p);
  rec_free(&r);
  /* long event names are truncated, not overflowed */
  parse_str("event: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"
            "data: z\n\n",
            &r);
  assert_int_equal(strlen(r.v[0].type), 63);
  rec_free(&r);
  /* the callback may be a plain counter */
  mz_sse_init(&p, 0, count_cb, &n);
  assert_int_equal(FEED(&p, "data: 1\n\ndata: 2\n\n"), MZ_SSE_OK);
  assert_int_equal(n, 2);
  mz_sse_free(&p);
}

static void test_unterminated_discarded(void **state) {
  rec r = {0};
  (void)state;
  assert_int_equal(parse_str("data: a\n\ndata: b", &r), 1);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "a", "");
  rec_free(&r);
  assert_int_equal(parse_str("data: a\n\ndata: b\n", &r), 1);
  assert_int_equal(r.n, 1);
  rec_free(&r);
  assert_int_equal(parse_str("data: a\n\nevent: x\n", &r), 1);
  rec_free(&r);
  assert_int_equal(parse_str("data: a\n\n", &r), 0);
  rec_free(&r);
  assert_int_equal(parse_str("data: a\r\n\r\n", &r), 0);
  rec_free(&r);
  assert_int_equal(parse_str("data: a\n\n: trailing comment\n", &r), 0);
  rec_free(&r);
  assert_int_equal(parse_str("", &r), 0);
  rec_free(&r);
}

/* After finish the parser starts clean: nothing leaks into the next event. */
static void test_finish_then_reuse(void **state) {
  rec r = {0};
  mz_sse p;
  (void)state;
  mz_sse_init(&p, 0, on_event, &r);
  assert_int_equal(FEED(&p, "data: a\ndata: partial"), MZ_SSE_OK);
  assert_int_equal(mz_sse_finish(&p), 1);
  assert_int_equal(mz_sse_finish(&p), 0);
  assert_int_equal(FEED(&p, "data: b\n\n"), MZ_SSE_OK);
  assert_int_equal(r.n, 1);
  expect(&r, 0, "message", "b", "");
  mz_sse_free(&p);
  rec_free(&r);
}

static void test_toobig_runaway_line(void **state) {
  rec r = {0};
  mz_sse p;
  char chunk[10];
  int i, rc = MZ_SSE_OK;
  (void)state;
  memset(chunk, 'x', sizeof chunk);
  mz_sse_init(&p, 64, on_event, &r);
  for (i = 0; i < 100 && rc == MZ_SSE_OK; i++) rc = mz_sse_feed(&p, chunk, sizeof chunk);
  assert_int_equal(rc, MZ_SSE_TOOBIG);
  assert_int_equal(i, 7); /* 60 bytes fit, 70 do not */
  assert_true(p.line_cap <= 64);
  /* sticky: even a valid event is refused */
  assert_int_equal(FEED(&p, "\n\ndata: a\n\n"), MZ_SSE_TOOBIG);
  assert_int_equal(r.n, 0);
  assert_int_equal(p.status, MZ_SSE_TOOBIG);
  /* reset clears the error and keeps the buffers */
  mz_sse_reset(&p);
  assert_int_equal(FEED(&p, "data: a\n\n"), MZ_SSE_OK);
  assert_int_equal(r.n, 1);
  mz_sse_free(&p);
  rec_free(&r);
}

static void test_toobig_line_in_place(void **state) {
  rec r = {0};
  mz_sse p;
  char line[101];
  (void)state;
  memset(line, 'c', sizeof line);
  line[0] = ':';
  line[100] = '\n';
  mz_sse_init(&p, 64, on_event, &r);
  assert_int_equal(mz_sse_feed(&p, line, sizeof line), MZ_SSE_TOOBIG);
  assert_true(p.line_cap <= 64 && p.data_cap <= 65);
  mz_sse_free(&p);
  rec_free(&r);
}

static void test_toobig_event(void **state) {
  rec r = {0};
  mz_sse p;
  int i, rc = MZ_SSE_OK;
  (void)state;
  mz_sse_init(&p, 64, on_event, &r);
  /* 10-byte lines joined: 10, 21, 32, 43, 54, 65 -> the sixth is too many */
  for (i = 0; i < 10 && rc == MZ_SSE_OK; i++) rc = FEED(&p, "data: 0123456789\n");
  assert_int_equal(rc, MZ_SSE_TOOBIG);
  assert_int_equal(i, 6);
  assert_int_equal(FEED(&p, "\n"), MZ_SSE_TOOBIG);
  assert_int_equal(r.n, 0);
  assert_true(p.data_cap <= 65 && p.line_cap <= 64);
  assert_string_equal(mz_sse_strerror(MZ_SSE_TOOBIG), "SSE event or line larger than the limit");
  mz_sse_free(&p);
  rec_free(&r);
}

static void test_exactly_at_cap(void **state) {
  rec r = {0};
  mz_sse p;
  char ev[64 + 6 + 2];
  (void)state;
  memcpy(ev, "data: ", 6);
  memset(ev + 6, 'y', 58);
  memcpy(ev + 64, "\ndata:\n\n", 8); /* 58 + "\n" = 59 bytes of data, line of 64 */
  mz_sse_init(&p, 64, on_event, &r);
  assert_int_equal(mz_sse_feed(&p, ev, 64), MZ_SSE_OK); /* the 64-byte line, split */
  assert_int_equal(mz_sse_feed(&p, ev + 64, 8), MZ_SSE_OK);
  assert_int_equal(r.n, 1);
  assert_int_equal(r.v[0].data_len, 59);
  mz_sse_reset(&p);
  rec_free(&r);
  /* data of exactly 64 bytes over two lines */
  assert_int_equal(FEED(&p, "data: 0123456789012345678901234567890\n"
                            "data: 01234567890123456789012345678901\n\n"),
                   MZ_SSE_OK);
  assert_int_equal(r.n, 1);
  assert_int_equal(r.v[0].data_len, 64);
  assert_true(p.data_cap <= 65);
  mz_sse_free(&p);
  rec_free(&r);
}

static void test_stop_resume(void **state) {
  rec r = {0};
  mz_sse p;
  (void)state;
  r.stop = 1;
  mz_sse_init(&p, 0, on_event, &r);
  assert_int_equal(FEED(&p, "data: a\n\ndata: b\n\ndata: c"), MZ_SSE_STOPPED);
  assert_int_equal(r.n, 1);
  assert_int_equal(mz_sse_feed(&p, NULL, 0), MZ_SSE_STOPPED); /* resumes after a */
  assert_int_equal(r.n, 2);
  expect(&r, 1, "message", "b", "");
  assert_int_equal(mz_sse_feed(&p, NULL, 0), MZ_SSE_OK); /* "data: c" is a partial line */
  assert_int_equal(FEED(&p, "\n\ndata: d\n\n"), MZ_SSE_STOPPED);
  assert_int_equal(r.n, 3);
  expect(&r, 2, "message", "c", "");
  /* new bytes queue behind the pending ones */
  assert_int_equal(FEED(&p, "data: e\n\n"), MZ_SSE_STOPPED);
  assert_int_equal(r.n, 4);
  expect(&r, 3, "message", "d", "");
  assert_int_equal(mz_sse_feed(&p, NULL, 0), MZ_SSE_STOPPED);
  expect(&r, 4, "message", "e", "");
  assert_int_equal(mz_sse_feed(&p, NULL, 0), MZ_SSE_OK);
  assert_int_equal(r.n, 5);
  /* a stop with bytes left: finish reports them; reset drops them */
  assert_int_equal(FEED(&p, "data: f\n\ndata: g\n\n"), MZ_SSE_STOPPED);
  mz_sse_reset(&p);
  assert_int_equal(mz_sse_feed(&p, NULL, 0), MZ_SSE_OK);
  assert_int_equal(r.n, 6);
  assert_int_equal(FEED(&p, "data: h\n\ndata: i\n\n"), MZ_SSE_STOPPED);
  assert_int_equal(mz_sse_finish(&p), 1);
  assert_int_equal(mz_sse_feed(&p, NULL, 0), MZ_SSE_OK);
  assert_int_equal(r.n, 7);
  expect(&r, 6, "message", "h", "");
  mz_sse_free(&p);
  rec_free(&r);
}

/* A callback that stops at every event, fed every fixture at every split
 * and drained with empty feeds, sees exactly the events of a plain run. */
static void test_stop_every_event_fixtures(void **state) {
  fixture_list *fl = fixtures();
  int i;
  (void)state;
  for (i = 0; i < fl->n; i++) {
    size_t len, cut;
    char *buf = fixture_slurp(fl->path[i], &len);
    rec ref = {0};
    int pending = run(buf, len, 0, 0, &ref);
    for (cut = 0; cut < len; cut += 7) {
      rec r = {0};
      mz_sse p;
      r.stop = 1;
      mz_sse_init(&p, 0, on_event, &r);
      if (mz_sse_feed(&p, buf, cut) == MZ_SSE_STOPPED)
        while (mz_sse_feed(&p, NULL, 0) == MZ_SSE_STOPPED) {}
      if (mz_sse_feed(&p, buf + cut, len - cut) == MZ_SSE_STOPPED)
        while (mz_sse_feed(&p, NULL, 0) == MZ_SSE_STOPPED) {}
      assert_int_equal(mz_sse_finish(&p), pending);
      rec_equal(&ref, &r, fl->path[i]);
      mz_sse_free(&p);
      rec_free(&r);
    }
    rec_free(&ref);
    free(buf);
  }
}

/* Buffers are reused: after the first events, no further growth. */
static void test_buffers_reused(void **state) {
  mz_sse p;
  int n = 0, i;
  char *data;
  (void)state;
  mz_sse_init(&p, 0, count_cb, &n);
  assert_int_equal(FEED(&p, "id: 1\ndata: hello world\n\n"), MZ_SSE_OK);
  data = p.data;
  for (i = 0; i < 1000; i++) {
    assert_int_equal(FEED(&p, "data: hello wo"), MZ_SSE_OK);
    assert_int_equal(FEED(&p, "rld\n\n"), MZ_SSE_OK);
  }
  assert_ptr_equal(p.data, data);
  assert_int_equal(n, 1001);
  assert_int_equal(p.events, 1001);
  mz_sse_free(&p);
  mz_sse_free(&p); /* idempotent */
  assert_null(p.data);
}

static void test_strerror(void **state) {
  (void)state;
  assert_string_equal(mz_sse_strerror(MZ_SSE_OK), "ok");
  assert_string_equal(mz_sse_strerror(MZ_SSE_STOPPED), "stopped by the event callback");
  assert_string_equal(mz_sse_strerror(MZ_SSE_TOOBIG), "SSE event or line larger than the limit");
  assert_string_equal(mz_sse_strerror(MZ_SSE_NOMEM), "out of memory in the SSE parser");
  assert_string_equal(mz_sse_strerror(42), "unknown SSE status");
}

/* The hand-written fixtures say what they mean. */
static void test_fixture_multiline(void **state) {
  size_t len;
  char *buf;
  rec r = {0};
  (void)state;
  buf = fixture_read(0, "multiline_data.sse", &len);
  assert_int_equal(run(buf, len, 0, 0, &r), 0);
  assert_int_equal(r.n, 5);
  /* the data lines joined by '\n', each without the one space after "data:" */
  assert_string_equal(r.v[0].data, "{\n\"id\": \"chatcmpl-fx1\",\n \"object\": \"chat.completion.chunk\",\n"
                                   "\"created\": 1760000000,\n \"model\": \"mtplx-qwen38-9b\",\n\"choices\": [\n"
                                   "  {\n  \"index\": 0,\n   \"delta\": {\n   \"content\": \"multi\"\n   },\n"
                                   "  \"finish_reason\": null\n  }\n]\n}");
  assert_int_equal(r.v[0].data_len, 216);
  assert_string_equal(r.v[0].id, "41");
  expect(&r, 1, "note", "first line\n\n two leading spaces", "42");
  assert_string_equal(r.v[2].id, "42");
  expect(&r, 3, "message", "", "42");
  expect(&r, 4, "message", "[DONE]", "42");
  rec_free(&r);
  free(buf);
  buf = fixture_read(0, "crlf_comments.sse", &len);
  assert_int_equal(run(buf, len, 0, 0, &r), 0);
  assert_int_equal(r.n, 5);
  expect(&r, 4, "message", "[DONE]", "");
  rec_free(&r);
  free(buf);
  buf = fixture_read(0, "truncated.sse", &len);
  assert_int_equal(run(buf, len, 0, 0, &r), 1);
  assert_int_equal(r.n, 2);
  rec_free(&r);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixtures_every_split),
      cmocka_unit_test(test_fixtures_random_pieces),
      cmocka_unit_test(test_fixtures_crlf_and_cr),
      cmocka_unit_test(test_fixtures_with_bom),
      cmocka_unit_test(test_bom_only_once),
      cmocka_unit_test(test_comments),
      cmocka_unit_test(test_multiline_data),
      cmocka_unit_test(test_data_forms),
      cmocka_unit_test(test_empty_data_event),
      cmocka_unit_test(test_event_id_retry),
      cmocka_unit_test(test_unterminated_discarded),
      cmocka_unit_test(test_finish_then_reuse),
      cmocka_unit_test(test_toobig_runaway_line),
      cmocka_unit_test(test_toobig_line_in_place),
      cmocka_unit_test(test_toobig_event),
      cmocka_unit_test(test_exactly_at_cap),
      cmocka_unit_test(test_stop_resume),
      cmocka_unit_test(test_stop_every_event_fixtures),
      cmocka_unit_test(test_buffers_reused),
      cmocka_unit_test(test_strerror),
      cmocka_unit_test(test_fixture_multiline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
