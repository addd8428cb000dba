/*
 * queue.c - the event queue of one stream: what the response callbacks
 * (response.c) push and mz_stream_next() pops. A pure data structure: no
 * curl call, no socket, no clock (tests/c/test_queue.c drives it alone).
 *
 * Memory. Each stream owns one byte arena (the text of its queued events)
 * and one array of items (type, choice index, arena offset and length,
 * json). Items are laid out back to back: an item's text starts where the
 * previous item's ends (q_push takes arena.len as the offset, and
 * mz_push_text moves arena.len to the end of the text it wrote), so the
 * queue's text is one contiguous range of the arena. A popped event points
 * into the arena (no copy); its json is owned by the stream until the next
 * pop (mz_release_popped deletes it). The arena and the items are reset
 * by the pop that drains the queue, never before (the offsets of items
 * still queued point into it): the event it hands out stays readable, as
 * nothing writes the arena until the next push, and a push only comes
 * from a call into the client, after which the event is no longer valid
 * (client.h). So a steady stream does no allocation per token beyond
 * cJSON's own parse, also when pushes come between a pop and the next
 * (a scheduler's wait for other streams). Both only grow (doubling), with no cap of
 * their own: the SSE event cap (mz_request.max_event_bytes) bounds what
 * one callback can push, and a reader that pops keeps them small.
 *
 * The terminal event (done, error or response) is kept apart from the
 * queue in fixed storage (term, term_code, term_msg, term_json), so a
 * failure can always be reported, even out of memory. It is set once (the
 * first cause wins) and popped only after every item queued, so it comes
 * after everything received before it.
 *
 * UTF-8: for each of the first MZ_CARRY_CHOICES choices (n > 1 interleaves
 * them), a trailing incomplete character of a delta (at most 3 bytes per
 * channel, think and text) is held back in the carry and put in front of
 * the same choice's channel's next delta, so a character split across
 * frames reaches Lua whole; mz_flush_carry turns what is left at the end
 * into one U+FFFD. Ill-formed input is repaired in place (repair_utf8).
 *
 * The ready list (the client's rhead/rtail) is linked here too: every push
 * and the terminal event mark the stream, at most once until the scheduler
 * takes it off (mz_client_ready) or it closes.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "decode.h"
#include "fastframe.h"
#include "mirza.h"

/* ---------------------------------------------------------------- buffers */

int mz_buf_reserve(mz_buf *b, size_t extra) {
  if (b->cap - b->len >= extra) return 0;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap - b->len < extra) {
    if (cap > SIZE_MAX / 2) return -1;
    cap *= 2;
  }
  char *p = realloc(b->p, cap);
  if (!p) return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}

int mz_buf_add(mz_buf *b, const char *p, size_t len) {
  if (mz_buf_reserve(b, len + 1)) return -1;
  memcpy(b->p + b->len, p, len);
  b->len += len;
  b->p[b->len] = '\0';
  return 0;
}

void mz_buf_free(mz_buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

/* ------------------------------------------------------- ready list */

/*
 * The ready list: an intrusive FIFO of the streams that got an event (or
 * their terminal event) queued since they were last taken off it by
 * mz_client_ready(). Each stream is on it at most once, so marking is O(1)
 * and a scheduler wakes exactly the streams that changed, however many are
 * open. Closing a stream unlinks it.
 */
static void mark_ready(mz_stream *s) {
  mz_client *c = s->c;
  if (s->listed) return;
  s->listed = 1;
  s->rnext = NULL;
  s->rprev = c->rtail;
  if (c->rtail) c->rtail->rnext = s;
  else c->rhead = s;
  c->rtail = s;
}

void mz_unmark_ready(mz_stream *s) {
  mz_client *c = s->c;
  if (!s->listed) return;
  if (s->rprev) s->rprev->rnext = s->rnext;
  else c->rhead = s->rnext;
  if (s->rnext) s->rnext->rprev = s->rprev;
  else c->rtail = s->rprev;
  s->listed = 0;
  s->rprev = s->rnext = NULL;
}

/* ------------------------------------------------------- terminal events */

/* Record the terminal event once; later calls are ignored so the first
 * cause wins (a protocol error is not overwritten by the abort it causes). */
void mz_set_terminal(mz_stream *s, mz_evtype t, const char *code, const char *fmt, ...) {
  if (s->term) return;
  s->holding = 0; /* what was held comes with the end */
  mark_ready(s);
  s->term = t;
  s->term_code = code;
  s->term_msg[0] = '\0';
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->term_msg, sizeof s->term_msg, fmt, ap);
    va_end(ap);
  }
}

/* hold_ms = LONG_MAX (mirza.open{hold = math.huge}, what mirza.collect
 * asks for in a task): nothing is handed over before the end, the first
 * event included, whatever the clock reads. A finite hold is at most 2e9
 * ms (l_stream.c), below LONG_MAX even where a long has 32 bits. */
static int holds_to_end(const mz_stream *s) { return s->hold_s >= (double)LONG_MAX / 1000.0; }

static item *q_push(mz_stream *s, mz_evtype t, int index) {
  if (s->qlen == s->qcap) {
    size_t cap = s->qcap ? s->qcap * 2 : 64;
    item *q = realloc(s->q, cap * sizeof *q);
    if (!q) return NULL;
    s->q = q;
    s->qcap = cap;
  }
  /* holding is never set without hold_s, nor once the end came. A hold
   * starts on an empty queue when the previous event came less than a hold
   * ago: a stream that comes slower than that (a daemon's 50 tokens/s
   * under a 5 ms hold) has each event handed over at once, no later and
   * with no wake-up more than without a hold. A hold to the end starts
   * with the first event and is never due: no deadline (held_until is
   * INFINITY, which mz_due_at and mz_release_held leave alone); the
   * end hands it over (mz_set_terminal). */
  int delta = t == MZ_EV_THINK || t == MZ_EV_TEXT || t == MZ_EV_TOOL_CALL, stepped = 0;
  double now = s->hold_s > 0 || s->step ? mz_io_now(s->c) : 0, gap = now - s->pushed_at;
  s->pushed_at = now;
  if (s->step && delta && s->answering && s->next_at == 0 && now > s->answer_at) {
    s->next_at = now, stepped = 1; /* a read after the first delta's: the step, handed over at once */
    s->holding = 0;                /* with what a hold kept */
  }
  if (s->hold_s > 0 && !stepped && !s->term && !s->holding && s->qhead == s->qlen &&
      (gap < s->hold_s || holds_to_end(s))) {
    s->holding = 1; /* the first of a new hold */
    s->held_until = holds_to_end(s) ? INFINITY : now + s->hold_s;
    mz_due_at(s, s->held_until); /* the driver hands it over then (mz_release_held) */
  } else if (!s->holding) {
    mark_ready(s); /* no hold, a slow stream, or handed over and not yet taken: it goes with the rest */
  }
  if (delta && !s->answering) {
    s->answering = 1;
    s->answer_at = now > 0 ? now : mz_io_now(s->c); /* the read rule's age (due.c) */
  }
  item *it = &s->q[s->qlen++];
  it->type = t;
  it->index = index;
  it->off = s->arena.len;
  it->len = 0;
  it->json = NULL;
  return it;
}

void mz_out_of_memory(mz_stream *s) {
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_IO, "out of memory");
  s->abort = 1;
}

/* Queue a json-carrying event, taking ownership of json. */
void mz_push_json(mz_stream *s, mz_evtype t, int index, cJSON *json) {
  item *it = json ? q_push(s, t, index) : NULL;
  if (!it) {
    cJSON_Delete(json);
    mz_out_of_memory(s);
    return;
  }
  it->json = json;
}

/* The new text at arena[off..off+len) as valid UTF-8: scanned once (the
 * common case ends there), and only when ill-formed rewritten past the end
 * of the arena and moved back. Returns the new length. */
static size_t repair_utf8(mz_stream *s, size_t off, size_t len) {
  size_t v = mz_utf8_valid(s->arena.p + off, len), bad = len - v;
  if (v == len) return len;
  if (mz_buf_reserve(&s->arena, len + 3 * bad + 1)) { /* arena.len is still off */
    mz_out_of_memory(s);
    return len;
  }
  char *tail = s->arena.p + off + v, *out = s->arena.p + off + len;
  size_t n = mz_utf8_repair(tail, bad, out, &s->invalid_utf8);
  memmove(tail, out, n);
  return v + n;
}

/*
 * Queue a text delta. For a choice below MZ_CARRY_CHOICES a trailing
 * incomplete UTF-8 sequence is held back (at most 3 bytes per channel) and
 * put in front of the next delta of the same choice and channel, so Lua
 * only ever sees whole characters.
 * With esc, p is a raw JSON string body, unescaped while copied (the
 * output is never longer, so the reservation holds).
 */
void mz_push_text(mz_stream *s, mz_evtype t, int index, const char *p, size_t len, int esc) {
  int ch = t == MZ_EV_THINK ? 0 : 1, carried = (unsigned)index < MZ_CARRY_CHOICES;
  size_t held = carried ? s->carry_len[index][ch] : 0;
  if (mz_buf_reserve(&s->arena, held + len + 1)) {
    mz_out_of_memory(s);
    return;
  }
  size_t off = s->arena.len;
  if (held) memcpy(s->arena.p + off, s->carry[index][ch], held);
  if (esc) len = mz_json_unescape(p, len, s->arena.p + off + held);
  else memcpy(s->arena.p + off + held, p, len);
  size_t total = held + len, keep = total;
  if (carried) {
    keep = mz_utf8_complete(s->arena.p + off, total);
    s->carry_len[index][ch] = total - keep;
    memcpy(s->carry[index][ch], s->arena.p + off + keep, total - keep);
  }
  if (keep == 0) return;
  if (s->first_at == 0) s->first_at = mz_io_now(s->c);
  keep = repair_utf8(s, off, keep);
  item *it = q_push(s, t, index);
  if (!it) {
    mz_out_of_memory(s);
    return;
  }
  it->off = off;
  it->len = keep;
  s->arena.len = off + keep;
}

/* The stream is over: a held-back partial character will never be
 * completed, so it becomes one U+FFFD (counted), never silently dropped. */
void mz_flush_carry(mz_stream *s) {
  for (int i = 0; i < MZ_CARRY_CHOICES; i++)
    for (int ch = 0; ch < 2; ch++) {
      if (!s->carry_len[i][ch]) continue;
      s->carry_len[i][ch] = 0;
      s->invalid_utf8++;
      item *it = q_push(s, ch == 0 ? MZ_EV_THINK : MZ_EV_TEXT, i);
      if (!it || mz_buf_add(&s->arena, "\xEF\xBF\xBD", 3)) {
        mz_out_of_memory(s);
        return;
      }
      it->len = 3;
    }
}

/* Join the deltas queued right behind `it` into e: same channel and
 * choice, no json, their text next in the arena. Items are laid out back
 * to back, so a run is one range of the arena and the join is a longer
 * e->len: no copy. The run stops at a tool call, a progress event, another
 * channel or another choice (their order is kept), and at what is queued
 * now: it never waits for more. */
static void merge_run(mz_stream *s, mz_event *e, const item *it) {
  size_t end = it->off + it->len;
  while (s->qhead < s->qlen) {
    const item *nx = &s->q[s->qhead];
    if (nx->type != it->type || nx->index != it->index || nx->json || nx->off != end) break;
    end += nx->len;
    e->len += nx->len;
    e->deltas++;
    s->qhead++;
  }
}

/* The next event: the oldest item (joined with the run behind it when the
 * stream merges), or, once the items are all popped, the terminal event.
 * Valid until the next mz_release_popped (the next call into the client:
 * see client.h). */
const mz_event *mz_pop(mz_stream *s) {
  mz_event *e = &s->cur;
  memset(e, 0, sizeof *e);
  e->retry_after = -1;
  if (s->qhead < s->qlen) {
    item *it = &s->q[s->qhead++];
    e->type = it->type;
    e->index = it->index;
    e->text = s->arena.p ? s->arena.p + it->off : "";
    e->len = it->len;
    e->json = s->popped_json = it->json;
    e->deltas = 1;
    if (s->merge && (e->type == MZ_EV_TEXT || e->type == MZ_EV_THINK)) merge_run(s, e, it);
    if (s->qhead == s->qlen) { /* drained: reused from the next push on */
      s->qhead = s->qlen = 0;
      s->arena.len = 0;
    }
    return e;
  }
  s->term_popped = 1;
  e->retry_after = s->term == MZ_EV_ERROR ? s->retry_after : -1;
  e->headers = s->headers.p;
  e->headers_len = s->headers.len;
  e->type = s->term;
  e->code = s->term_code;
  e->status = s->status;
  e->json = s->term_json;
  if (s->term == MZ_EV_RESPONSE) {
    e->text = e->body = s->body.p ? s->body.p : "";
    e->len = e->body_len = s->body.len;
  } else {
    e->text = s->term_msg;
    e->len = strlen(s->term_msg);
    e->body = s->body.p;
    e->body_len = s->body.len;
  }
  return e;
}

/* Everything the queue and the terminal event still own (the stream's
 * close). */
void mz_queue_free(mz_stream *s) {
  for (size_t i = s->qhead; i < s->qlen; i++) cJSON_Delete(s->q[i].json);
  cJSON_Delete(s->popped_json);
  cJSON_Delete(s->term_json);
  cJSON_Delete(s->meta); /* response.c's, when no done took it */
  mz_buf_free(&s->arena);
  free(s->q);
  s->q = NULL;
  s->qhead = s->qlen = s->qcap = 0;
  s->popped_json = s->term_json = s->meta = NULL;
}

size_t mz_stream_pending(const mz_stream *s) {
  return (s->holding ? 0 : s->qlen - s->qhead) + (s->term && !s->term_popped);
}

double mz_stream_first_at(const mz_stream *s) { return s->first_at; }

double mz_stream_step(const mz_stream *s) { return s->next_at > 0 ? s->next_at - s->answer_at : 0; }

/* A held queue whose time came is handed over (the stream made ready);
 * else its time is noted as a deadline of the driver. 1: handed over. */
int mz_release_held(mz_stream *s, double now) {
  if (!s->holding) return 0;
  if (now < s->held_until) {
    mz_due_at(s, s->held_until);
    return 0;
  }
  s->holding = 0;
  mark_ready(s);
  return 1;
}

int mz_stream_finished(const mz_stream *s) { return s->term != 0; }
