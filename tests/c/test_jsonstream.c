/*
 * test_jsonstream.c - behaviour of the incremental JSON parser
 * (src/jsonstream.h), differential against cJSON on the whole text.
 *
 * Each document is fed whole, byte by byte and split in two at every
 * offset, at depths 0 to 4 (and deeper for the deep ones); every way must
 * give the same values (pointer, bytes, offset) and the same verdict. The
 * whole feed is checked against cJSON's parse of the whole text: for a
 * valid document, the values at depth N are exactly cJSON's values at that
 * depth, in document order, under the same JSON pointer, and each value's
 * bytes are the document's own at its offset and decode to an equal tree
 * (numbers compared exactly, strings with their NULs). Every prefix of a
 * valid document is then a cut input: the values that ended inside it
 * (a number only once the byte after it is seen), then MZ_JS_CUT at its
 * length. Invalid documents give their status at the offset written next
 * to them, whatever the pieces; where cJSON is laxer (it takes "01", "1.",
 * "-.5", control bytes, "\uZZZZ") the table says so and cJSON is checked to take
 * them, everywhere else to refuse them too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "fixture.h"
#include "jsonstream.h"

#include <dirent.h>

/* ---- recording a run ---- */

typedef struct {
  char *path, *text;
  size_t path_len, len, offset;
} rec_ev;

typedef struct {
  rec_ev *v;
  size_t n, cap;
  int status; /* mz_js_finish's, or the error a feed returned */
  size_t err_at;
} run;

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  assert_non_null(d);
  if (n) memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static void add_ev(run *r, const mz_js_value *v) {
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 16;
    r->v = realloc(r->v, r->cap * sizeof *r->v);
    assert_non_null(r->v);
  }
  r->v[r->n].path = dup_n(v->path, v->path_len);
  r->v[r->n].path_len = v->path_len;
  r->v[r->n].text = dup_n(v->text, v->len);
  r->v[r->n].len = v->len;
  r->v[r->n].offset = v->offset;
  r->n++;
}

static void run_free(run *r) {
  for (size_t i = 0; i < r->n; i++) free(r->v[i].path), free(r->v[i].text);
  free(r->v);
  memset(r, 0, sizeof *r);
}

/* mz_js_start's root and candidates for the runs below (test_starts sets
 * them; every other test runs with the defaults). */
static int start_root, start_candidates = 1;

/* Feed doc[0..len) in the pieces that `cuts` (ncuts ascending offsets)
 * make, then finish. Each piece is copied to its own buffer, so a value
 * pointing into an earlier piece would be caught by ASan/valgrind. */
static void feed_pieces(const char *doc, size_t len, int depth, size_t max, const size_t *cuts, size_t ncuts, run *r) {
  mz_jsonstream p;
  size_t from = 0;
  memset(r, 0, sizeof *r);
  assert_int_equal(mz_js_init(&p, depth, max), 0);
  mz_js_start(&p, start_root, start_candidates);
  for (size_t k = 0; k <= ncuts; k++) {
    size_t to = k < ncuts ? cuts[k] : len, off = 0, used;
    char *piece = dup_n(doc + from, to - from);
    int st;
    for (;;) {
      mz_js_value v;
      st = mz_js_feed(&p, piece + off, to - from - off, &used, &v);
      assert_true(used <= to - from - off);
      off += used;
      if (st != MZ_JS_VALUE) break;
      add_ev(r, &v);
    }
    free(piece);
    if (st == MZ_JS_MORE) assert_int_equal(off, to - from);
    from = to;
    if (st < 0) break;
  }
  r->status = mz_js_finish(&p);
  r->err_at = p.err_at;
  assert_int_equal(mz_js_finish(&p), r->status); /* sticky */
  mz_js_free(&p);
}

static void feed_whole(const char *doc, size_t len, int depth, size_t max, run *r) {
  feed_pieces(doc, len, depth, max, NULL, 0, r);
}

static void assert_same_run(const run *a, const run *b, const char *how) {
  if (a->n != b->n || a->status != b->status || (a->status != MZ_JS_END && a->err_at != b->err_at))
    fail_msg("%s: %zu values, status %d at %zu; whole: %zu values, status %d at %zu", how, b->n, b->status, b->err_at,
             a->n, a->status, a->err_at);
  for (size_t i = 0; i < a->n; i++) {
    const rec_ev *x = &a->v[i], *y = &b->v[i];
    if (x->path_len != y->path_len || memcmp(x->path, y->path, x->path_len) || x->len != y->len ||
        memcmp(x->text, y->text, x->len) || x->offset != y->offset)
      fail_msg("%s: value %zu is %s = %s at %zu, whole feed: %s = %s at %zu", how, i, y->path, y->text, y->offset,
               x->path, x->text, x->offset);
  }
}

/* Every way of feeding gives what the whole feed gives. */
static void check_splits(const char *doc, size_t len, int depth, size_t max, const run *whole) {
  run r;
  size_t *all = malloc((len + 1) * sizeof *all);
  char how[64];
  assert_non_null(all);
  for (size_t i = 0; i < len; i++) all[i] = i + 1;
  feed_pieces(doc, len, depth, max, all, len ? len - 1 : 0, &r);
  assert_same_run(whole, &r, "byte by byte");
  run_free(&r);
  for (size_t cut = 0; cut <= len; cut++) {
    feed_pieces(doc, len, depth, max, &cut, 1, &r);
    snprintf(how, sizeof how, "split at %zu, depth %d", cut, depth);
    assert_same_run(whole, &r, how);
    run_free(&r);
  }
  free(all);
}

/* ---- cJSON's view of the whole text ---- */

#define PATH_MAX_TEST 8192

/* Exact equality of two trees (cJSON_Compare's numbers have a tolerance
 * and infinity fails it; strings here keep their NULs). */
static int same_tree(const cJSON *a, const cJSON *b) {
  if ((a->type & 0xFF) != (b->type & 0xFF)) return 0;
  if (cJSON_IsNumber(a)) return a->valuedouble == b->valuedouble;
  if (cJSON_IsString(a))
    return mz_json_strlen(a) == mz_json_strlen(b) && !memcmp(a->valuestring, b->valuestring, mz_json_strlen(a));
  if (cJSON_IsArray(a) || cJSON_IsObject(a)) {
    const cJSON *x = a->child, *y = b->child;
    for (; x && y; x = x->next, y = y->next) {
      if (cJSON_IsObject(a) && strcmp(x->string, y->string)) return 0;
      if (!same_tree(x, y)) return 0;
    }
    return !x && !y;
  }
  return 1;
}

typedef struct {
  const cJSON *node[4096];
  char *path[4096];
  size_t n;
} walk;

static void walk_free(walk *w) {
  for (size_t i = 0; i < w->n; i++) free(w->path[i]);
  w->n = 0;
}

/* cJSON's values at depth `depth` below v, in document order, with their
 * pointers (names escaped as RFC 6901 says). */
static void walk_depth(const cJSON *v, int depth, char *path, size_t plen, walk *w) {
  if (depth == 0) {
    assert_true(w->n < 4096);
    w->node[w->n] = v;
    w->path[w->n++] = dup_n(path, plen);
    return;
  }
  size_t i = 0;
  for (const cJSON *c = cJSON_IsArray(v) || cJSON_IsObject(v) ? v->child : NULL; c; c = c->next, i++) {
    char part[200];
    size_t n = 0;
    if (cJSON_IsArray(v)) n = (size_t)snprintf(part, sizeof part, "/%zu", i);
    else {
      part[n++] = '/';
      for (const char *k = c->string; *k && n < sizeof part - 3; k++) {
        if (*k == '~') part[n++] = '~', part[n++] = '0';
        else if (*k == '/') part[n++] = '~', part[n++] = '1';
        else part[n++] = *k;
      }
    }
    assert_true(plen + n < PATH_MAX_TEST);
    memcpy(path + plen, part, n);
    walk_depth(c, depth - 1, path, plen + n, w);
  }
}

static size_t json_start(const char *doc, size_t len) {
  size_t s = 0;
  while (s < len && doc[s] != '{' && doc[s] != '[') s++;
  return s;
}

/* A valid document: the whole feed against cJSON, every split against
 * the whole feed, every prefix as a cut input. */
static void check_valid(const char *doc, size_t len, int depth) {
  static walk w;
  static char path[PATH_MAX_TEST];
  size_t s = json_start(doc, len), end = 0;
  run whole, pre;
  cJSON *tree = mz_json_parse(doc + s, len - s, &end);
  if (!tree) fail_msg("cJSON refuses a test document at byte %zu: %s", s + end, doc);
  w.n = 0;
  walk_depth(tree, depth, path, 0, &w);
  feed_whole(doc, len, depth, 0, &whole);
  if (whole.status != MZ_JS_END)
    fail_msg("status %d (%s) at %zu for %s", whole.status, mz_js_strerror(whole.status), whole.err_at, doc);
  if (whole.n != w.n) fail_msg("depth %d: %zu values, cJSON has %zu, in %s", depth, whole.n, w.n, doc);
  for (size_t i = 0; i < w.n; i++) {
    const rec_ev *e = &whole.v[i];
    size_t e_end = 0;
    cJSON *mine = mz_json_parse(e->text, e->len, &e_end);
    assert_string_equal(e->path, w.path[i]);
    assert_true(e->offset + e->len <= len);
    assert_memory_equal(e->text, doc + e->offset, e->len); /* the span is the document's */
    if (!mine || e_end != e->len) fail_msg("value %zu (%s) does not decode whole: %s", i, e->path, e->text);
    if (!same_tree(mine, w.node[i])) fail_msg("value %zu (%s) differs from cJSON's: %s", i, e->path, e->text);
    cJSON_Delete(mine);
  }
  check_splits(doc, len, depth, 0, &whole);
  /* the cut inputs: each prefix, whole */
  for (size_t k = 0; k < len; k++) {
    size_t want = 0;
    feed_whole(doc, k, depth, 0, &pre);
    for (size_t i = 0; i < whole.n; i++) {
      size_t e = whole.v[i].offset + whole.v[i].len;
      int num = whole.v[i].text[0] == '-' || (whole.v[i].text[0] >= '0' && whole.v[i].text[0] <= '9');
      if (e < k || (e == k && !num)) want++;
    }
    if (pre.n != want) fail_msg("prefix %zu of %s: %zu values, want %zu", k, doc, pre.n, want);
    for (size_t i = 0; i < want; i++) assert_string_equal(pre.v[i].text, whole.v[i].text);
    if (k >= s + end) assert_int_equal(pre.status, MZ_JS_END);
    else {
      assert_int_equal(pre.status, k <= s ? MZ_JS_NOJSON : MZ_JS_CUT);
      assert_int_equal(pre.err_at, k);
    }
    run_free(&pre);
  }
  run_free(&whole);
  walk_free(&w);
  cJSON_Delete(tree);
}

static void check_valid_depths(const char *doc, int from, int to) {
  for (int d = from; d <= to; d++) check_valid(doc, strlen(doc), d);
}

/* ---- valid documents ---- */

static const char *const VALID[] = {
    "{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"e\",\"f\":[]},\"g\":{},\"h\":-0.5e+10}",
    "[1,-1,0,-0,123,1.5,-1.5e10,1E+2,1e-2,0.0e0,0e5,1e999,-1e-999,12345678901234567890,3.141592653589793,"
    "9007199254740993,2.2250738585072014e-308,1.7976931348623157E308,10,0.1]",
    "{\"esc\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\",\"u\":\"\\u00e9\\u20AC\\uD83D\\uDE00\\uDBFF\\uDFFF\","
    "\"raw\":\"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\",\"nul\":\"a\\u0000b\",\"e\":\"\"}",
    "{\"a/b\":1,\"m~n\":2,\"\\u00e9\":3,\"\\uD83D\\uDE00\":{\"x\\\"y\":[1]},\"\":4,\" \":5,\"\\/\":6,"
    "\"~1\":{\"~0/\":[{\"\\t\\n\":7}]},\"caf\xc3\xa9\":8}",
    "Sure! Here is the JSON you asked for:\n```json\n{\"items\":[{\"id\":1,\"name\":\"x\"},"
    "{\"id\":2,\"name\":\"y\",\"tags\":[\"a\",\"b\"]}],\"total\":2}\n```\nAnything else?",
    "[[],[[]],[[1,[2,[3]]]],{\"k\":[{},{\"z\":null}]},[{}],{\"\":{\"\":[]}}]",
    " \t\n\r[ \t\n\r{ \"a\" : 1 , \"b\" :\n[ 1 , 2 ] } , 3 , \"s\" , true , { } , [ ] ]\r\n",
    "{}",
    "[]",
    "note: \"}]\" and :, then -> [1, \"two\", {\"three\": 3}]",
    "{\"a\":1} {\"b\":2} trailing text, and [unparsed",
    "[\"\\u0041\\u00DF\\u6771\\uD834\\uDD1E\", \"tab\\there\", \"\\\\u0041\"]",
    "{\"deep\":{\"er\":{\"est\":{\"x\":[[[[\"bottom\"]]]]}}},\"n\":[0.5,-0,1e1]}",
    "[true,false,null,\"true\",[true],{\"t\":true,\"f\":false,\"n\":null}]",
};

static void test_valid_documents(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof VALID / sizeof VALID[0]; i++) check_valid_depths(VALID[i], 0, 4);
}

static void test_long_string_and_numbers(void **state) {
  char doc[1400];
  size_t n = 0;
  (void)state;
  n += (size_t)snprintf(doc + n, sizeof doc - n, "{\"long\":\"");
  for (int i = 0; i < 600; i++) doc[n++] = (char)('a' + i % 26);
  n += (size_t)snprintf(doc + n, sizeof doc - n, "\",\"num\":");
  for (int i = 0; i < 300; i++) doc[n++] = (char)('1' + i % 9);
  n += (size_t)snprintf(doc + n, sizeof doc - n, ".5e-3,\"k\":[1]}");
  doc[n] = '\0';
  check_valid_depths(doc, 0, 2);
}

/* Real JSON: the data payload of every frame of every recorded stream
 * (tests/fixtures, tests/fixtures/traces) that cJSON takes, at depths 0
 * to 3. Returns the number of payloads checked. */
static size_t check_fixture_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  size_t checked = 0;
  if (!d) fail_msg("cannot open %s", dir);
  while ((e = readdir(d))) {
    char path[2048], *buf, *line, *next;
    size_t len;
    if (!strstr(e->d_name, ".sse")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    buf = fixture_slurp(path, &len);
    for (line = buf; line && *line; line = next) {
      size_t n, end = 0;
      next = strchr(line, '\n');
      n = next ? (size_t)(next - line) : strlen(line);
      if (next) next++;
      if (n && line[n - 1] == '\r') n--;
      if (strncmp(line, "data: {", 7) != 0) continue;
      cJSON *t = mz_json_parse(line + 6, n - 6, &end);
      cJSON_Delete(t);
      if (!t || memchr(line + 6, '\0', n - 6)) continue; /* malformed on purpose */
      for (int depth = 0; depth <= 3; depth++) check_valid(line + 6, n - 6, depth);
      checked++;
    }
    free(buf);
  }
  closedir(d);
  return checked;
}

static void test_recorded_frames(void **state) {
  (void)state;
  assert_true(check_fixture_dir(fixture_dir(0)) + check_fixture_dir(fixture_dir(1)) > 100);
}

/* 1000 levels, cJSON's limit, parse; the values are checked at the top,
 * in the middle and at the bottom. */
static void test_deep_nesting(void **state) {
  static char doc[2 * MZ_JS_MAX_NEST + 8];
  size_t n = 0;
  (void)state;
  for (int i = 0; i < MZ_JS_MAX_NEST; i++) doc[n++] = '[';
  doc[n++] = '7';
  for (int i = 0; i < MZ_JS_MAX_NEST; i++) doc[n++] = ']';
  doc[n] = '\0';
  check_valid(doc, n, 0);
  check_valid(doc, n, 1);
  check_valid(doc, n, 500);
  check_valid(doc, n, MZ_JS_MAX_NEST); /* the 7 */
  check_valid(doc, n, MZ_JS_MAX_NEST + 1);
}

static void test_deeper_than_limit(void **state) {
  static char doc[2 * MZ_JS_MAX_NEST + 8];
  size_t n = 0, end = 0;
  run r;
  (void)state;
  for (int i = 0; i <= MZ_JS_MAX_NEST; i++) doc[n++] = '[';
  for (int i = 0; i <= MZ_JS_MAX_NEST; i++) doc[n++] = ']';
  assert_null(mz_json_parse(doc, n, &end)); /* cJSON refuses 1001 too */
  feed_whole(doc, n, 0, 0, &r);
  assert_int_equal(r.status, MZ_JS_DEPTH);
  assert_int_equal(r.err_at, MZ_JS_MAX_NEST);
  check_splits(doc, n, 0, 0, &r);
  run_free(&r);
}

/* ---- invalid documents ---- */

typedef struct {
  const char *doc;
  int depth;
  int status;
  size_t at;
  size_t values;   /* handed out before the error */
  int cjson_laxer; /* cJSON takes it: a documented difference */
} bad_doc;

static const bad_doc BAD[] = {
    {"[1,]", 0, MZ_JS_SYNTAX, 3, 0, 0},
    {"{\"a\":1,}", 1, MZ_JS_SYNTAX, 7, 1, 0},
    {"[01]", 1, MZ_JS_NUMBER, 2, 0, 1},
    {"[-01]", 1, MZ_JS_NUMBER, 3, 0, 1},
    {"[1.]", 1, MZ_JS_NUMBER, 3, 0, 1},
    {"[1.e5]", 1, MZ_JS_NUMBER, 3, 0, 1},
    {"[-.5]", 1, MZ_JS_NUMBER, 2, 0, 1},
    {"[-]", 1, MZ_JS_NUMBER, 2, 0, 0},
    {"[1e]", 1, MZ_JS_NUMBER, 3, 0, 0},
    {"[1e+]", 1, MZ_JS_NUMBER, 4, 0, 0},
    {"[+1]", 1, MZ_JS_SYNTAX, 1, 0, 0},
    {"[.5]", 1, MZ_JS_SYNTAX, 1, 0, 0},
    {"[1.5.2]", 1, MZ_JS_SYNTAX, 4, 1, 0},
    {"[\"a\x01\"]", 1, MZ_JS_CONTROL, 3, 0, 1},
    {"[\"a\nb\"]", 1, MZ_JS_CONTROL, 3, 0, 1},
    {"[\x01 1]", 1, MZ_JS_CONTROL, 1, 0, 1},
    {"[1,\x0b 2]", 1, MZ_JS_CONTROL, 3, 1, 1},
    {"[\"\\x\"]", 1, MZ_JS_ESCAPE, 3, 0, 0},
    {"[\"\\U0041\"]", 1, MZ_JS_ESCAPE, 3, 0, 0},
    {"[\"\\uZZZZ\"]", 1, MZ_JS_HEX, 4, 0, 1},
    {"[\"\\u12\"]", 1, MZ_JS_HEX, 6, 0, 0},
    {"[\"\\uD800\"]", 1, MZ_JS_SURROGATE, 8, 0, 0},
    {"[\"\\uDC00\"]", 1, MZ_JS_SURROGATE, 7, 0, 0},
    {"[\"\\uD800\\u0041\"]", 1, MZ_JS_SURROGATE, 13, 0, 0},
    {"[\"\\uD800\\n\"]", 1, MZ_JS_SURROGATE, 9, 0, 0},
    {"{\"\\uD800x\":1}", 1, MZ_JS_SURROGATE, 8, 0, 0},
    {"[tru]", 1, MZ_JS_SYNTAX, 4, 0, 0},
    {"[nul]", 1, MZ_JS_SYNTAX, 4, 0, 0},
    {"[True]", 1, MZ_JS_SYNTAX, 1, 0, 0},
    {"[truex]", 1, MZ_JS_SYNTAX, 5, 1, 0},
    {"{\"a\" 1}", 1, MZ_JS_SYNTAX, 5, 0, 0},
    {"{1:2}", 1, MZ_JS_SYNTAX, 1, 0, 0},
    {"{\"a\":1]", 1, MZ_JS_SYNTAX, 6, 1, 0},
    {"[1}", 1, MZ_JS_SYNTAX, 2, 1, 0},
    {"[1 2]", 1, MZ_JS_SYNTAX, 3, 1, 0},
    {"[\x7f]", 1, MZ_JS_SYNTAX, 1, 0, 0},
    {"[{\"a\":1},{\"b\":2},x]", 1, MZ_JS_SYNTAX, 17, 2, 0},
    {"Answer: [{\"a\":1},{\"b\":2},{\"c\":3]]", 2, MZ_JS_SYNTAX, 31, 3, 0},
    {"no json here", 0, MZ_JS_NOJSON, 12, 0, 0},
    {"", 0, MZ_JS_NOJSON, 0, 0, 0},
    {"[\"open", 0, MZ_JS_CUT, 6, 0, 0},
    {"{\"a\":[1,2", 1, MZ_JS_CUT, 9, 0, 0},
    {"{\"a\":[1,2", 2, MZ_JS_CUT, 9, 1, 0},
};

static void test_invalid_documents(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    const bad_doc *b = &BAD[i];
    size_t len = strlen(b->doc), s = json_start(b->doc, len), end = 0;
    run r;
    cJSON *tree = s < len ? mz_json_parse(b->doc + s, len - s, &end) : NULL;
    /* cJSON refuses it too, or takes it: a documented difference */
    if ((tree != NULL) != (b->cjson_laxer != 0)) fail_msg("cJSON %s %s", tree ? "takes" : "refuses", b->doc);
    cJSON_Delete(tree);
    feed_whole(b->doc, len, b->depth, 0, &r);
    if (r.status != b->status || r.err_at != b->at || r.n != b->values)
      fail_msg("%s: status %d (%s) at %zu after %zu values, want %d at %zu after %zu", b->doc, r.status,
               mz_js_strerror(r.status), r.err_at, r.n, b->status, b->at, b->values);
    for (size_t k = 0; k < r.n; k++) assert_memory_equal(r.v[k].text, b->doc + r.v[k].offset, r.v[k].len);
    check_splits(b->doc, len, b->depth, 0, &r);
    run_free(&r);
  }
}

/* ---- the cap on one value ---- */

static void test_value_cap(void **state) {
  static const struct {
    const char *doc;
    int depth;
    size_t max;
    int status;
    size_t at, values;
  } CASES[] = {
      {"[1,\"abcdefghij\",3]", 1, 8, MZ_JS_TOOBIG, 11, 1},     /* "abcdefghij" starts at 3 */
      {"[1,\"abcdef\",3]", 1, 8, MZ_JS_END, 0, 3},             /* exactly 8 bytes */
      {"[1,\"abcdefghij\x01\",3]", 1, 8, MZ_JS_TOOBIG, 11, 1}, /* an error past the cap is the cap's */
      {"[1,\"ab\x01 defghij\",3]", 1, 8, MZ_JS_CONTROL, 6, 1}, /* ... one before it is its own */
      {"[1,123456789,2]", 1, 8, MZ_JS_TOOBIG, 11, 1},
      {"[1,12345678,2]", 1, 8, MZ_JS_END, 0, 3},
      {"[1,[1,2,3,4,5]]", 1, 8, MZ_JS_TOOBIG, 11, 1},
      {"[1,[1,2,3,4,5", 1, 8, MZ_JS_TOOBIG, 11, 1},
      {"{\"abcdefghijk\":1}", 1, 8, MZ_JS_TOOBIG, 9, 0}, /* the pointer "/abcdefgh..." */
      {"{\"abcdefghijk\":1}", 0, 8, MZ_JS_TOOBIG, 8, 0},
      {"{\"abcdefghijk\":1}", 0, 17, MZ_JS_END, 0, 1},
  };
  (void)state;
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
    run r;
    size_t len = strlen(CASES[i].doc);
    feed_whole(CASES[i].doc, len, CASES[i].depth, CASES[i].max, &r);
    if (r.status != CASES[i].status || (r.status != MZ_JS_END && r.err_at != CASES[i].at) || r.n != CASES[i].values)
      fail_msg("%s max %zu: status %d at %zu after %zu values", CASES[i].doc, CASES[i].max, r.status, r.err_at, r.n);
    check_splits(CASES[i].doc, len, CASES[i].depth, CASES[i].max, &r);
    run_free(&r);
  }
}

/* ---- where the value starts: the root's bracket, the next start ---- */

/* A prose bracket before the answer: only the root's bracket starts it,
 * and a start that is not JSON before any value inside it completed gives
 * way to the next one, from the byte in error on, up to `candidates`;
 * when none is whole, the error is the first start's (or the cut of the
 * last). The same whatever the pieces. `want` lists "pointer=bytes;". */
static void test_starts(void **state) {
  static const struct {
    const char *doc;
    int root, candidates, depth, status;
    size_t at;
    const char *want;
  } CASES[] = {
      {"See [1] for the list: {\"a\":1}", '{', 1, 1, MZ_JS_END, 0, "/a=1;"},
      {"See [1] for the list: {\"a\":1}", 0, 8, 1, MZ_JS_END, 0, "/0=1;"}, /* either: [1] is JSON */
      {"See [1] for the list: {\"a\":1}", '{', 8, 0, MZ_JS_END, 0, "={\"a\":1};"},
      {"Use {braces} here: {\"a\":1}", '{', 8, 1, MZ_JS_END, 0, "/a=1;"},
      {"Use {braces} here: {\"a\":1}", '{', 1, 1, MZ_JS_SYNTAX, 5, ""}, /* one start only */
      {"Note {x} first: [1,2]", '[', 8, 1, MZ_JS_END, 0, "/0=1;/1=2;"},
      {"[see below] [1, 2]", '[', 8, 1, MZ_JS_END, 0, "/0=1;/1=2;"},
      {"[see below] [1, 2]", 0, 8, 0, MZ_JS_END, 0, "=[1, 2];"},
      {"{\"a\":1,oops} {\"a\":2}", '{', 8, 1, MZ_JS_SYNTAX, 7, "/a=1;"}, /* a member completed: kept */
      {"{\"a\":1,oops} {\"a\":2}", '{', 8, 0, MZ_JS_SYNTAX, 7, ""},
      {"{x} {y} {z}", '{', 2, 0, MZ_JS_SYNTAX, 1, ""},        /* two starts, both prose: the first's error */
      {"{x} tail", '{', 8, 0, MZ_JS_SYNTAX, 1, ""},           /* ... and at finish */
      {"{x} {\"a\":[1,", '{', 8, 0, MZ_JS_CUT, 12, ""},       /* the last start cut */
      {"{{\"a\":1}", '{', 8, 0, MZ_JS_END, 0, "={\"a\":1};"}, /* the byte in error starts the next */
      {"{[{\"a\":1}", '{', 8, 1, MZ_JS_END, 0, "/a=1;"},      /* ... only when it is the root's */
      {"{\"a\" x {\"b\":[1]}", '{', 8, 0, MZ_JS_END, 0, "={\"b\":[1]};"},
      {"{\"t\":\"\x01\"} [2]", 0, 8, 1, MZ_JS_END, 0, "/0=2;"}, /* a control byte gives way too */
  };
  (void)state;
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
    char got[256] = "";
    size_t len = strlen(CASES[i].doc), n = 0;
    run r;
    start_root = CASES[i].root;
    start_candidates = CASES[i].candidates;
    feed_whole(CASES[i].doc, len, CASES[i].depth, 0, &r);
    for (size_t k = 0; k < r.n; k++) n += (size_t)snprintf(got + n, sizeof got - n, "%s=%s;", r.v[k].path, r.v[k].text);
    if (r.status != CASES[i].status || (r.status != MZ_JS_END && r.err_at != CASES[i].at) || strcmp(got, CASES[i].want))
      fail_msg("%s (root %c, %d starts): status %d at %zu, values %s", CASES[i].doc,
               CASES[i].root ? CASES[i].root : '-', CASES[i].candidates, r.status, r.err_at, got);
    for (size_t k = 0; k < r.n; k++) assert_memory_equal(r.v[k].text, CASES[i].doc + r.v[k].offset, r.v[k].len);
    check_splits(CASES[i].doc, len, CASES[i].depth, 0, &r);
    run_free(&r);
  }
  start_root = 0;
  start_candidates = 1;
}

/* ---- the feed contract ---- */

/* A number is handed out by the byte after it, which that call does not
 * take; a value ending a piece is handed out with every byte taken; after
 * the top-level value, the rest is left and every call says END. */
static void test_feed_contract(void **state) {
  mz_jsonstream p;
  mz_js_value v;
  size_t used;
  (void)state;
  assert_int_equal(mz_js_init(&p, 1, 0), 0);
  assert_int_equal(mz_js_feed(&p, "xx[12", 5, &used, &v), MZ_JS_MORE);
  assert_int_equal(used, 5);
  assert_int_equal(mz_js_feed(&p, ",\"s\"]tail", 9, &used, &v), MZ_JS_VALUE);
  assert_int_equal(used, 0);
  assert_int_equal(v.len, 2);
  assert_memory_equal(v.text, "12", 2);
  assert_int_equal(v.offset, 3);
  assert_int_equal(v.path_len, 2);
  assert_memory_equal(v.path, "/0", 2);
  assert_int_equal(mz_js_feed(&p, ",\"s\"]tail", 9, &used, &v), MZ_JS_VALUE);
  assert_int_equal(used, 4);
  assert_memory_equal(v.text, "\"s\"", 3);
  assert_memory_equal(v.path, "/1", 2);
  assert_int_equal(mz_js_feed(&p, "]tail", 5, &used, &v), MZ_JS_END);
  assert_int_equal(used, 1);
  assert_int_equal(mz_js_feed(&p, "tail", 4, &used, &v), MZ_JS_END);
  assert_int_equal(used, 0);
  assert_int_equal(mz_js_finish(&p), MZ_JS_END);
  assert_int_equal(p.values, 2);
  mz_js_free(&p);
  /* an error is sticky and takes nothing */
  assert_int_equal(mz_js_init(&p, 0, 0), 0);
  assert_int_equal(mz_js_feed(&p, "[1,,", 4, &used, &v), MZ_JS_SYNTAX);
  assert_int_equal(p.err_at, 3);
  assert_int_equal(mz_js_feed(&p, "2]", 2, &used, &v), MZ_JS_SYNTAX);
  assert_int_equal(used, 0);
  assert_int_equal(mz_js_finish(&p), MZ_JS_SYNTAX);
  mz_js_free(&p);
  assert_string_equal(mz_js_strerror(MZ_JS_CUT), "cut");
  assert_string_equal(mz_js_strerror(12345), "unknown status");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_documents),
      cmocka_unit_test(test_long_string_and_numbers),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_deeper_than_limit),
      cmocka_unit_test(test_invalid_documents),
      cmocka_unit_test(test_value_cap),
      cmocka_unit_test(test_feed_contract),
      cmocka_unit_test(test_recorded_frames),
      cmocka_unit_test(test_starts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
