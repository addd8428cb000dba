/*
 * test_queue.c - the per-stream event queue (src/queue.c) on its own: no
 * curl transfer, no socket. A stream is built by hand (client_int.h) and
 * fed the way response.c feeds it; events are popped the way
 * mz_stream_next() pops them (release the last one, then pop).
 *
 * Pinned: push/pop order across channels, choices, tool calls and
 * progress; the terminal event after everything queued, set once (the
 * first cause wins); the UTF-8 carry (a character split at every byte
 * offset comes whole, per channel and per choice, flushed as U+FFFD at the
 * end); merge (one run of one channel and choice, copy-free, never across
 * anything else, never waiting); memory (the arena and the items are reused
 * once the queue drains: a steady stream allocates nothing; popped json is
 * released at the next pop, which ASan checks in the sanitizer build); the
 * ready list (a stream listed once, oldest first).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "decode.h"
#include "mirza.h"

/* ---- a stream without a transfer ---- */

static mz_stream *new_stream(mz_client *c, int merge) {
  mz_stream *s = calloc(1, sizeof *s);
  assert_non_null(s);
  s->c = c;
  s->merge = merge;
  s->retry_after = -1;
  return s;
}

/* What mz_stream_close frees of a stream that never had a transfer. */
static void free_stream(mz_stream *s) {
  mz_unmark_ready(s);
  mz_due_drop(s);
  if (!s->c->ndue) { /* the test's client: its heap goes with its last stream */
    free(s->c->due);
    free(s->c->due_now);
    s->c->due = s->c->due_now = NULL, s->c->due_cap = 0;
  }
  mz_queue_free(s);
  mz_buf_free(&s->body);
  mz_buf_free(&s->headers);
  free(s);
}

/* mz_stream_next without the wait: NULL when nothing is ready. */
static const mz_event *next(mz_stream *s) {
  mz_release_popped(s);
  if (s->term_popped || !mz_ready(s)) return NULL;
  return mz_pop(s);
}

static void text(mz_stream *s, mz_evtype t, int index, const char *p) { mz_push_text(s, t, index, p, strlen(p), 0); }

static void expect(mz_stream *s, mz_evtype t, int index, const char *want) {
  const mz_event *e = next(s);
  assert_non_null(e);
  assert_int_equal(e->type, t);
  assert_int_equal(e->index, index);
  if (want) {
    assert_int_equal(e->len, strlen(want));
    assert_memory_equal(e->text, want, e->len);
  }
}

static cJSON *progress(int n) {
  cJSON *j = cJSON_CreateObject();
  assert_non_null(j);
  cJSON_AddNumberToObject(j, "n", n);
  return j;
}

/* ---- order ---- */

static void test_push_pop_order(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  assert_null(next(s));
  assert_int_equal(mz_stream_pending(s), 0);
  text(s, MZ_EV_THINK, 0, "hm");
  text(s, MZ_EV_TEXT, 0, "Hello");
  cJSON *calls = cJSON_CreateArray();
  mz_push_json(s, MZ_EV_TOOL_CALL, 0, calls);
  mz_push_json(s, MZ_EV_PROGRESS, 0, progress(1));
  text(s, MZ_EV_TEXT, 1, "other choice");
  text(s, MZ_EV_TEXT, 0, " world");
  assert_int_equal(mz_stream_pending(s), 6);
  assert_false(mz_stream_finished(s));
  expect(s, MZ_EV_THINK, 0, "hm");
  expect(s, MZ_EV_TEXT, 0, "Hello");
  const mz_event *e = next(s);
  assert_int_equal(e->type, MZ_EV_TOOL_CALL);
  assert_ptr_equal(e->json, calls); /* handed out, not copied */
  assert_int_equal(e->len, 0);
  e = next(s);
  assert_int_equal(e->type, MZ_EV_PROGRESS);
  assert_int_equal(cJSON_GetObjectItem(e->json, "n")->valueint, 1);
  expect(s, MZ_EV_TEXT, 1, "other choice");
  assert_int_equal(mz_stream_pending(s), 1);
  e = next(s);
  assert_int_equal(e->deltas, 1);
  assert_int_equal(e->retry_after, -1);
  assert_memory_equal(e->text, " world", 6);
  assert_null(next(s));
  assert_int_equal(mz_stream_pending(s), 0);
  free_stream(s);
}

/* ---- the terminal event ---- */

static void test_terminal_after_everything(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  text(s, MZ_EV_TEXT, 0, "a");
  mz_push_json(s, MZ_EV_PROGRESS, 0, progress(2));
  text(s, MZ_EV_TEXT, 0, "b");
  s->retry_after = 7;
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_HTTP, "HTTP %d", 503);
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL); /* the first cause wins */
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_IO, "later");
  assert_true(mz_stream_finished(s));
  assert_int_equal(mz_stream_pending(s), 4);
  expect(s, MZ_EV_TEXT, 0, "a");
  expect(s, MZ_EV_PROGRESS, 0, NULL);
  expect(s, MZ_EV_TEXT, 0, "b");
  const mz_event *e = next(s);
  assert_non_null(e);
  assert_int_equal(e->type, MZ_EV_ERROR);
  assert_string_equal(e->code, MZ_E_HTTP);
  assert_string_equal(e->text, "HTTP 503");
  assert_int_equal(e->len, 8);
  assert_int_equal(e->retry_after, 7);
  assert_int_equal(mz_stream_pending(s), 0);
  assert_null(next(s)); /* once */
  assert_null(next(s));
  free_stream(s);
}

/* Done: no message, no retry_after, the term json handed out; a response
 * carries its body. The message is capped at its storage, NUL-terminated. */
static void test_terminal_kinds(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  s->retry_after = 3;
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL);
  s->term_json = progress(3);
  const mz_event *e = next(s);
  assert_int_equal(e->type, MZ_EV_DONE);
  assert_int_equal(e->len, 0);
  assert_int_equal(e->retry_after, -1);
  assert_ptr_equal(e->json, s->term_json);
  free_stream(s);

  s = new_stream(&c, 0);
  assert_int_equal(mz_buf_add(&s->body, "{\"ok\":1}", 8), 0);
  s->status = 200;
  mz_set_terminal(s, MZ_EV_RESPONSE, NULL, NULL);
  e = next(s);
  assert_int_equal(e->type, MZ_EV_RESPONSE);
  assert_int_equal(e->status, 200);
  assert_int_equal(e->len, 8);
  assert_ptr_equal(e->text, e->body);
  assert_memory_equal(e->text, "{\"ok\":1}", 8);
  free_stream(s);

  s = new_stream(&c, 0);
  char big[2000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_SERVER, "%s", big);
  e = next(s);
  assert_int_equal(e->len, sizeof s->term_msg - 1);
  assert_int_equal(e->text[e->len], '\0');
  free_stream(s);
}

/* ---- UTF-8 carry ---- */

/* Every event popped is whole, valid UTF-8. */
static void assert_whole(const mz_event *e) {
  assert_int_equal(mz_utf8_valid(e->text, e->len), e->len);
  assert_int_equal(mz_utf8_complete(e->text, e->len), e->len);
}

/* Pop everything (text events of one channel) into out. */
static size_t drain(mz_stream *s, mz_evtype t, char *out, size_t cap) {
  size_t n = 0;
  const mz_event *e;
  while ((e = next(s)) && e->type == t) {
    assert_whole(e);
    assert_true(n + e->len <= cap);
    memcpy(out + n, e->text, e->len);
    n += e->len;
  }
  assert_null(e);
  return n;
}

/* 1-, 2-, 3- and 4-byte characters, split in two at every byte offset
 * (and a third piece too), in both channels: the same text, every event
 * whole, nothing counted as invalid. */
static void test_utf8_split_everywhere(void **state) {
  (void)state;
  static const char all[] = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z\xF0\x9F\x98\x80\xE2\x82\xAC";
  size_t len = sizeof all - 1;
  mz_client c = {0};
  for (int t = MZ_EV_THINK; t <= MZ_EV_TEXT; t++)
    for (size_t i = 0; i <= len; i++)
      for (size_t j = i; j <= len; j++) {
        mz_stream *s = new_stream(&c, (int)(i + j) & 1); /* merge on and off */
        char out[64];
        mz_push_text(s, (mz_evtype)t, 0, all, i, 0);
        mz_push_text(s, (mz_evtype)t, 0, all + i, j - i, 0);
        mz_push_text(s, (mz_evtype)t, 0, all + j, len - j, 0);
        size_t n = drain(s, (mz_evtype)t, out, sizeof out);
        assert_int_equal(n, len);
        assert_memory_equal(out, all, len);
        assert_int_equal(s->invalid_utf8, 0);
        assert_int_equal(s->carry_len[0][t == MZ_EV_THINK ? 0 : 1], 0);
        free_stream(s);
      }
}

/* Byte by byte: a character comes in one event, once its last byte is
 * pushed; its first bytes alone make nothing ready. */
static void test_utf8_byte_by_byte(void **state) {
  (void)state;
  static const char all[] = "\xF0\x9F\x98\x80\xE2\x82\xAC";
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  for (int k = 0; k < 3; k++) {
    mz_push_text(s, MZ_EV_TEXT, 0, all + k, 1, 0);
    assert_int_equal(s->carry_len[0][1], (size_t)k + 1); /* at most 3 bytes held */
    assert_int_equal(mz_stream_pending(s), 0);
    assert_false(s->listed);
  }
  mz_push_text(s, MZ_EV_TEXT, 0, all + 3, 1, 0);
  expect(s, MZ_EV_TEXT, 0, "\xF0\x9F\x98\x80");
  for (int k = 4; k < 7; k++) mz_push_text(s, MZ_EV_TEXT, 0, all + k, 1, 0);
  expect(s, MZ_EV_TEXT, 0, "\xE2\x82\xAC");
  free_stream(s);
}

/* Each channel has its own carry: a character split in the reasoning is
 * not joined with the answer's bytes in between. */
static void test_utf8_carry_per_channel(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  text(s, MZ_EV_THINK, 0, "t\xE2\x82");
  text(s, MZ_EV_TEXT, 0, "x\xC3");
  text(s, MZ_EV_THINK, 0, "\xAC");
  text(s, MZ_EV_TEXT, 0, "\xA9y");
  expect(s, MZ_EV_THINK, 0, "t");
  expect(s, MZ_EV_TEXT, 0, "x");
  expect(s, MZ_EV_THINK, 0, "\xE2\x82\xAC");
  expect(s, MZ_EV_TEXT, 0, "\xC3\xA9y");
  assert_int_equal(s->invalid_utf8, 0);
  free_stream(s);
}

/* The carry is per choice (n > 1 interleaves them, issue 36): a character
 * split across two frames of choice 1 comes whole, even with choice 0's
 * frames between; one left at the end is choice 1's U+FFFD. A choice past
 * MZ_CARRY_CHOICES has its partial character repaired at once. */
static void test_utf8_other_choice_repaired(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  text(s, MZ_EV_TEXT, 0, "a\xE2\x82");
  text(s, MZ_EV_TEXT, 1, "b\xE2\x82");
  text(s, MZ_EV_TEXT, 0, "\xAC");
  text(s, MZ_EV_TEXT, 1, "\xAC!\xC3");
  text(s, MZ_EV_TEXT, MZ_CARRY_CHOICES, "c\xE2\x82");
  expect(s, MZ_EV_TEXT, 0, "a");
  expect(s, MZ_EV_TEXT, 1, "b");
  expect(s, MZ_EV_TEXT, 0, "\xE2\x82\xAC");
  expect(s, MZ_EV_TEXT, 1, "\xE2\x82\xAC!");
  expect(s, MZ_EV_TEXT, MZ_CARRY_CHOICES, "c\xEF\xBF\xBD");
  assert_int_equal(s->invalid_utf8, 1);
  mz_flush_carry(s);
  expect(s, MZ_EV_TEXT, 1, "\xEF\xBF\xBD");
  assert_int_equal(s->invalid_utf8, 2);
  free_stream(s);
}

/* At the end the carry is one U+FFFD (counted), queued before the
 * terminal event; ill-formed bytes are repaired where they stand. */
static void test_utf8_flush_and_repair(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  text(s, MZ_EV_THINK, 0, "r\xF0\x9F");
  text(s, MZ_EV_TEXT, 0, "ok\xFF!\xE2\x82");
  mz_flush_carry(s);
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL);
  mz_flush_carry(s); /* nothing left: no second U+FFFD */
  expect(s, MZ_EV_THINK, 0, "r");
  expect(s, MZ_EV_TEXT, 0, "ok\xEF\xBF\xBD!");
  expect(s, MZ_EV_THINK, 0, "\xEF\xBF\xBD");
  expect(s, MZ_EV_TEXT, 0, "\xEF\xBF\xBD");
  expect(s, MZ_EV_DONE, 0, NULL);
  assert_int_equal(s->invalid_utf8, 3);
  free_stream(s);
}

/* esc: a raw JSON string body (the fast path's) is unescaped while copied. */
static void test_text_unescaped(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  const char raw[] = "a\\nb\\u00e9\\\"";
  mz_push_text(s, MZ_EV_TEXT, 0, raw, sizeof raw - 1, 1);
  expect(s, MZ_EV_TEXT, 0, "a\nb\xC3\xA9\"");
  free_stream(s);
}

/* ---- merge ---- */

static void test_merge_joins_a_run(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 1);
  text(s, MZ_EV_TEXT, 0, "Hel");
  text(s, MZ_EV_TEXT, 0, "lo");
  text(s, MZ_EV_TEXT, 0, "\xE2\x82"); /* held back, then joined */
  text(s, MZ_EV_TEXT, 0, "\xAC\xFF"); /* repaired in place: still one range */
  text(s, MZ_EV_TEXT, 0, "!");
  assert_int_equal(mz_stream_pending(s), 4);
  const mz_event *e = next(s);
  assert_int_equal(e->type, MZ_EV_TEXT);
  assert_int_equal(e->deltas, 4);
  assert_int_equal(e->len, 12);
  assert_memory_equal(e->text, "Hello\xE2\x82\xAC\xEF\xBF\xBD!", 12);
  assert_ptr_equal(e->text, s->arena.p); /* copy-free: the arena itself */
  assert_int_equal(mz_stream_pending(s), 0);
  /* what is queued now, never more: a delta after the pop is the next event */
  text(s, MZ_EV_TEXT, 0, "more");
  e = next(s);
  assert_int_equal(e->deltas, 1);
  assert_memory_equal(e->text, "more", 4);
  free_stream(s);
}

static void test_merge_stops_at_anything_else(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 1);
  text(s, MZ_EV_TEXT, 0, "a");
  text(s, MZ_EV_TEXT, 0, "b");
  text(s, MZ_EV_THINK, 0, "c"); /* another channel */
  text(s, MZ_EV_THINK, 0, "d");
  text(s, MZ_EV_THINK, 1, "e"); /* another choice */
  text(s, MZ_EV_TEXT, 1, "f");
  text(s, MZ_EV_TEXT, 0, "g");
  mz_push_json(s, MZ_EV_TOOL_CALL, 0, cJSON_CreateArray()); /* a tool call */
  text(s, MZ_EV_TEXT, 0, "h");
  mz_push_json(s, MZ_EV_PROGRESS, 0, progress(4)); /* progress */
  text(s, MZ_EV_TEXT, 0, "i");
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL);
  expect(s, MZ_EV_TEXT, 0, "ab");
  expect(s, MZ_EV_THINK, 0, "cd");
  expect(s, MZ_EV_THINK, 1, "e");
  expect(s, MZ_EV_TEXT, 1, "f");
  expect(s, MZ_EV_TEXT, 0, "g");
  expect(s, MZ_EV_TOOL_CALL, 0, NULL);
  expect(s, MZ_EV_TEXT, 0, "h");
  expect(s, MZ_EV_PROGRESS, 0, NULL);
  expect(s, MZ_EV_TEXT, 0, "i");
  expect(s, MZ_EV_DONE, 0, NULL);
  assert_null(next(s));
  free_stream(s);
}

static void test_no_merge_unless_asked(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  text(s, MZ_EV_TEXT, 0, "a");
  text(s, MZ_EV_TEXT, 0, "b");
  expect(s, MZ_EV_TEXT, 0, "a");
  expect(s, MZ_EV_TEXT, 0, "b");
  free_stream(s);
}

/* ---- memory ---- */

/* A reader that keeps up: the arena and the item array are reset by the pop
 * that drains the queue, so they never grow past their first size. The
 * next pushes come before the next pop's release, as when a scheduler
 * waits for every stream between two pops of one. */
static void test_steady_stream_reuses_memory(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  for (int i = 0; i < 10000; i++) {
    text(s, MZ_EV_TEXT, 0, "token ");
    text(s, MZ_EV_THINK, 0, "t");
    mz_push_json(s, MZ_EV_PROGRESS, 0, progress(i));
    expect(s, MZ_EV_TEXT, 0, "token ");
    expect(s, MZ_EV_THINK, 0, "t");
    expect(s, MZ_EV_PROGRESS, 0, NULL);
  }
  assert_int_equal(s->arena.cap, 1024);
  assert_int_equal(s->qcap, 64);
  assert_int_equal(s->arena.len, 0);
  assert_int_equal(s->qlen, 0);
  mz_release_popped(s);
  assert_null(s->popped_json);
  free_stream(s);
}

/* The pop that drains the queue resets it, and its event stays readable
 * until the next push; not drained, the arena is kept (queued items point
 * into it) and grows as the queue does; the popped json lives until the
 * next pop. */
static void test_release_only_when_drained(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 0);
  mz_push_json(s, MZ_EV_PROGRESS, 0, progress(5));
  text(s, MZ_EV_TEXT, 0, "x");
  const mz_event *e = next(s);
  assert_non_null(s->popped_json);
  assert_int_equal(cJSON_GetObjectItem(e->json, "n")->valueint, 5); /* still readable */
  e = next(s);                                                      /* releases it */
  assert_null(s->popped_json);
  assert_int_equal(s->arena.len, 0); /* drained */
  assert_int_equal(e->len, 1);
  assert_int_equal(e->text[0], 'x');
  text(s, MZ_EV_TEXT, 0, "y");
  text(s, MZ_EV_TEXT, 0, "z");
  expect(s, MZ_EV_TEXT, 0, "y");
  assert_int_equal(s->arena.len, 2); /* "z" is still queued */
  expect(s, MZ_EV_TEXT, 0, "z");
  for (int i = 0; i < 3000; i++) text(s, MZ_EV_TEXT, 0, "0123456789");
  assert_true(s->arena.cap >= 30001);
  assert_int_equal(mz_stream_pending(s), 3000);
  for (int i = 0; i < 2999; i++) expect(s, MZ_EV_TEXT, 0, "0123456789");
  mz_push_json(s, MZ_EV_TOOL_CALL, 0, cJSON_CreateArray()); /* queued at close: freed by it */
  free_stream(s);
}

/* ---- the ready list ---- */

/* hold: what is queued waits (not pending, not listed) until the driver
 * releases it at its time or the end comes; the first delta's time is
 * kept as read. */
static void test_hold_until_released(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 1);
  s->hold_s = 30; /* far away: only a release or the end hands it over */
  double before = mz_now();
  text(s, MZ_EV_THINK, 0, "Hmm. "); /* the first event: nothing came less than a hold before it */
  double first = s->first_at;
  assert_true(first >= before && first <= mz_now());
  assert_true(mz_ready(s));
  assert_ptr_equal(c.rhead, s);
  expect(s, MZ_EV_THINK, 0, "Hmm. ");
  mz_unmark_ready(s);
  text(s, MZ_EV_TEXT, 0, "Hel"); /* right behind it: a hold starts */
  text(s, MZ_EV_TEXT, 0, "lo");
  assert_false(mz_ready(s));
  assert_int_equal(mz_stream_pending(s), 0);
  assert_null(c.rhead);                                       /* not listed: no wake-up */
  assert_true(mz_due_next(&c) == s->held_until);              /* the driver looks again then */
  assert_int_equal(mz_release_held(s, s->held_until - 1), 0); /* not yet */
  assert_false(mz_ready(s));
  assert_int_equal(mz_release_held(s, s->held_until), 1);
  assert_ptr_equal(c.rhead, s);
  assert_int_equal(mz_stream_pending(s), 2); /* items: merged as they are popped */
  text(s, MZ_EV_TEXT, 0, "!");               /* handed over, not yet taken: it goes with the rest */
  assert_true(mz_ready(s));
  const mz_event *e = next(s);
  assert_int_equal(e->deltas, 3);
  assert_memory_equal(e->text, "Hello!", 6);
  assert_null(next(s));
  text(s, MZ_EV_TEXT, 0, " world"); /* drained: a new hold */
  assert_false(mz_ready(s));
  mz_unmark_ready(s);
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL); /* the end hands everything over at once */
  assert_ptr_equal(c.rhead, s);
  expect(s, MZ_EV_TEXT, 0, " world");
  expect(s, MZ_EV_DONE, 0, NULL);
  assert_true(s->first_at == first); /* the first delta's, not a later one's */
  free_stream(s);
}

/* A stream slower than its hold (each event more than a hold after the
 * previous one) has each event handed over at once: a hold costs it no
 * latency. */
static void test_hold_skips_slow_streams(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 1);
  s->hold_s = 0.005;
  for (int i = 0; i < 3; i++) {
    s->pushed_at = mz_now() - 2 * s->hold_s; /* the previous event came two holds ago */
    text(s, MZ_EV_TEXT, 0, "tok");
    assert_false(s->holding);
    assert_true(mz_ready(s));
    assert_ptr_equal(c.rhead, s);
    expect(s, MZ_EV_TEXT, 0, "tok");
    mz_unmark_ready(s);
  }
  text(s, MZ_EV_TEXT, 0, "fast"); /* right behind the last one: held */
  assert_true(s->holding);
  assert_false(mz_ready(s));
  assert_null(c.rhead);
  free_stream(s);
}

/* mz_request.step: the first delta read after the first one's read is
 * handed over at once, whatever the hold, and the time between the two
 * reads is the step; deltas of the first one's read are not it. */
static void test_step_hands_next_at_once(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *s = new_stream(&c, 1);
  s->hold_s = 30, s->step = 1;
  c.io_now = 100.0;
  text(s, MZ_EV_TEXT, 0, "a"); /* the first: at once */
  text(s, MZ_EV_TEXT, 0, "b"); /* the same read */
  assert_true(mz_stream_step(s) == 0);
  expect(s, MZ_EV_TEXT, 0, "ab"); /* merged: what came together */
  mz_unmark_ready(s);
  c.io_now = 100.25;
  text(s, MZ_EV_TEXT, 0, "c"); /* a later read: the step, handed over at once */
  assert_false(s->holding);
  assert_ptr_equal(c.rhead, s);
  assert_true(fabs(mz_stream_step(s) - 0.25) < 1e-9);
  expect(s, MZ_EV_TEXT, 0, "c");
  mz_unmark_ready(s);
  c.io_now = 100.5;
  text(s, MZ_EV_TEXT, 0, "d"); /* past it: held as ever */
  assert_true(s->holding);
  assert_null(c.rhead);
  assert_true(fabs(mz_stream_step(s) - 0.25) < 1e-9);
  free_stream(s);
  s = new_stream(&c, 1); /* without step: the next read is held, no step */
  s->hold_s = 30;
  c.io_now = 200.0;
  text(s, MZ_EV_TEXT, 0, "a");
  expect(s, MZ_EV_TEXT, 0, "a");
  mz_unmark_ready(s);
  c.io_now = 200.25;
  text(s, MZ_EV_TEXT, 0, "b");
  assert_true(s->holding);
  assert_true(mz_stream_step(s) == 0);
  free_stream(s);
}

/* hold = math.huge (hold_ms LONG_MAX, l_stream.c): everything waits for
 * the end, the first event too whatever the clock reads, and no deadline
 * is noted (held_until is INFINITY: never due, the driver's scan is not
 * woken for it). */
static void test_hold_to_the_end(void **state) {
  (void)state;
  mz_client c = {0};
  c.io_now = 1e16; /* a clock past any finite hold (LONG_MAX ms is ~9.2e15 s) */
  mz_stream *s = new_stream(&c, 1);
  s->hold_s = (double)LONG_MAX / 1000.0;
  text(s, MZ_EV_TEXT, 0, "Hel"); /* the first event: held all the same */
  assert_true(s->holding);
  assert_false(mz_ready(s));
  assert_int_equal(mz_stream_pending(s), 0);
  assert_null(c.rhead);
  assert_true(isinf(s->held_until));
  assert_true(isinf(mz_due_next(&c)));
  assert_int_equal(mz_release_held(s, 1e300), 0); /* never due */
  assert_true(isinf(mz_due_next(&c)));
  c.io_now = 2e16; /* a long gap: still the same hold */
  text(s, MZ_EV_TEXT, 0, "lo");
  assert_false(mz_ready(s));
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL); /* the end hands it all over */
  assert_ptr_equal(c.rhead, s);
  const mz_event *e = next(s);
  assert_int_equal(e->type, MZ_EV_TEXT);
  assert_int_equal(e->deltas, 2);
  assert_memory_equal(e->text, "Hello", 5);
  expect(s, MZ_EV_DONE, 0, NULL);
  assert_true(s->first_at == 1e16); /* when the first delta was read */
  free_stream(s);
}

static void test_ready_list(void **state) {
  (void)state;
  mz_client c = {0};
  mz_stream *a = new_stream(&c, 0), *b = new_stream(&c, 0);
  text(b, MZ_EV_TEXT, 0, "1");
  text(a, MZ_EV_TEXT, 0, "2");
  text(b, MZ_EV_TEXT, 0, "3"); /* listed once */
  mz_set_terminal(b, MZ_EV_DONE, NULL, NULL);
  assert_ptr_equal(c.rhead, b);
  assert_ptr_equal(b->rnext, a);
  assert_ptr_equal(c.rtail, a);
  assert_null(a->rnext);
  assert_null(b->rprev);
  mz_unmark_ready(b);
  assert_ptr_equal(c.rhead, a);
  assert_null(a->rprev);
  mz_set_terminal(b, MZ_EV_ERROR, MZ_E_IO, "ignored: no second mark");
  assert_false(b->listed);
  mz_set_terminal(a, MZ_EV_DONE, NULL, NULL);
  free_stream(a);
  assert_null(c.rhead);
  assert_null(c.rtail);
  free_stream(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_push_pop_order),
      cmocka_unit_test(test_terminal_after_everything),
      cmocka_unit_test(test_terminal_kinds),
      cmocka_unit_test(test_utf8_split_everywhere),
      cmocka_unit_test(test_utf8_byte_by_byte),
      cmocka_unit_test(test_utf8_carry_per_channel),
      cmocka_unit_test(test_utf8_other_choice_repaired),
      cmocka_unit_test(test_utf8_flush_and_repair),
      cmocka_unit_test(test_text_unescaped),
      cmocka_unit_test(test_merge_joins_a_run),
      cmocka_unit_test(test_hold_until_released),
      cmocka_unit_test(test_hold_skips_slow_streams),
      cmocka_unit_test(test_step_hands_next_at_once),
      cmocka_unit_test(test_hold_to_the_end),
      cmocka_unit_test(test_merge_stops_at_anything_else),
      cmocka_unit_test(test_no_merge_unless_asked),
      cmocka_unit_test(test_steady_stream_reuses_memory),
      cmocka_unit_test(test_release_only_when_drained),
      cmocka_unit_test(test_ready_list),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
