/*
 * test_choices.c - what a stream's frames make of several choices (n > 1),
 * logprobs and the server's own fields (src/response.c over queue.c), on
 * a stream built by hand as test_queue.c builds one: frames go in through
 * mz_on_sse_event as the SSE parser hands them over, events come out as
 * mz_stream_next() pops them.
 *
 * Pinned (issue 36): interleaved choices come out as events of their own
 * index, never joined into one; every choice's finish reason and logprobs
 * (each frame's list appended in order) reach done.choices, in index
 * order; done says the model that answered, its system_fingerprint and
 * created, from the frames that carry them; a plain one-choice stream
 * without logprobs has no done.choices.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "decode.h"
#include "mirza.h"

static mz_stream *new_stream(mz_client *c, int merge) {
  mz_stream *s = calloc(1, sizeof *s);
  assert_non_null(s);
  s->c = c;
  s->merge = merge;
  s->retry_after = -1;
  return s;
}

static void free_stream(mz_stream *s) {
  mz_unmark_ready(s);
  mz_queue_free(s);
  mz_buf_free(&s->body);
  mz_buf_free(&s->headers);
  free(s);
}

/* One SSE data payload, as the parser dispatches it. */
static void frame(mz_stream *s, const char *data) {
  mz_sse_event e = {"message", 7, data, strlen(data), "", 0};
  mz_on_sse_event(s, &e);
}

static const mz_event *next(mz_stream *s) {
  mz_release_popped(s);
  if (s->term_popped || !mz_ready(s)) return NULL;
  return mz_pop(s);
}

static void expect_text(mz_stream *s, int index, const char *want) {
  const mz_event *e = next(s);
  assert_non_null(e);
  assert_int_equal(e->type, MZ_EV_TEXT);
  assert_int_equal(e->index, index);
  assert_int_equal(e->len, strlen(want));
  assert_memory_equal(e->text, want, e->len);
}

#define HEAD "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"served-7b\","
#define LP(tok, lp)                                                                                                    \
  "\"logprobs\":{\"content\":[{\"token\":\"" tok "\",\"logprob\":" lp ",\"bytes\":[],\"top_logprobs\":[]}]}"

/* vLLM's shape: a role frame per choice, then one choice per frame,
 * interleaved, logprobs on each token, a finish frame per choice, usage
 * in a frame of no choice. */
static void feed_n2(mz_stream *s) {
  frame(s, HEAD "\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}");
  frame(s, HEAD "\"choices\":[{\"index\":1,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                "\"finish_reason\":null}]}");
  frame(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}," LP("Hello", "-0.1") "}]}");
  frame(s, HEAD "\"choices\":[{\"index\":1,\"delta\":{\"content\":\"Bonjour\"}," LP("Bonjour", "-0.2") "}]}");
  frame(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}," LP(" there", "-0.3") "}]}");
  frame(s, HEAD "\"choices\":[{\"index\":1,\"delta\":{\"content\":\" toi.\"}," LP(" toi.", "-0.4") "}]}");
  frame(s, HEAD "\"choices\":[{\"index\":1,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}]}");
  frame(s, HEAD
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}," LP("!", "-0.5") ",\"finish_reason\":\"stop\"}]}");
  frame(s, HEAD "\"choices\":[],\"usage\":{\"completion_tokens\":5}}");
  frame(s, "[DONE]");
}

/* The tokens of a choice's logprobs, joined. */
static void tokens_of(const cJSON *choice, char *out, size_t n) {
  const cJSON *t;
  out[0] = '\0';
  cJSON_ArrayForEach(t, cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "logprobs"), "content")) {
    strncat(out, cJSON_GetObjectItem(t, "token")->valuestring, n - strlen(out) - 1);
    strncat(out, "|", n - strlen(out) - 1);
  }
}

static void test_two_choices(void **state) {
  (void)state;
  for (int merge = 0; merge < 2; merge++) {
    mz_client c = {0};
    mz_stream *s = new_stream(&c, merge);
    feed_n2(s);
    expect_text(s, 0, "Hello");
    expect_text(s, 1, "Bonjour");
    expect_text(s, 0, " there");
    expect_text(s, 1, " toi.");
    expect_text(s, 0, "!");
    const mz_event *e = next(s);
    assert_non_null(e);
    assert_int_equal(e->type, MZ_EV_DONE);
    const cJSON *d = e->json;
    assert_string_equal(cJSON_GetObjectItem(d, "finish_reason")->valuestring, "stop");
    assert_string_equal(cJSON_GetObjectItem(d, "model")->valuestring, "served-7b");
    assert_string_equal(cJSON_GetObjectItem(d, "system_fingerprint")->valuestring, "fp_1");
    assert_true(cJSON_GetObjectItem(d, "created")->valuedouble == 1700000000.0);
    const cJSON *list = cJSON_GetObjectItem(d, "choices");
    assert_int_equal(cJSON_GetArraySize(list), 2);
    const cJSON *c0 = cJSON_GetArrayItem(list, 0), *c1 = cJSON_GetArrayItem(list, 1);
    assert_int_equal(cJSON_GetObjectItem(c0, "index")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(c1, "index")->valueint, 1);
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    assert_string_equal(cJSON_GetObjectItem(c1, "finish_reason")->valuestring, "length");
    char toks[128];
    tokens_of(c0, toks, sizeof toks);
    assert_string_equal(toks, "Hello| there|!|");
    tokens_of(c1, toks, sizeof toks);
    assert_string_equal(toks, "Bonjour| toi.|");
    assert_null(next(s));
    free_stream(s);
  }
}

/* A choice seen first with a higher index still comes in index order. */
static void test_choices_in_index_order(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  frame(s, "{\"choices\":[{\"index\":2,\"delta\":{},\"finish_reason\":\"stop\"}]}");
  frame(s, "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"},"
           "{\"index\":1,\"delta\":{},\"finish_reason\":\"stop\"}]}");
  frame(s, "[DONE]");
  const mz_event *e = next(s);
  assert_int_equal(e->type, MZ_EV_DONE);
  const cJSON *list = cJSON_GetObjectItem(e->json, "choices");
  assert_int_equal(cJSON_GetArraySize(list), 3);
  for (int i = 0; i < 3; i++) assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(list, i), "index")->valueint, i);
  assert_string_equal(cJSON_GetObjectItem(e->json, "finish_reason")->valuestring, "length");
  free_stream(s);
}

/* One choice, no logprobs: done as before (no choices), plus what the
 * server said of itself; a stream that never ends frees what it kept. */
static void test_one_choice(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  frame(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}");
  frame(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"logprobs\":null,\"finish_reason\":null}]}");
  frame(s, "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"model\":\"later\"}");
  frame(s, "[DONE]");
  expect_text(s, 0, "a");
  const mz_event *e = next(s);
  assert_int_equal(e->type, MZ_EV_DONE);
  assert_null(cJSON_GetObjectItem(e->json, "choices"));
  assert_null(cJSON_GetObjectItem(e->json, "system_fingerprint"));
  assert_string_equal(cJSON_GetObjectItem(e->json, "model")->valuestring, "served-7b"); /* the first frame's */
  free_stream(s);
  s = new_stream(&c, 0);
  frame(s, HEAD "\"choices\":[{\"index\":1,\"delta\":{}," LP("x", "-1") "}]}");
  free_stream(s); /* no done: meta freed with the stream (ASan, valgrind) */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_choices),
      cmocka_unit_test(test_choices_in_index_order),
      cmocka_unit_test(test_one_choice),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
