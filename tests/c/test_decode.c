/*
 * test_decode.c - behaviour of the frame decoder (src/decode.h).
 *
 * Frames come from the real captures (tests/fixtures/traces, cut into
 * events by the SSE parser) and from the hand-written fixtures, so every
 * frame kind of both dialects is decoded as a server actually sends it:
 * role, reasoning, content, finish with timings, usage-only, heartbeat and
 * progress, the final MTPLX frame, and both shapes of mid-stream error.
 * Then the edges: [DONE], malformed and non-object JSON, unknown keys,
 * nulls, HTTP error bodies (JSON and not), and mz_utf8_complete at every
 * split of every sequence length.
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
#include "sse.h"

/* ---- fixtures ---- */

/* The data payloads of a recorded stream, in order. */
typedef struct {
  char *data[64];
  size_t len[64];
  int n;
} events;

static int collect(void *ud, const mz_sse_event *ev) {
  events *e = ud;
  assert_true(e->n < 64);
  e->data[e->n] = malloc(ev->data_len + 1);
  memcpy(e->data[e->n], ev->data, ev->data_len + 1);
  e->len[e->n++] = ev->data_len;
  return 0;
}

static void load_events(int traces, const char *name, events *e) {
  size_t len;
  char *buf = fixture_read(traces, name, &len);
  mz_sse p;
  memset(e, 0, sizeof *e);
  mz_sse_init(&p, 0, collect, e);
  assert_int_equal(mz_sse_feed(&p, buf, len), MZ_SSE_OK);
  mz_sse_finish(&p);
  mz_sse_free(&p);
  free(buf);
}

static void free_events(events *e) {
  int i;
  for (i = 0; i < e->n; i++) free(e->data[i]);
  e->n = 0;
}

/* Decode event i of a stream, asserting it is a JSON object frame. */
static void decode_ok(const events *e, int i, mz_frame *f) {
  char err[128];
  assert_true(i < e->n);
  if (mz_frame_decode(f, e->data[i], e->len[i], err, sizeof err) != 0) fail_msg("event %d: %s", i, err);
  assert_false(f->done);
  assert_non_null(f->root);
}

static void decode_str(const char *s, mz_frame *f) {
  char err[128];
  if (mz_frame_decode(f, s, strlen(s), err, sizeof err) != 0) fail_msg("%s: %s", s, err);
}

static double num(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

/* Body and status of a recorded HTTP response (headers, CRLF CRLF, body). */
static char *http_body(const char *name, long *status, size_t *len) {
  size_t n;
  char *raw = fixture_read(1, name, &n), *body = strstr(raw, "\r\n\r\n"), *out;
  assert_non_null(body);
  assert_int_equal(sscanf(raw, "HTTP/1.1 %ld", status), 1);
  body += 4;
  *len = n - (size_t)(body - raw);
  out = malloc(*len + 1);
  memcpy(out, body, *len + 1);
  free(raw);
  return out;
}

/* ---- frames ---- */

static void test_done(void **state) {
  static const char *ok[] = {"[DONE]", "  [DONE]", "[DONE]\n", "\t [DONE] \r\n"};
  static const char *bad[] = {"[DONE]x", "[done]", "[DONE", ""};
  mz_frame f;
  char err[64];
  size_t i;
  (void)state;
  for (i = 0; i < 4; i++) {
    assert_int_equal(mz_frame_decode(&f, ok[i], strlen(ok[i]), err, sizeof err), 0);
    assert_true(f.done);
    assert_null(f.root);
    assert_null(f.choices);
    mz_frame_free(&f);
  }
  for (i = 0; i < 4; i++) {
    assert_int_equal(mz_frame_decode(&f, bad[i], strlen(bad[i]), err, sizeof err), -1);
    assert_false(f.done);
    assert_true(strlen(err) > 0);
    mz_frame_free(&f);
  }
  /* not NUL-terminated: only len bytes count */
  assert_int_equal(mz_frame_decode(&f, "[DONE]garbage", 6, NULL, 0), 0);
  assert_true(f.done);
  mz_frame_free(&f);
}

static void test_role_frames(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(1, "mtplx.reconstructed.thinking_stream.sse", &e);
  decode_ok(&e, 0, &f);
  assert_int_equal(f.nchoices, 1);
  assert_int_equal(f.unknown, 0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.index, 0);
  assert_string_equal(c.role, "assistant");
  assert_null(c.content);
  assert_null(c.reasoning);
  assert_null(c.finish_reason);
  assert_null(c.tool_calls);
  assert_null(c.message);
  assert_null(f.usage);
  assert_null(f.error);
  mz_frame_free(&f);
  free_events(&e);
  /* llama.cpp sends "content": null with the role */
  load_events(1, "llama-server.chat_stream_usage.sse", &e);
  decode_ok(&e, 0, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.role, "assistant");
  assert_null(c.content);
  assert_int_equal(c.content_len, 0);
  assert_int_equal(f.unknown, 0);
  mz_frame_free(&f);
  free_events(&e);
}

static void test_reasoning_frames(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(1, "llama-server.reasoning_grammar_stream.sse", &e);
  decode_ok(&e, 1, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.reasoning, "ultz");
  assert_int_equal(c.reasoning_len, 4);
  assert_null(c.content);
  assert_null(c.role);
  mz_frame_free(&f);
  free_events(&e);
  load_events(1, "mtplx.reconstructed.thinking_stream.sse", &e);
  decode_ok(&e, 5, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.reasoning, "la m\xC3\xA9t\xC3\xA9o ");
  assert_int_equal(c.reasoning_len, strlen("la m\xC3\xA9t\xC3\xA9o "));
  mz_frame_free(&f);
  free_events(&e);
  /* vLLM/Ollama name it "reasoning"; an empty reasoning_content falls back */
  decode_str("{\"choices\":[{\"delta\":{\"reasoning\":\"hmm\"}}]}", &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.reasoning, "hmm");
  assert_int_equal(c.reasoning_len, 3);
  mz_frame_free(&f);
  decode_str("{\"choices\":[{\"delta\":{\"reasoning_content\":\"\",\"reasoning\":\"r\"}}]}", &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.reasoning, "r");
  mz_frame_free(&f);
  decode_str("{\"choices\":[{\"delta\":{\"reasoning_content\":null,\"content\":\"\"}}]}", &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_null(c.reasoning);
  assert_int_equal(c.reasoning_len, 0);
  assert_non_null(c.content); /* "" is present, unlike null */
  assert_int_equal(c.content_len, 0);
  mz_frame_free(&f);
}

static void test_content_frames(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(1, "llama-server.chat_stream_usage.sse", &e);
  decode_ok(&e, 5, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.content, "\xE6\x8B\x9B\xE8\x82\xA1\xE4\xB9\xA6");
  assert_int_equal(c.content_len, 9);
  assert_null(c.finish_reason);
  mz_frame_free(&f);
  free_events(&e);
  load_events(1, "mtplx.reconstructed.thinking_stream.sse", &e);
  decode_ok(&e, 11, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.content, "beau \xC3\xA0 Lyon ");
  assert_null(f.progress);
  mz_frame_free(&f);
  free_events(&e);
}

static void test_finish_with_timings(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(1, "llama-server.chat_stream_no_usage.sse", &e);
  assert_int_equal(e.n, 7);
  decode_ok(&e, 5, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.finish_reason, "length");
  assert_null(c.content);
  assert_null(c.role);
  assert_non_null(f.timings);
  assert_null(f.usage);
  assert_true(num(f.timings, "cache_n") == 10);
  assert_true(num(f.timings, "predicted_n") == 4);
  assert_int_equal(f.unknown, 0);
  mz_frame_free(&f);
  assert_int_equal(mz_frame_decode(&f, e.data[6], e.len[6], NULL, 0), 0);
  assert_true(f.done);
  mz_frame_free(&f);
  free_events(&e);
}

static void test_usage_only_frame(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(1, "llama-server.chat_stream_usage.sse", &e);
  decode_ok(&e, 10, &f);
  assert_non_null(f.choices);
  assert_int_equal(f.nchoices, 0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), -1);
  assert_non_null(f.usage);
  assert_non_null(f.timings);
  assert_true(num(f.usage, "completion_tokens") == 8);
  assert_true(num(cJSON_GetObjectItemCaseSensitive(f.usage, "prompt_tokens_details"), "cached_tokens") == 0);
  mz_frame_free(&f);
  free_events(&e);
  load_events(0, "usage_only.sse", &e);
  decode_ok(&e, 3, &f);
  assert_int_equal(f.nchoices, 0);
  assert_true(num(f.timings, "cache_n") == 8);
  mz_frame_free(&f);
  free_events(&e);
}

static void test_mtplx_heartbeat_and_progress(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(1, "mtplx.reconstructed.thinking_stream.sse", &e);
  decode_ok(&e, 1, &f);
  assert_true(f.heartbeat);
  assert_non_null(f.progress);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_null(c.content);
  assert_null(c.reasoning);
  assert_null(c.finish_reason);
  assert_int_equal(f.unknown, 0);
  mz_frame_free(&f);
  decode_ok(&e, 2, &f); /* progress: not a heartbeat, decode_tok_s null */
  assert_false(f.heartbeat);
  assert_non_null(f.progress);
  assert_true(num(f.progress, "completion_tokens") == 1);
  assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(f.progress, "decode_tok_s")));
  mz_frame_free(&f);
  free_events(&e);
  load_events(0, "heartbeat.sse", &e);
  decode_ok(&e, 4, &f);
  assert_true(f.heartbeat);
  mz_frame_free(&f);
  free_events(&e);
  /* heartbeat must be exactly true */
  decode_str("{\"choices\":[],\"mtplx_progress\":{\"heartbeat\":1}}", &f);
  assert_false(f.heartbeat);
  mz_frame_free(&f);
}

static void test_mtplx_final_frame(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  const cJSON *hit;
  (void)state;
  load_events(1, "mtplx.reconstructed.thinking_stream.sse", &e);
  decode_ok(&e, e.n - 2, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.finish_reason, "stop");
  assert_non_null(f.usage);
  assert_non_null(f.stats);
  assert_null(f.timings);
  assert_null(f.progress);
  assert_true(num(cJSON_GetObjectItemCaseSensitive(f.usage, "prompt_tokens_details"), "cached_tokens") == 2048);
  assert_true(num(f.stats, "reasoning_tokens") == 30);
  hit = cJSON_GetObjectItemCaseSensitive(f.stats, "session_cache_hit");
  assert_true(cJSON_IsTrue(hit));
  assert_int_equal(f.unknown, 0);
  mz_frame_free(&f);
  free_events(&e);
}

static void test_midstream_error_mtplx(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  const char *type;
  char code[32];
  (void)state;
  load_events(1, "mtplx.reconstructed.midstream_error.sse", &e);
  decode_ok(&e, 2, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.finish_reason, "error");
  assert_non_null(f.error);
  assert_string_equal(mz_error_message(f.error, &type, code, sizeof code),
                      "model owner made no progress for 300s; request aborted by the stream stall "
                      "watchdog (MTPLX_STREAM_STALL_DEADLINE_S)");
  assert_string_equal(type, "server_error");
  assert_string_equal(code, "TimeoutError");
  mz_frame_free(&f);
  free_events(&e);
}

static void test_midstream_error_llama(void **state) {
  events e;
  mz_frame f;
  const char *type;
  char code[32];
  (void)state;
  load_events(0, "llama_midstream_error.sse", &e);
  decode_ok(&e, e.n - 1, &f);
  assert_null(f.choices);
  assert_int_equal(f.nchoices, 0);
  assert_non_null(f.error);
  assert_string_equal(mz_error_message(f.error, &type, code, sizeof code), "Failed to decode the batch");
  assert_string_equal(type, "server_error");
  assert_string_equal(code, "500");
  mz_frame_free(&f);
  free_events(&e);
}

static void test_error_shapes(void **state) {
  mz_frame f;
  const char *type = "x";
  char code[8];
  cJSON *n;
  (void)state;
  decode_str("{\"error\":\"boom\"}", &f);
  assert_string_equal(mz_error_message(f.error, &type, code, sizeof code), "boom");
  assert_null(type);
  assert_string_equal(code, "");
  mz_frame_free(&f);
  decode_str("{\"error\":null,\"usage\":null,\"timings\":null,\"mtplx_stats\":null,"
             "\"mtplx_progress\":null,\"choices\":null}",
             &f);
  assert_null(f.error);
  assert_null(f.usage);
  assert_null(f.timings);
  assert_null(f.stats);
  assert_null(f.progress);
  assert_null(f.choices);
  assert_int_equal(f.unknown, 0);
  mz_frame_free(&f);
  /* numeric codes, a code too long for the buffer, no message */
  decode_str("{\"error\":{\"code\":1.5,\"type\":7}}", &f);
  assert_null(mz_error_message(f.error, &type, code, sizeof code));
  assert_null(type);
  assert_string_equal(code, "1.5");
  mz_frame_free(&f);
  decode_str("{\"error\":{\"message\":\"m\",\"code\":\"VeryLongCodeName\"}}", &f);
  assert_string_equal(mz_error_message(f.error, NULL, code, sizeof code), "m");
  assert_string_equal(code, "VeryLon");
  assert_string_equal(mz_error_message(f.error, NULL, NULL, 0), "m");
  mz_frame_free(&f);
  assert_null(mz_error_message(NULL, &type, code, sizeof code));
  n = cJSON_CreateNumber(3);
  assert_null(mz_error_message(n, NULL, NULL, 0));
  cJSON_Delete(n);
}

static void test_malformed(void **state) {
  events e;
  mz_frame f;
  char err[128];
  (void)state;
  load_events(0, "malformed_json.sse", &e);
  assert_int_equal(mz_frame_decode(&f, e.data[2], e.len[2], err, sizeof err), -1);
  assert_non_null(strstr(err, "malformed JSON"));
  assert_null(f.choices);
  mz_frame_free(&f);
  assert_int_equal(mz_frame_decode(&f, e.data[3], e.len[3], err, sizeof err), -1);
  assert_non_null(strstr(err, "not an object"));
  mz_frame_free(&f);
  assert_int_equal(mz_frame_decode(&f, e.data[4], e.len[4], err, sizeof err), -1);
  assert_non_null(strstr(err, "not an object"));
  mz_frame_free(&f);
  decode_ok(&e, 5, &f); /* the stream carries on after a bad frame */
  mz_frame_free(&f);
  free_events(&e);
  assert_int_equal(mz_frame_decode(&f, "{\"a\":1} trailing", 16, err, sizeof err), -1);
  assert_string_equal(err, "malformed JSON in SSE data at byte 8"); /* one value only */
  mz_frame_free(&f);
  assert_int_equal(mz_frame_decode(&f, "{\"a\":1}{\"b\":2}", 14, err, sizeof err), -1);
  mz_frame_free(&f);
  assert_int_equal(mz_frame_decode(&f, " {\"a\":1}\r\n", 10, err, sizeof err), 0);
  mz_frame_free(&f);
  assert_int_equal(mz_frame_decode(&f, "null", 4, err, sizeof err), -1);
  mz_frame_free(&f);
  /* the length is honoured: a valid object cut short is malformed */
  assert_int_equal(mz_frame_decode(&f, "{\"a\":1}", 5, err, 8), -1);
  assert_true(strlen(err) < 8);
  mz_frame_free(&f);
  mz_frame_free(&f); /* idempotent */
}

/* Every prefix of every recorded frame either decodes or fails with a
 * message; none crashes or leaks (the sanitizer runs see to that). */
static void test_every_prefix(void **state) {
  static const char *streams[] = {"llama-server.chat_stream_usage.sse", "mtplx.reconstructed.thinking_stream.sse",
                                  "mtplx.reconstructed.midstream_error.sse"};
  events e;
  mz_frame f;
  mz_choice c;
  char err[96];
  size_t s, n;
  int i, k;
  (void)state;
  for (s = 0; s < 3; s++) {
    load_events(1, streams[s], &e);
    for (i = 0; i < e.n; i++) {
      for (n = 0; n <= e.len[i]; n++) {
        char *copy = malloc(n ? n : 1); /* exactly n bytes: overreads are caught */
        memcpy(copy, e.data[i], n);
        err[0] = 'x';
        if (mz_frame_decode(&f, copy, n, err, sizeof err) == 0) {
          assert_int_equal(n, e.len[i]); /* no proper prefix of a frame is JSON */
          for (k = 0; k < f.nchoices; k++) mz_frame_choice(&f, k, &c);
        } else {
          assert_true(strlen(err) > 0 && err[0] != 'x');
        }
        mz_frame_free(&f);
        free(copy);
      }
    }
    free_events(&e);
  }
}

static void test_unknown_keys(void **state) {
  static const char *streams[] = {"llama-server.chat_stream_usage.sse", "llama-server.chat_stream_no_usage.sse",
                                  "llama-server.reasoning_grammar_stream.sse",
                                  "mtplx.reconstructed.thinking_stream.sse", "mtplx.reconstructed.midstream_error.sse"};
  events e;
  mz_frame f;
  size_t s;
  int i;
  (void)state;
  for (s = 0; s < 5; s++) { /* every key the servers send today is known */
    load_events(1, streams[s], &e);
    for (i = 0; i < e.n; i++) {
      assert_int_equal(mz_frame_decode(&f, e.data[i], e.len[i], NULL, 0), 0);
      assert_int_equal(f.unknown, 0);
      mz_frame_free(&f);
    }
    free_events(&e);
  }
  decode_str("{\"id\":\"x\",\"service_tier\":\"a\",\"choices\":[],\"prompt_filter_results\":[],"
             "\"c\":1,\"\":2,\"usage\":{}}",
             &f);
  assert_int_equal(f.unknown, 4);
  assert_non_null(f.usage);
  mz_frame_free(&f);
}

static void test_tool_calls(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  const cJSON *fn;
  (void)state;
  load_events(0, "tool_calls.sse", &e);
  decode_ok(&e, 1, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_non_null(c.tool_calls);
  assert_int_equal(cJSON_GetArraySize(c.tool_calls), 1);
  fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(c.tool_calls, 0), "function");
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, "get_weather");
  assert_null(c.content);
  mz_frame_free(&f);
  decode_ok(&e, e.n - 2, &f);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_string_equal(c.finish_reason, "tool_calls");
  assert_null(c.tool_calls);
  mz_frame_free(&f);
  free_events(&e);
  decode_str("{\"choices\":[{\"delta\":{\"tool_calls\":{}}}]}", &f); /* not an array */
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_null(c.tool_calls);
  mz_frame_free(&f);
}

static void test_n2_choices(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  (void)state;
  load_events(0, "n2_choices.sse", &e);
  decode_ok(&e, 3, &f);
  assert_int_equal(f.nchoices, 1);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.index, 1);
  assert_string_equal(c.content, "Bon");
  assert_int_equal(mz_frame_choice(&f, 1, &c), -1);
  assert_int_equal(mz_frame_choice(&f, -1, &c), -1);
  mz_frame_free(&f);
  free_events(&e);
  /* two choices in one frame; index defaults to the position */
  decode_str("{\"choices\":[{\"delta\":{\"content\":\"a\"}},{\"index\":1,\"delta\":{\"content\":\"b\"}},"
             "7,{\"delta\":null,\"finish_reason\":\"stop\"}]}",
             &f);
  assert_int_equal(f.nchoices, 4);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.index, 0);
  assert_string_equal(c.content, "a");
  assert_int_equal(mz_frame_choice(&f, 1, &c), 0);
  assert_int_equal(c.index, 1);
  assert_string_equal(c.content, "b");
  assert_int_equal(mz_frame_choice(&f, 2, &c), -1); /* not an object */
  assert_int_equal(mz_frame_choice(&f, 3, &c), 0);
  assert_int_equal(c.index, 3);
  assert_string_equal(c.finish_reason, "stop");
  assert_null(c.content);
  mz_frame_free(&f);
}

static void test_nonstream_message(void **state) {
  long status;
  size_t len;
  char *body = http_body("llama-server.chat_nonstream.txt", &status, &len);
  mz_frame f;
  mz_choice c;
  char err[64];
  (void)state;
  assert_int_equal(status, 200);
  assert_int_equal(mz_frame_decode(&f, body, len, err, sizeof err), 0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_non_null(c.message);
  assert_string_equal(c.role, "assistant");
  assert_true(c.content_len > 10 && strncmp(c.content, "Programmer", 10) == 0);
  assert_string_equal(c.finish_reason, "length");
  assert_non_null(f.usage);
  assert_non_null(f.timings);
  assert_int_equal(f.unknown, 0);
  mz_frame_free(&f);
  free(body);
}

/* The caller may keep a subtree past mz_frame_free. */
static void test_detach(void **state) {
  mz_frame f;
  cJSON *usage;
  (void)state;
  decode_str("{\"choices\":[],\"usage\":{\"total_tokens\":5}}", &f);
  usage = cJSON_DetachItemViaPointer(f.root, (cJSON *)f.usage);
  mz_frame_free(&f);
  assert_true(num(usage, "total_tokens") == 5);
  cJSON_Delete(usage);
}

/* ---- HTTP error bodies ---- */

static void check_http(const char *name, long want_status, const char *want) {
  long status;
  size_t len;
  char *body = http_body(name, &status, &len), out[512];
  assert_int_equal(status, want_status);
  assert_ptr_equal(mz_http_error_message(status, body, len, out, sizeof out), out);
  assert_string_equal(out, want);
  free(body);
}

/* "\u0000" in a delta: the whole text, NUL included, on the cJSON path
 * too (issue 8: cJSON's strings ended at the NUL). */
static void test_nul_in_delta(void **state) {
  mz_frame f;
  mz_choice c;
  (void)state;
  static const char frame[] = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\u0000b\\u0000\","
                              "\"reasoning_content\":\"\\u0000r\"},\"finish_reason\":\"stop\"}]}";
  assert_int_equal(mz_frame_decode(&f, frame, sizeof frame - 1, NULL, 0), 0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.content_len, 4);
  assert_memory_equal(c.content, "a\0b\0", 4);
  assert_int_equal(c.reasoning_len, 2);
  assert_memory_equal(c.reasoning, "\0r", 2);
  assert_string_equal(c.finish_reason, "stop");
  mz_frame_free(&f);
  /* control characters already in use are not taken as the stand-in */
  static const char busy[] = "{\"choices\":[{\"delta\":{\"content\":\"\\u0001\\u0000\\u0002\\\\u0000\"}}]}";
  assert_int_equal(mz_frame_decode(&f, busy, sizeof busy - 1, NULL, 0), 0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.content_len, 9);
  assert_memory_equal(c.content, "\x01\0\x02\\u0000", 9);
  mz_frame_free(&f);
}

/* One repair against its expected output and count. */
static void repaired(const char *in, size_t len, const char *want, size_t want_bad) {
  char out[256];
  size_t bad = 0, n = mz_utf8_repair(in, len, out, &bad);
  if (n != strlen(want) || memcmp(out, want, n) != 0 || bad != want_bad)
    fail_msg("repair of %zu bytes: got %zu bytes, %zu bad", len, n, bad);
  assert_int_equal(mz_utf8_valid(out, n), n);
}
#define REPAIRED(in, want, nbad) repaired(in, sizeof(in) - 1, want, nbad)
#define FFFD "\xEF\xBF\xBD"

/* The WHATWG decoder's "maximal subpart" rule, with the examples of the
 * Unicode Standard (table 3-8) and the classic ill-formed shapes. */
static void test_utf8_repair(void **state) {
  (void)state;
  REPAIRED("a\xF1\x80\x80\xE1\x80\xC2"
           "b\x80"
           "c\x80\xBF"
           "d",
           "a" FFFD FFFD FFFD "b" FFFD "c" FFFD FFFD "d", 6);
  REPAIRED("\xED\xA0\x80", FFFD FFFD FFFD, 3);          /* surrogate */
  REPAIRED("\xC0\xAF", FFFD FFFD, 2);                   /* overlong */
  REPAIRED("\xE0\x80\x80", FFFD FFFD FFFD, 3);          /* overlong */
  REPAIRED("\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD, 4); /* past U+10FFFF */
  REPAIRED("\xF0\x9F\x98"
           "x",
           FFFD "x", 1);             /* truncated 4-byte */
  REPAIRED("\xF0\x9F\x98", FFFD, 1); /* cut by the end */
  REPAIRED("\xFF\xFE", FFFD FFFD, 2);
  REPAIRED("A\xFF"
           "B\xE2\x82"
           "C\xF0\x9F\x98\x80"
           "D",
           "A" FFFD "B" FFFD "C\xF0\x9F\x98\x80"
           "D",
           2);
  REPAIRED("plain ascii, \xC3\xA9t\xC3\xA9 \xE2\x82\xAC", "plain ascii, \xC3\xA9t\xC3\xA9 \xE2\x82\xAC", 0);
  /* the valid prefix stops at the first ill-formed byte, past runs of ASCII */
  assert_int_equal(mz_utf8_valid("0123456789abcdef\xFFxyz", 20), 16);
  assert_int_equal(mz_utf8_valid("\xC3\xA9\xC3", 3), 2);
  assert_int_equal(mz_utf8_valid("", 0), 0);
}

static void test_http_error_json(void **state) {
  char out[256];
  (void)state;
  check_http(
      "llama-server.err_ctx_exceeded_stream.txt", 400,
      "HTTP 400 Bad Request: request (298 tokens) exceeds the available context size (256 tokens), try increasing it");
  check_http("llama-server.err_invalid_json.txt", 500,
             "HTTP 500 Internal Server Error: [json.exception.parse_error.101] parse error at line 1, column 44: "
             "syntax error while "
             "parsing array - unexpected end of input; expected ']'");
  check_http("llama-server.err_missing_messages_stream.txt", 400, "HTTP 400 Bad Request: 'messages' is required");
  check_http(
      "mtplx.reconstructed.err_context.txt", 400,
      "HTTP 400 Bad Request: Prompt contains 33000 tokens, but the served context window is 32768 tokens. The prompt "
      "must be shorter than the context window to leave room for at least one generated token.");
  /* the health endpoint while llama-server loads; a plain string error */
  mz_http_error_message(503, "{\"error\":{\"message\":\"Loading model\",\"type\":\"unavailable_error\",\"code\":503}}",
                        76, out, sizeof out);
  assert_string_equal(out, "HTTP 503 Service Unavailable: Loading model");
  mz_http_error_message(429, "{\"error\":\"slow down\"}\n", 22, out, sizeof out);
  assert_string_equal(out, "HTTP 429 Too Many Requests: slow down");
}

static void test_http_error_not_json(void **state) {
  char body[400], out[512], tiny[12];
  size_t i;
  (void)state;
  mz_http_error_message(404, "Not Found\n", 10, out, sizeof out);
  assert_string_equal(out, "HTTP 404 Not Found: Not Found");
  mz_http_error_message(503, "", 0, out, sizeof out);
  assert_string_equal(out, "HTTP 503 Service Unavailable");
  mz_http_error_message(502, " \r\n", 3, out, sizeof out);
  assert_string_equal(out, "HTTP 502 Bad Gateway");
  mz_http_error_message(500, NULL, 0, out, sizeof out);
  assert_string_equal(out, "HTTP 500 Internal Server Error");
  mz_http_error_message(599, "x", 1, out, sizeof out);
  assert_string_equal(out, "HTTP 599: x");
  mz_http_error_message(200, "{\"status\":\"ok\"}", 15, out, sizeof out);
  assert_string_equal(out, "HTTP 200: {\"status\":\"ok\"}");
  mz_http_error_message(404, "{\"detail\":\"Not Found\"}", 22, out, sizeof out);
  assert_string_equal(out, "HTTP 404 Not Found: Not Found");
  /* plain text: the first line with text, controls as spaces */
  mz_http_error_message(500, "\n\n  a\tb\x01\x7f\\c\r\nd", 14, out, sizeof out);
  assert_string_equal(out, "HTTP 500 Internal Server Error: a b \\c");
  /* a proxy's page: its title */
  static const char nginx[] = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n"
                              "<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n"
                              "<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";
  mz_http_error_message(503, nginx, sizeof nginx - 1, out, sizeof out);
  assert_string_equal(out, "HTTP 503 Service Unavailable: 503 Service Temporarily Unavailable");
  /* no title: the first line of text outside tags, entities decoded */
  static const char page[] = "<!DOCTYPE html>\n<html><head><style>p{color:red}</style>\n"
                             "<script>var a = '<b>';</script></head>\n<body>\n<p>Upstream &amp; <b>model</b> "
                             "&lt;down&gt;</p>\n<p>second</p></body></html>";
  mz_http_error_message(502, page, sizeof page - 1, out, sizeof out);
  assert_string_equal(out, "HTTP 502 Bad Gateway: Upstream & model <down>");
  mz_http_error_message(502, "<html><body>Bad Gateway</body></html>\n", 38, out, sizeof out);
  assert_string_equal(out, "HTTP 502 Bad Gateway: Bad Gateway");
  mz_http_error_message(502, "<html><title></title><unclosed", 30, out, sizeof out);
  assert_string_equal(out, "HTTP 502 Bad Gateway");
  /* a long line: cut near 200 bytes, "..." at the end */
  snprintf(body, sizeof body, "<html>\r\n<head><title>");
  for (i = strlen(body); i < sizeof body - 1; i++) body[i] = (char)('a' + i % 26);
  body[sizeof body - 1] = '\0';
  mz_http_error_message(502, body, strlen(body), out, sizeof out);
  assert_true(strncmp(out, "HTTP 502 Bad Gateway: ", 22) == 0);
  assert_string_equal(out + strlen(out) - 3, "...");
  assert_true(strlen(out) <= 22 + 200 + 3);
  /* the cut never splits a UTF-8 character */
  memset(body, 'a', 199);
  memcpy(body + 199, "\xC3\xA9tail", 7);
  mz_http_error_message(500, body, 206, out, sizeof out);
  assert_string_equal(out + strlen(out) - 4, "a...");
  assert_null(strchr(out, '\xC3'));
  /* a tiny output buffer: still terminated, still marked as cut */
  mz_http_error_message(500, "0123456789", 10, tiny, sizeof tiny);
  assert_int_equal(strlen(tiny), sizeof tiny - 1);
  mz_http_error_message(599, "0123456789", 10, out, 16);
  assert_string_equal(out, "HTTP 599: 01...");
  assert_null(mz_http_error_message(500, "x", 1, NULL, 0));
}

/* The error object a script gets as ev.error. */
static void test_http_error_object(void **state) {
  long status;
  size_t len;
  char *body = http_body("llama-server.err_ctx_exceeded_stream.txt", &status, &len);
  cJSON *e = mz_http_error_object(body, len);
  (void)state;
  assert_non_null(e);
  assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "exceed_context_size_error");
  assert_int_equal(cJSON_GetObjectItem(e, "n_ctx")->valueint, 256);
  assert_int_equal(cJSON_GetObjectItem(e, "n_prompt_tokens")->valueint, 298);
  assert_int_equal(cJSON_GetObjectItem(e, "code")->valueint, 400);
  cJSON_Delete(e);
  free(body);
  e = mz_http_error_object("{\"error\":\"slow down\"}", 22);
  assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, "slow down");
  cJSON_Delete(e);
  e = mz_http_error_object("{\"detail\":\"x\"}", 14);
  assert_string_equal(cJSON_GetObjectItem(e, "detail")->valuestring, "x");
  cJSON_Delete(e);
  assert_null(mz_http_error_object("<html>", 6));
  assert_null(mz_http_error_object("[1]", 3));
  assert_null(mz_http_error_object(NULL, 0));
}

/* ---- UTF-8 ---- */

static void test_utf8_complete_splits(void **state) {
  static const char *seqs[] = {"\xC3\xA9", "\xE2\x82\xAC", "\xED\x9F\xBF", "\xF0\x9F\x98\x80", "\xF4\x8F\xBF\xBF"};
  char buf[16];
  size_t s, k;
  (void)state;
  for (s = 0; s < 5; s++) {
    size_t n = strlen(seqs[s]);
    for (k = 1; k < n; k++) { /* "ab" + the first k bytes: hold the k back */
      memcpy(buf, "ab", 2);
      memcpy(buf + 2, seqs[s], k);
      assert_int_equal(mz_utf8_complete(buf, 2 + k), 2);
      assert_int_equal(mz_utf8_complete(buf + 2, k), 0);
    }
    memcpy(buf, "ab", 2);
    memcpy(buf + 2, seqs[s], n);
    assert_int_equal(mz_utf8_complete(buf, 2 + n), 2 + n);
    buf[2 + n] = 'z';
    assert_int_equal(mz_utf8_complete(buf, 3 + n), 3 + n);
  }
  assert_int_equal(mz_utf8_complete("", 0), 0);
  assert_int_equal(mz_utf8_complete("hello", 5), 5);
}

static void test_utf8_complete_invalid(void **state) {
  static const struct {
    const char *s;
    size_t want;
  } cases[] = {
      {"\x80", 1}, /* lone continuation */
      {"a\x80\x80\x80\x80", 5},
      {"a\xFF", 2}, /* never valid */
      {"a\xC0", 2}, /* overlong lead */
      {"a\xC1", 2},
      {"a\xF5", 2},         /* past U+10FFFF */
      {"a\xE0\x80", 3},     /* overlong 3-byte */
      {"a\xED\xA0", 3},     /* surrogate */
      {"a\xF0\x80", 3},     /* overlong 4-byte */
      {"a\xF4\x90", 3},     /* past U+10FFFF */
      {"a\xC3\xA9\xA9", 4}, /* an extra continuation */
      {"a\xE2\x82\xAC\x82", 5},
      {"a\xE0\xA0", 1}, /* valid prefixes are still held */
      {"a\xF0\x90\x80", 1},
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (mz_utf8_complete(cases[i].s, strlen(cases[i].s)) != cases[i].want)
      fail_msg("case %zu: got %zu, want %zu", i, mz_utf8_complete(cases[i].s, strlen(cases[i].s)), cases[i].want);
}

/* The use the helper is for: content frames whose characters are split
 * across frames come out whole when each channel holds back the tail. */
static void test_utf8_split_fixture(void **state) {
  events e;
  mz_frame f;
  mz_choice c;
  char text[256], held[4];
  size_t tn = 0, hn = 0;
  int i;
  (void)state;
  load_events(0, "utf8_split.sse", &e);
  for (i = 0; i < e.n; i++) {
    char piece[128];
    size_t pn, ok;
    assert_int_equal(mz_frame_decode(&f, e.data[i], e.len[i], NULL, 0), 0);
    if (!f.done && mz_frame_choice(&f, 0, &c) == 0 && c.content_len) {
      memcpy(piece, held, hn);
      memcpy(piece + hn, c.content, c.content_len);
      pn = hn + c.content_len;
      ok = mz_utf8_complete(piece, pn);
      assert_true(pn - ok <= 3);
      assert_int_equal(mz_utf8_complete(piece, ok), ok); /* what goes out is whole */
      memcpy(text + tn, piece, ok);
      tn += ok;
      hn = pn - ok;
      memcpy(held, piece + ok, hn);
    }
    mz_frame_free(&f);
  }
  assert_int_equal(hn, 0);
  text[tn] = '\0';
  assert_string_equal(text, "caf\xC3\xA9 co\xC3\xBBte 2\xE2\x82\xAC \xF0\x9F\x98\x80!\xE6\x97\xA5\xE6\x9C\xAC");
  free_events(&e);
}

/* What a frame says of the server (model, system_fingerprint, created)
 * and a choice's logprobs (issue 36: the batch record says what the
 * server said, logprobs kept); mistyped ones read as absent. */
static void test_server_fields_and_logprobs(void **state) {
  (void)state;
  static const char f1[] =
      "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"served-7b\","
      "\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"a\"},"
      "\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-0.5,\"bytes\":[97],\"top_logprobs\":[]}]},"
      "\"finish_reason\":null}]}";
  mz_frame f;
  mz_choice c;
  assert_int_equal(mz_frame_decode(&f, f1, strlen(f1), NULL, 0), 0);
  assert_int_equal(f.unknown, 0);
  assert_string_equal(f.model, "served-7b");
  assert_string_equal(f.fprint, "fp_1");
  assert_non_null(f.created);
  assert_true(f.created->valuedouble == 1700000000.0);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_int_equal(c.index, 1);
  assert_non_null(c.logprobs);
  const cJSON *lp = cJSON_GetArrayItem(cJSON_GetObjectItem(c.logprobs, "content"), 0);
  assert_string_equal(cJSON_GetObjectItem(lp, "token")->valuestring, "a");
  mz_frame_free(&f);
  static const char f2[] = "{\"created\":\"x\",\"model\":null,\"system_fingerprint\":3,"
                           "\"choices\":[{\"delta\":{\"content\":\"a\"},\"logprobs\":null}]}";
  assert_int_equal(mz_frame_decode(&f, f2, strlen(f2), NULL, 0), 0);
  assert_int_equal(f.unknown, 0);
  assert_null(f.model);
  assert_null(f.fprint);
  assert_null(f.created);
  assert_int_equal(mz_frame_choice(&f, 0, &c), 0);
  assert_null(c.logprobs);
  mz_frame_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_server_fields_and_logprobs),
      cmocka_unit_test(test_done),
      cmocka_unit_test(test_role_frames),
      cmocka_unit_test(test_reasoning_frames),
      cmocka_unit_test(test_content_frames),
      cmocka_unit_test(test_finish_with_timings),
      cmocka_unit_test(test_usage_only_frame),
      cmocka_unit_test(test_mtplx_heartbeat_and_progress),
      cmocka_unit_test(test_mtplx_final_frame),
      cmocka_unit_test(test_midstream_error_mtplx),
      cmocka_unit_test(test_midstream_error_llama),
      cmocka_unit_test(test_error_shapes),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_every_prefix),
      cmocka_unit_test(test_unknown_keys),
      cmocka_unit_test(test_tool_calls),
      cmocka_unit_test(test_n2_choices),
      cmocka_unit_test(test_nonstream_message),
      cmocka_unit_test(test_nul_in_delta),
      cmocka_unit_test(test_utf8_repair),
      cmocka_unit_test(test_http_error_object),
      cmocka_unit_test(test_detach),
      cmocka_unit_test(test_http_error_json),
      cmocka_unit_test(test_http_error_not_json),
      cmocka_unit_test(test_utf8_complete_splits),
      cmocka_unit_test(test_utf8_complete_invalid),
      cmocka_unit_test(test_utf8_split_fixture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
