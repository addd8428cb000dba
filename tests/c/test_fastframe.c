/*
 * test_fastframe.c - the token-frame fast path (src/fastframe.h) against
 * the cJSON decoder it short-cuts (src/decode.h).
 *
 * The main test is differential: every data payload of every recorded
 * stream (tests/fixtures/ *.sse and traces/ *.sse, cut into events by the
 * SSE parser), and thousands of mutants of each (bytes deleted, replaced,
 * inserted; every truncation; escapes put into the text; keys added,
 * repeated or changed), go through mz_fast_frame. Whenever it accepts, cJSON
 * must accept too and read the same index, content and reasoning, and see
 * nothing else a caller would act on. Acceptance is the other half: the
 * fast path is only worth having if it takes the plain token frames of
 * both dialects, so that is asserted on the traces. Then unit cases for
 * mz_fast_frame and mz_json_unescape, the latter also checked against
 * cJSON's own string decoding.
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

#include "decode.h"
#include "fastframe.h"
#include "fixture.h"
#include "sse.h"

/* ---- fixtures ---- */

typedef struct {
  char **data;
  size_t *len;
  int n, cap;
} payloads;

static void add_payload(payloads *p, const char *data, size_t len) {
  if (p->n == p->cap) {
    p->cap = p->cap ? p->cap * 2 : 64;
    p->data = realloc(p->data, (size_t)p->cap * sizeof *p->data);
    p->len = realloc(p->len, (size_t)p->cap * sizeof *p->len);
    assert_non_null(p->data);
    assert_non_null(p->len);
  }
  p->data[p->n] = malloc(len + 1);
  assert_non_null(p->data[p->n]);
  memcpy(p->data[p->n], data, len);
  p->data[p->n][len] = '\0';
  p->len[p->n++] = len;
}

static int collect(void *ud, const mz_sse_event *ev) {
  add_payload(ud, ev->data, ev->data_len);
  return 0;
}

/* The payloads of one recorded stream, appended to p. */
static void load_file(const char *dir, const char *name, payloads *p) {
  char path[1400];
  size_t len;
  char *buf;
  mz_sse sse;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  buf = fixture_slurp(path, &len);
  mz_sse_init(&sse, 0, collect, p);
  assert_int_equal(mz_sse_feed(&sse, buf, len), MZ_SSE_OK);
  mz_sse_finish(&sse);
  mz_sse_free(&sse);
  free(buf);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Every *.sse of a directory; returns how many files were read. */
static int load_dir(int traces, payloads *p) {
  const char *dir = fixture_dir(traces);
  DIR *d = opendir(dir);
  struct dirent *de;
  int files = 0;
  if (!d) fail_msg("cannot open %s", dir);
  while ((de = readdir(d)))
    if (ends_with(de->d_name, ".sse")) load_file(dir, de->d_name, p), files++;
  closedir(d);
  return files;
}

static void free_payloads(payloads *p) {
  for (int i = 0; i < p->n; i++) free(p->data[i]);
  free(p->data);
  free(p->len);
  memset(p, 0, sizeof *p);
}

/* ---- the differential check ---- */

/* A fast-path string, unescaped, equals what cJSON read (NULL = absent). */
static void same_text(const mz_fast_str *fs, const char *s, size_t len, const char *what, const char *data) {
  char *buf;
  size_t n;
  if (!fs->p || !s) {
    if (fs->p != NULL || s != NULL) fail_msg("%s present on one side only in: %s", what, data);
    return;
  }
  buf = malloc(fs->len + 1);
  assert_non_null(buf);
  n = fs->esc ? mz_json_unescape(fs->p, fs->len, buf) : (memcpy(buf, fs->p, fs->len), fs->len);
  if (n != len || memcmp(buf, s, n) != 0) fail_msg("%s differs (%zu vs %zu bytes) in: %s", what, n, len, data);
  free(buf);
}

typedef struct {
  unsigned long tried, accepted, escaped;
} tally;

/* The fast path on one payload; if it accepts, cJSON must agree. */
static int check(const char *data, size_t len, tally *t) {
  mz_fast ff;
  mz_frame f;
  mz_choice c;
  char err[128];
  t->tried++;
  if (!mz_fast_frame(data, len, &ff)) return 0;
  t->accepted++;
  t->escaped += ff.content.esc || ff.reasoning.esc;
  if (mz_frame_decode(&f, data, len, err, sizeof err) != 0)
    fail_msg("fast path took what cJSON refuses (%s): %.*s", err, (int)len, data);
  if (f.done || f.nchoices != 1 || f.unknown || f.usage || f.timings || f.stats || f.progress || f.error)
    fail_msg("fast path took a frame with more in it: %.*s", (int)len, data);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  if (c.role || c.tool_calls || c.finish_reason || c.message || c.logprobs)
    fail_msg("fast path took a non-token choice: %.*s", (int)len, data);
  assert_int_equal(ff.index, c.index);
  same_text(&ff.content, c.content, c.content_len, "content", data);
  same_text(&ff.reasoning, c.reasoning, c.reasoning_len, "reasoning", data);
  mz_frame_free(&f);
  return 1;
}

/* data with [at, at+del) replaced by ins, then checked. */
static void splice(const char *data, size_t len, size_t at, size_t del, const char *ins, tally *t) {
  size_t n = strlen(ins), m = len - del + n;
  char *b = malloc(m + 1);
  assert_non_null(b);
  memcpy(b, data, at);
  memcpy(b + at, ins, n);
  memcpy(b + at + n, data + at + del, len - at - del);
  b[m] = '\0';
  check(b, m, t);
  free(b);
}

/* Insert ins right after the first occurrence of anchor, if any. */
static void insert_after(const char *data, size_t len, const char *anchor, const char *ins, tally *t) {
  const char *a = strstr(data, anchor);
  if (a) splice(data, len, (size_t)(a - data) + strlen(anchor), 0, ins, t);
}

/* Replace the first occurrence of from by to, if any. */
static void replace_first(const char *data, size_t len, const char *from, const char *to, tally *t) {
  const char *a = strstr(data, from);
  if (a) splice(data, len, (size_t)(a - data), strlen(from), to, t);
}

static const char *const byte_mutants[] = {"\"", "\\", "}", "]", ",", ":", " ", "x", "0", "{", "[", "\x01", "\xc3"};
#define NBYTE_MUTANTS (sizeof byte_mutants / sizeof byte_mutants[0])

/* Escapes that go into a text value; lone surrogates must be refused. */
static const char *const text_inserts[] = {"\\n",      "\\u00e9",        "\\u00E9", "\\ud83d\\ude00", "\\ud800",
                                           "\\udc00",  "\\ud800\\u0041", "\\u0000", "\\\"",           "\\\\",
                                           "\\/",      "\\b\\f\\r\\t",   "\\x",     "\\u12",          "\t",
                                           "\xe2\x82", "\xe2\x82\xac",   "\\u20ac"};

static const char *const text_keys[] = {"\"content\":\"", "\"reasoning_content\":\"", "\"reasoning\":\""};

/* Structural edits: new keys, repeats, non-token shapes. */
static void structural(const char *d, size_t n, tally *t) {
  static const char *const top[] = {"\"usage\":null,",     "\"usage\":{\"completion_tokens\":1},",
                                    "\"timings\":{},",     "\"mtplx_progress\":{\"heartbeat\":true},",
                                    "\"mtplx_stats\":{},", "\"error\":null,",
                                    "\"foo\":1,",          "\"id\":\"dup\",",
                                    "\"choices\":[],",     "\"model\":[1,{\"a\":[true,false,null,-1.5e+3]}],",
                                    "\"i\\u0064\":\"x\","};
  static const char *const choice[] = {"\"index\":1,",
                                       "\"finish_reason\":null,",
                                       "\"logprobs\":null,",
                                       "\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-0.1}]},",
                                       "\"message\":{},",
                                       "\"delta\":{},",
                                       "\"x\":0,"};
  static const char *const delta[] = {"\"role\":\"assistant\",", "\"content\":\"dup\",",        "\"content\":null,",
                                      "\"reasoning\":\"alt\",",  "\"reasoning_content\":\"\",", "\"tool_calls\":[],",
                                      "\"reasoning\":null,",     "\"reasoning\":\"\","};
  for (size_t i = 0; i < sizeof top / sizeof *top; i++) insert_after(d, n, "{", top[i], t);
  for (size_t i = 0; i < sizeof choice / sizeof *choice; i++) insert_after(d, n, "\"choices\":[{", choice[i], t);
  for (size_t i = 0; i < sizeof delta / sizeof *delta; i++) insert_after(d, n, "\"delta\":{", delta[i], t);
  insert_after(d, n, "\"choices\":[", "{\"index\":1,\"delta\":{\"content\":\"b\"}},", t);
  insert_after(d, n, "}]", ",{}", t);
  replace_first(d, n, "\"finish_reason\":null", "\"finish_reason\":\"stop\"", t);
  replace_first(d, n, "\"index\":0", "\"index\":0.0", t);
  replace_first(d, n, "\"index\":0", "\"index\":-1", t);
  replace_first(d, n, "\"index\":0", "\"index\":3", t);
  replace_first(d, n, "\"index\":0", "\"index\":1e0", t);
  replace_first(d, n, "\"delta\":{", "\"delta\":null,\"x\":{", t);
  replace_first(d, n, "\"choices\":[{", "\"choices\":[ {", t);
  replace_first(d, n, "\"content\":\"", "\"content\" : \"", t);
  splice(d, n, 0, 0, "\xef\xbb\xbf", t); /* BOM: cJSON skips it, we refuse */
  splice(d, n, 0, 0, " \r\n\t", t);
  splice(d, n, n, 0, " \n", t);
  splice(d, n, n, 0, "x", t);
  splice(d, n, n, 0, "{}", t);
}

/* Every mutant of one payload. */
static void mutate(const char *d, size_t n, tally *t) {
  for (size_t i = 0; i < n; i++) {
    splice(d, n, i, 1, "", t);
    for (size_t k = 0; k < NBYTE_MUTANTS; k++) {
      splice(d, n, i, 1, byte_mutants[k], t);
      splice(d, n, i, 0, byte_mutants[k], t);
    }
    check(d, i, t); /* truncated */
  }
  for (size_t k = 0; k < sizeof text_keys / sizeof *text_keys; k++)
    for (size_t j = 0; j < sizeof text_inserts / sizeof *text_inserts; j++) {
      insert_after(d, n, text_keys[k], text_inserts[j], t);
      const char *a = strstr(d, text_keys[k]);
      const char *q = a ? strchr(a + strlen(text_keys[k]), '"') : NULL;
      if (q) splice(d, n, (size_t)(q - d), 0, text_inserts[j], t); /* at the end of the value */
    }
  structural(d, n, t);
}

static void test_differential(void **state) {
  payloads p = {0};
  tally t = {0};
  (void)state;
  assert_true(load_dir(0, &p) > 0);
  assert_true(load_dir(1, &p) > 0);
  assert_true(p.n > 50);
  for (int i = 0; i < p.n; i++) {
    check(p.data[i], p.len[i], &t);
    mutate(p.data[i], p.len[i], &t);
  }
  print_message("%d payloads, %lu variants, %lu taken by the fast path (%lu with escapes)\n", p.n, t.tried, t.accepted,
                t.escaped);
  assert_true(t.accepted > 1000);
  assert_true(t.escaped > 100);
  free_payloads(&p);
}

/* ---- acceptance: plain token frames of both dialects ---- */

/* Per cJSON: one choice with text, nothing else a caller acts on. */
static int is_token_frame(const char *data, size_t len) {
  mz_frame f;
  mz_choice c;
  int yes = mz_frame_decode(&f, data, len, NULL, 0) == 0 && !f.done && f.nchoices == 1 && !f.unknown && !f.usage &&
            !f.timings && !f.stats && !f.progress && !f.error && mz_frame_choice(&f, 0, &c) == 0 && !c.role &&
            !c.tool_calls && !c.finish_reason && (c.content_len || c.reasoning_len);
  mz_frame_free(&f);
  return yes;
}

static void takes_tokens_of(const char *name, int min_tokens) {
  payloads p = {0};
  tally t = {0};
  int tokens = 0;
  load_file(fixture_dir(1), name, &p);
  for (int i = 0; i < p.n; i++) {
    if (!is_token_frame(p.data[i], p.len[i])) continue;
    tokens++;
    if (!check(p.data[i], p.len[i], &t)) fail_msg("%s: token frame not taken: %s", name, p.data[i]);
  }
  if (tokens < min_tokens) fail_msg("%s: only %d token frames", name, tokens);
  free_payloads(&p);
}

static void test_takes_token_frames(void **state) {
  (void)state;
  takes_tokens_of("mtplx.reconstructed.thinking_stream.sse", 5);
  takes_tokens_of("llama-server.reasoning_grammar_stream.sse", 5);
  takes_tokens_of("llama-server.chat_stream_usage.sse", 3);
  takes_tokens_of("llama-server.chat_stream_no_usage.sse", 2);
}

/* ---- unit cases ---- */

static int fast(const char *s, mz_fast *out) { return mz_fast_frame(s, strlen(s), out); }

static void test_fast_accepts(void **state) {
  mz_fast f;
  (void)state;
  assert_int_equal(fast("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}", &f), 1);
  assert_int_equal(f.index, 0);
  assert_int_equal(f.content.len, 2);
  assert_memory_equal(f.content.p, "hi", 2);
  assert_false(f.content.esc);
  assert_null(f.reasoning.p);
  assert_int_equal(fast(" {\n \"id\" : \"x\", \"created\":-1.25E-3 ,\"choices\" : [ { \"delta\" : "
                        "{ \"reasoning\" : \"a\\nb\" , \"content\" : null } , \"index\" : 7 , "
                        "\"logprobs\":null } ] }\r\n",
                        &f),
                   1);
  assert_int_equal(f.index, 7);
  assert_null(f.content.p);
  assert_int_equal(f.reasoning.len, 4);
  assert_true(f.reasoning.esc);
  /* reasoning_content wins over reasoning unless empty */
  assert_int_equal(fast("{\"choices\":[{\"delta\":{\"reasoning\":\"r\",\"reasoning_content\":\"rc\"}}]}", &f), 1);
  assert_int_equal(f.reasoning.len, 2);
  assert_int_equal(fast("{\"choices\":[{\"delta\":{\"reasoning\":\"r\",\"reasoning_content\":\"\"}}]}", &f), 1);
  assert_int_equal(f.reasoning.len, 1);
  assert_int_equal(fast("{\"choices\":[{\"delta\":{\"reasoning\":\"\",\"reasoning_content\":null}}]}", &f), 1);
  assert_null(f.reasoning.p);
  assert_int_equal(fast("{\"choices\":[{\"delta\":{}}]}", &f), 1);
  assert_int_equal(fast("{\"choices\":[{\"delta\":{\"content\":\"a\"} ,\t\"index\":3}],\"id\":\"x\" }", &f), 1);
  assert_int_equal(f.index, 3);
  assert_int_equal(f.content.len, 1);
  assert_int_equal(fast("{\"choices\":[{\"delta\":{\"content\":\"\\ud83d\\ude00\"}}]}", &f), 1);
  /* a NUL character is text like any other (issue 8: it was cut) */
  char out[8];
  assert_int_equal(fast("{\"choices\":[{\"delta\":{\"content\":\"a\\u0000b\"}}]}", &f), 1);
  assert_true(f.content.esc);
  assert_int_equal(mz_json_unescape(f.content.p, f.content.len, out), 3);
  assert_memory_equal(out, "a\0b", 3);
}

static void test_fast_refuses(void **state) {
  static const char *const no[] = {
      "",
      "[DONE]",
      "null",
      "[]",
      "{}",
      "{\"id\":\"x\"}",
      "{\"choices\":[]}",
      "{\"choices\":{}}",
      "{\"choices\":[{}, {}]}",
      "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"timings\":{}}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"error\":null}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\",\"content\":\"b\"}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"choices\":[{\"delta\":{}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}x",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"}}]",
      "{\"choices\":[{\"delta\":{\"content\":\"\\ud800\"}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"\\udc00\"}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\tb\"}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"\\q\"}}]}",
      "{\"choices\":[{\"delta\":{\"content\":1}}]}",
      "{\"choices\":[{\"delta\":{\"con\\u0074ent\":\"a\"}}]}",
      "{\"choices\":[{\"index\":1.0,\"delta\":{}}]}",
      "{\"choices\":[{\"index\":-1,\"delta\":{}}]}",
      "{\"choices\":[{\"index\":01,\"delta\":{}}]}",
      "{\"choices\":[{\"index\":\"0\",\"delta\":{}}]}",
      "{\"choices\":[{\"delta\":null}]}",
      "{\"created\":01,\"choices\":[{\"delta\":{}}]}",
      "{\"created\":1.,\"choices\":[{\"delta\":{}}]}",
      "{\"created\":+1,\"choices\":[{\"delta\":{}}]}",
      "{\"created\":tru,\"choices\":[{\"delta\":{}}]}",
      "{\"created\":[1,],\"choices\":[{\"delta\":{}}]}",
      "{\"created\":{\"a\"},\"choices\":[{\"delta\":{}}]}",
      "{\"choices\":[{\"delta\":{}},]}",
      "{\"choices\":[{\"delta\":{}}],}",
      "\xef\xbb\xbf{\"choices\":[{}]}",
      "\x01{\"choices\":[{}]}",
      /* near misses of the keys, which are matched as raw bytes */
      "{\"choices\":[{\"delta\":{xcontent\":\"a\"}}]}",
      "{\"choices\":[{\"delta\":{\"contenT\":\"a\"}}]}",
      "{\"choices\":[{\"delta\":{\"contents\":\"a\"}}]}",
      "{\"choices\":[{\"delta\":{\"reasoning_contenx\":\"a\"}}]}",
      "{\"i\":1,\"choices\":[{}]}",
      "{\"ids\":1,\"choices\":[{}]}",
      "{\"choices\":[{\"delta\":{\"content\"",
      "{\"choices\":[{\"delta\":{}, \"index\":0,\"index\":0}]}",
      "{\"choices\":[{\"delta\":{},\"x\":0}]}",
      /* logprobs asked for: cJSON keeps them for done (issue 36: they were dropped here) */
      "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-0.1}]}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"logprobs\":{}}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"logprobs\":[]}]}",
      "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"logprobs\":nul}]}",
  };
  mz_fast f;
  (void)state;
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    if (fast(no[i], &f)) fail_msg("accepted: %s", no[i]);
  assert_int_equal(mz_fast_frame(NULL, 0, &f), 0);
}

/* Limits: numbers of 63 bytes pass, 64 do not; nesting 32 passes. */
static void test_fast_limits(void **state) {
  char b[512], num[80], deep[80];
  mz_fast f;
  (void)state;
  memset(num, '1', 64), num[64] = '\0';
  snprintf(b, sizeof b, "{\"created\":%s,\"choices\":[{}]}", num);
  assert_int_equal(fast(b, &f), 0);
  num[63] = '\0';
  snprintf(b, sizeof b, "{\"created\":%s,\"choices\":[{}]}", num);
  assert_int_equal(fast(b, &f), 1);
  memset(deep, '[', 31), memset(deep + 31, ']', 31), deep[62] = '\0';
  snprintf(b, sizeof b, "{\"model\":%s,\"choices\":[{}]}", deep);
  assert_int_equal(fast(b, &f), 1);
  memset(deep, '[', 32), memset(deep + 32, ']', 32), deep[64] = '\0';
  snprintf(b, sizeof b, "{\"model\":%s,\"choices\":[{}]}", deep);
  assert_int_equal(fast(b, &f), 0);
  assert_int_equal(fast("{\"choices\":[{\"index\":999999,\"delta\":{}}]}", &f), 1);
  assert_int_equal(f.index, 999999);
  assert_int_equal(fast("{\"choices\":[{\"index\":1000000,\"delta\":{}}]}", &f), 0);
}

static void unesc(const char *in, const char *want, size_t want_len) {
  char out[64];
  size_t n = mz_json_unescape(in, strlen(in), out);
  assert_true(n <= strlen(in));
  if (n != want_len || memcmp(out, want, n) != 0) fail_msg("unescape %s: got %zu bytes", in, n);
}
#define UNESC(in, want) unesc((in), (want), sizeof(want) - 1)

static void test_unescape(void **state) {
  (void)state;
  UNESC("", "");
  UNESC("plain", "plain");
  UNESC("a\\\"b\\\\c\\/d", "a\"b\\c/d");
  UNESC("\\b\\f\\n\\r\\t", "\b\f\n\r\t");
  UNESC("\\u0041\\u00e9\\u00E9", "A\xc3\xa9\xc3\xa9");
  UNESC("\\u20ac\\uffff", "\xe2\x82\xac\xef\xbf\xbf");
  UNESC("\\ud83d\\ude00!", "\xf0\x9f\x98\x80!");
  UNESC("\\udbff\\udfff", "\xf4\x8f\xbf\xbf");
  UNESC("\\ud800", "\xef\xbf\xbd");
  UNESC("\\udc00x", "\xef\xbf\xbdx");
  UNESC("\\ud800\\u0041", "\xef\xbf\xbd"
                          "A");
  UNESC("\\ud800\\ud800\\udc00", "\xef\xbf\xbd\xf0\x90\x80\x80");
  UNESC("\\u0000", "\0");
  UNESC("caf\xc3\xa9", "caf\xc3\xa9");
  /* malformed: the backslash is kept, the rest copied */
  UNESC("\\x", "\\x");
  UNESC("\\u12", "\\u12");
  UNESC("\\u12g4", "\\u12g4");
  UNESC("end\\", "end\\");
}

/* For valid strings the result is byte for byte cJSON's. */
static void test_unescape_matches_cjson(void **state) {
  static const char *const bodies[] = {
      "hello",
      "\\n\\t\\r\\b\\f",
      "\\\"\\\\\\/",
      "\\u00e9t\\u00E9",
      "\\u0001\\u001f\\u007f\\u0080\\u07ff\\u0800",
      "\\ud83d\\ude00\\ud83c\\udf89",
      "\\uD83D\\uDE00",
      "\\uffff\\ue000\\ud7ff",
      "mix \\u4e2d\\u6587 and \\\"q\\\"",
      "\xe4\xb8\xad\xe6\x96\x87 raw",
      "\\/\\/\\/",
  };
  (void)state;
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    char json[256], out[256];
    snprintf(json, sizeof json, "\"%s\"", bodies[i]);
    cJSON *v = cJSON_Parse(json);
    assert_true(cJSON_IsString(v));
    size_t n = mz_json_unescape(bodies[i], strlen(bodies[i]), out);
    assert_int_equal(n, strlen(v->valuestring));
    assert_memory_equal(out, v->valuestring, n);
    cJSON_Delete(v);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fast_accepts),
      cmocka_unit_test(test_fast_refuses),
      cmocka_unit_test(test_fast_limits),
      cmocka_unit_test(test_unescape),
      cmocka_unit_test(test_unescape_matches_cjson),
      cmocka_unit_test(test_takes_token_frames),
      cmocka_unit_test(test_differential),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
