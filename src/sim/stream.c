/*
 * stream.c - the generation loop: queueing, prefill, one frame per token,
 * pacing, progress and heartbeat frames, and the stream faults.
 *
 * Frames are assembled by hand from two precomputed pieces (everything
 * before the delta, everything after it) in each dialect's field order, so a
 * token costs a few memcpy calls. Output is batched: at a finite rate the
 * buffer is flushed before each wait, so a frame leaves when it is due and
 * frames already overdue share one write; at rate 0 it is flushed every
 * SIM_FLUSH_BYTES. The final frames (usage, stats) are built in finish.c.
 *
 * With --step-growth every generation is paced by the batch's shared step
 * clock instead (step.c): its step grows with the sequences generating.
 *
 * A vanished client is noticed by the waits (sys_peer_gone) and by failed
 * writes; either stops the generation at once and frees the slot, as both
 * real daemons do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sim.h"
#include "stream.h"

/* ---- frame assembly ----------------------------------------------------- */

/* Precompute the constant parts of every frame of this request. */
static void build_pieces(job *j) {
  const char *model = j->srv->cfg.model_id;
  const char *object = j->completion ? "text_completion" : "chat.completion.chunk";
  if (j->srv->cfg.dialect == DIALECT_MTPLX) {
    sbuf_adds(&j->pre, "data: {\"id\":");
    sbuf_json_str(&j->pre, j->id);
    sbuf_printf(&j->pre, ",\"object\":\"%s\",\"created\":%ld,\"model\":", object, j->created);
    sbuf_json_str(&j->pre, model);
    sbuf_adds(&j->pre,
              j->completion ? ",\"choices\":[{\"index\":0,\"text\":\"" : ",\"choices\":[{\"index\":0,\"delta\":");
    return;
  }
  sbuf_printf(&j->post, "}],\"created\":%ld,\"id\":", j->created);
  sbuf_json_str(&j->post, j->id);
  sbuf_adds(&j->post, ",\"model\":");
  sbuf_json_str(&j->post, model);
  sbuf_printf(&j->post, ",\"system_fingerprint\":\"b9928-mirza-sim\",\"object\":\"%s\"", object);
}

/* A /v1/completions frame: text (may be empty), finish (NULL: null) and
 * extra top-level members ("" or ",\"usage\":..."), in OpenAI's member
 * order, or llama-server's (choices first, as its chat frames). */
void text_frame(job *j, const char *tok, size_t n, const char *finish, const char *extra) {
  sbuf *o = &j->out;
  bool mtplx = j->srv->cfg.dialect == DIALECT_MTPLX;
  if (mtplx) sbuf_add(o, j->pre.p, j->pre.len);
  else sbuf_adds(o, "data: {\"choices\":[{\"text\":\"");
  sbuf_json_esc(o, tok, n);
  sbuf_adds(o,
            mtplx ? "\",\"logprobs\":null,\"finish_reason\":" : "\",\"index\":0,\"logprobs\":null,\"finish_reason\":");
  sbuf_json_str(o, finish);
  if (mtplx) sbuf_adds(o, "}]");
  else sbuf_add(o, j->post.p, j->post.len);
  sbuf_adds(o, extra);
  sbuf_add(o, "}\n\n", 3);
}

/* Start a frame of choice `index` up to and including "delta":. finish
 * NULL = null. MTPLX's precomputed piece ends in choice 0's
 * "index":0,"delta": (PRE_INDEX0: those last bytes, from the 0). */
#define PRE_INDEX0 10
void frame_open_at(job *j, const char *finish, int index) {
  sbuf *o = &j->out;
  if (j->srv->cfg.dialect == DIALECT_MTPLX) {
    if (!index) {
      sbuf_add(o, j->pre.p, j->pre.len);
      return;
    }
    sbuf_add(o, j->pre.p, j->pre.len - PRE_INDEX0);
    sbuf_printf(o, "%d,\"delta\":", index);
    return;
  }
  sbuf_adds(o, "data: {\"choices\":[{\"finish_reason\":");
  sbuf_json_str(o, finish);
  sbuf_printf(o, ",\"index\":%d,\"delta\":", index);
}

void frame_open(job *j, const char *finish) { frame_open_at(j, finish, 0); }

/* End a frame; extra is "" or ",\"key\":value..." (top-level members). */
void frame_close(job *j, const char *finish, const char *extra) {
  sbuf *o = &j->out;
  if (j->srv->cfg.dialect == DIALECT_MTPLX) {
    sbuf_adds(o, ",\"finish_reason\":");
    sbuf_json_str(o, finish);
    sbuf_adds(o, "}]");
  } else {
    sbuf_add(o, j->post.p, j->post.len);
  }
  sbuf_adds(o, extra);
  sbuf_add(o, "}\n\n", 3);
}

/* ---- logprobs ----------------------------------------------------------
 * Made up but consistent: a token's logprob comes from a hash of its text
 * and its choice, in (-5, 0]; its top_logprobs start with itself, then
 * made-up alternatives, each less likely than the one before. Written in
 * OpenAI's and vLLM's shape: {"content":[{"token","logprob","bytes",
 * "top_logprobs":[{"token","logprob","bytes"}...]}]}. */

static void lp_entry(sbuf *o, const char *tok, size_t n, double lp) {
  sbuf_adds(o, "{\"token\":\"");
  sbuf_json_esc(o, tok, n);
  sbuf_printf(o, "\",\"logprob\":%.4f,\"bytes\":[", lp);
  for (size_t i = 0; i < n; i++) sbuf_printf(o, i ? ",%u" : "%u", (unsigned)(unsigned char)tok[i]);
  sbuf_adds(o, "]");
}

static void logprobs_member(job *j, int index, const char *tok, size_t n) {
  static const char *const alt[] = {" the", " a", ",", ".", " and", " of", " to", " is"};
  sbuf *o = &j->out;
  double lp = -(double)(gen_hash((uint64_t)index, tok, n) % 5000) / 1000.0;
  sbuf_adds(o, ",\"logprobs\":{\"content\":[");
  lp_entry(o, tok, n, lp);
  sbuf_adds(o, ",\"top_logprobs\":[");
  for (int k = 0; k < j->top_logprobs; k++) {
    if (k) sbuf_add(o, ",", 1);
    const char *t = k ? alt[(k - 1) % 8] : tok;
    lp_entry(o, t, k ? strlen(t) : n, lp - 0.75 * k);
    sbuf_adds(o, "}");
  }
  sbuf_adds(o, "]}]}");
}

static void token_frame(job *j, int index, bool reasoning, const char *tok, size_t n) {
  frame_open_at(j, NULL, index);
  sbuf_adds(&j->out, reasoning ? "{\"reasoning_content\":\"" : "{\"content\":\"");
  sbuf_json_esc(&j->out, tok, n);
  sbuf_add(&j->out, "\"}", 2);
  if (j->logprobs) logprobs_member(j, index, tok, n);
  frame_close(j, NULL, "");
}

/* The role frame of every choice, in index order (vLLM's first frames). */
void role_frame(job *j) {
  for (int i = 0; i < (j->n > 1 ? j->n : 1); i++) {
    frame_open_at(j, NULL, i);
    sbuf_adds(&j->out, j->srv->cfg.dialect == DIALECT_MTPLX ? "{\"role\":\"assistant\"}"
                                                            : "{\"role\":\"assistant\",\"content\":null}");
    frame_close(j, NULL, "");
  }
  j->role_sent = true;
}

/* Send what is buffered as one chunk; a failed write means the client left. */
void job_flush(job *j) {
  if (j->out.len && !j->gone && j->stream) {
    if (http_chunk(j->c, j->out.p, j->out.len)) j->gone = true;
    j->t_hb = sim_now(); /* heartbeats measure silence since the last write */
  }
  j->out.len = 0;
}

/* ---- MTPLX progress and heartbeat frames -------------------------------- */

static void progress_frame(job *j, double now) {
  double el = now - j->t_first;
  sbuf x = {0};
  sbuf_printf(&x,
              ",\"mtplx_progress\":{\"completion_tokens\":%ld,\"decode_elapsed_s\":%.3f,"
              "\"decode_tok_s\":",
              j->ntok, el > 0 ? el : 0.0);
  if (el > 0) sbuf_printf(&x, "%.1f", (double)j->ntok / el);
  else sbuf_adds(&x, "null");
  sbuf_adds(&x, ",\"request_id\":");
  sbuf_json_str(&x, j->id);
  sbuf_adds(&x, ",\"session_id\":");
  sbuf_json_str(&x, j->has_session ? j->session : NULL);
  sbuf_adds(&x, "}");
  frame_open(j, NULL);
  sbuf_add(&j->out, "{}", 2);
  frame_close(j, NULL, x.p);
  sbuf_free(&x);
}

static void heartbeat_frame(job *j, const char *phase, double now) {
  char x[256];
  double since = now - (j->ntok ? j->t_last : j->t0);
  snprintf(x, sizeof x,
           ",\"mtplx_progress\":{\"heartbeat\":true,\"phase\":\"%s\",\"completion_tokens\":%ld,"
           "\"elapsed_s\":%.2f,\"seconds_since_last_token\":%.2f}",
           phase, j->ntok, now - j->t0, since);
  frame_open(j, NULL);
  sbuf_add(&j->out, "{}", 2);
  frame_close(j, NULL, x);
  job_flush(j);
  j->t_hb = now;
}

static bool heartbeats_on(const job *j) {
  return j->stream && j->srv->cfg.dialect == DIALECT_MTPLX && j->srv->cfg.heartbeat_ms > 0 && !j->completion;
}

/* Wait until deadline; MTPLX streams get a heartbeat every --heartbeat-ms
 * of silence. Returns 0, -1 (client gone) or -2 (cancelled). */
static int wait_phase(job *j, double deadline, const char *phase) {
  double hb = (double)j->srv->cfg.heartbeat_ms / 1000.0;
  for (;;) {
    double until = deadline;
    if (heartbeats_on(j) && j->t_hb + hb < until) until = j->t_hb + hb;
    int rc = conn_wait_until(j->c, until, &j->fl.cancel);
    if (rc) return rc;
    if (until >= deadline) return 0;
    heartbeat_frame(j, phase, sim_now());
    if (j->gone) return -1;
  }
}

/* Called by the scheduler while queued: heartbeats, disconnects, cancel. */
static int queue_tick(void *arg) {
  job *j = arg;
  if (atomic_load(&j->fl.cancel)) return -2;
  if (conn_gone(j->c)) return -1;
  double now = sim_now();
  if (heartbeats_on(j) && now - j->t_hb >= (double)j->srv->cfg.heartbeat_ms / 1000.0) heartbeat_frame(j, "queued", now);
  return j->gone ? -1 : 0;
}

/* ---- faults at token boundaries ----------------------------------------- */

static void cut_connection(job *j) {
  job_flush(j);
  http_flush(j->c);            /* --coalesce-writes: the frames before the cut go out */
  shutdown(j->c->fd, SHUT_WR); /* clean FIN, no terminating chunk */
  close(j->c->fd);
  j->c->fd = -1;
  j->c->must_close = true;
  j->gone = true;
}

static void malformed_frame(job *j) {
  if (!j->stream) return;
  if (j->srv->cfg.dialect == DIALECT_MTPLX) sbuf_add(&j->out, j->pre.p, j->pre.len);
  else sbuf_adds(&j->out, "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":");
  sbuf_adds(&j->out, "{\"content\":\"x\"\n\n");
}

/* A token frame whose content is written into the JSON as is: raw bytes
 * (bad-utf8) or an escape (nul). Not counted as a token. */
static void raw_content_frame(job *j, const char *raw) {
  if (!j->stream) return;
  frame_open(j, NULL);
  sbuf_adds(&j->out, "{\"content\":\"");
  sbuf_adds(&j->out, raw);
  sbuf_adds(&j->out, "\"}");
  frame_close(j, NULL, "");
}

/* Invalid UTF-8: a lone 0xFF, a truncated 3-byte sequence (E2 82), then a
 * valid 4-byte one; a decoder following the WHATWG rule reads
 * "A\uFFFDB\uFFFDC\U0001F600D" (two replacements). */
static const char SIM_BAD_UTF8[] = "A\xFF"
                                   "B\xE2\x82"
                                   "C\xF0\x9F\x98\x80"
                                   "D";

#define DUE(n, fired) ((n) >= 0 && !(fired) && (j->frames >= (n) || end))

/* Apply the faults due after j->frames token frames (all pending ones at
 * the end of the text). Returns 0 to continue, 1 when the stream is over. */
static int checkpoint(job *j, bool end) {
  sim_faults *f = &j->f;
  if (DUE(f->crash_after, j->fired_crash)) {
    job_flush(j);
    http_flush(j->c);
    if (j->srv->cfg.verbosity > 0)
      fprintf(stderr, "mirza-sim: simulated crash after %ld tokens of %s\n", j->frames, j->id);
    _exit(3);
  }
  if (DUE(f->cut_after, j->fired_cut)) {
    j->fired_cut = true;
    cut_connection(j);
    return 1;
  }
  if (DUE(f->error_after, j->fired_error)) {
    j->fired_error = true;
    finish_error(j);
    return 1;
  }
  if (DUE(f->stall_after, j->fired_stall)) {
    j->fired_stall = true;
    job_flush(j);
    double until = f->stall_ms < 0 ? sim_now() + 1e9 : sim_now() + (double)f->stall_ms / 1000;
    int rc = conn_wait_until(j->c, until, &j->fl.cancel);
    j->gone = rc == -1;
    j->cancelled = rc == -2; /* generate() ends the stream as cancelled */
    if (j->gone) return 1;
  }
  if (DUE(f->malformed_after, j->fired_malformed)) {
    j->fired_malformed = true;
    malformed_frame(j);
  }
  if (DUE(f->bad_utf8_after, j->fired_bad_utf8)) {
    j->fired_bad_utf8 = true;
    raw_content_frame(j, SIM_BAD_UTF8);
  }
  if (DUE(f->nul_after, j->fired_nul)) {
    j->fired_nul = true;
    raw_content_frame(j, "a\\u0000b"); /* "a", NUL, "b" */
  }
  return 0;
}

/* ---- the token loop ------------------------------------------------------ */

/* Wait until the batch's step clock reaches token j->ntok (--step-growth).
 * Its due time holds while the batch keeps its size, so the clock is asked
 * again on waking at it (a batch that grew meanwhile makes it wait on) and
 * when a sequence has left since (it comes sooner): the wait is cut into
 * SIM_LEAVES_MS pieces to look at the count of leaves (each piece costs a
 * wake-up and the last 2 ms of it a sleep of their own: shorter ones cost
 * the simulator a sixth of a core at 256 sequences). */
static int pace_clocked(job *j) {
  server *s = j->srv;
  double target = j->step0 + (double)(j->ntok + j->rest);
  long seen = -1; /* the leaves counted when due was computed */
  double due = 0; /* computed on the first turn */
  while (!j->gone && !j->cancelled) {
    double now = sim_now();
    long leaves = atomic_load(&s->decode_leaves);
    if (now >= due || leaves != seen) {
      seen = leaves;
      if ((due = decode_due(s, target)) <= sim_now()) break; /* the clock's time: after now */
    }
    job_flush(j);
    double until = due < now + SIM_LEAVES_MS / 1000.0 ? due : now + SIM_LEAVES_MS / 1000.0;
    int rc = j->gone ? -1 : wait_phase(j, until, "generating");
    j->gone = j->gone || rc == -1;
    j->cancelled = j->cancelled || rc == -2;
  }
  return j->gone || j->cancelled;
}

/* Wait for token number j->ntok to be due. 0 = go on. */
static int pace(job *j) {
  if (j->clocked) return pace_clocked(j);
  if (j->rate <= 0) {
    long fpc = j->frames_per_chunk;
    if (j->out.len >= SIM_FLUSH_BYTES || (fpc > 0 && j->frames % fpc == 0)) {
      job_flush(j);
      if (atomic_load(&j->fl.cancel)) j->cancelled = true;
    }
    return j->gone || j->cancelled;
  }
  double due = j->t_first + (double)(j->ntok + j->rest) / j->rate;
  if (due > sim_now()) {
    job_flush(j);
    int rc = j->gone ? -1 : wait_phase(j, due, "generating");
    j->gone = j->gone || rc == -1;
    j->cancelled = j->cancelled || rc == -2;
  }
  return j->gone || j->cancelled;
}

static void emit_token(job *j, bool reasoning, const char *tok, size_t n) {
  if (j->stream) {
    if (j->completion) {
      text_frame(j, tok, n, NULL, "");
    } else {
      if (!j->role_sent) role_frame(j);
      token_frame(j, 0, reasoning, tok, n);
    }
  } else {
    sbuf_add(reasoning ? &j->reasoning : &j->content, tok, n);
  }
  j->ntok++;
  j->frames++;
  if (reasoning) j->nreason++;
  else j->nanswer++;
  j->t_last = sim_now();
  long every = j->srv->cfg.progress_every;
  if (j->stream && every > 0 && j->ntok % every == 0 && j->srv->cfg.dialect == DIALECT_MTPLX && !j->completion)
    progress_frame(j, j->t_last);
}

/* Where the utf8-split fault cuts a token: inside its first multi-byte
 * character, or 0 to leave it whole. */
static size_t utf8_cut(const char *t, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)t[i] >= 0xC0) return i + 1 < n ? i + 1 : 0;
  return 0;
}

/* The oversized fault's filler: sized so the whole data line is BYTES. */
static char *oversized_filler(job *j, size_t *n) {
  size_t over = 0;
  if (j->stream) {
    size_t keep = j->out.len;
    token_frame(j, 0, false, "", 0);
    over = j->out.len - keep - 2; /* without the blank line */
    j->out.len = keep;
  }
  size_t want = (size_t)j->f.oversized > over ? (size_t)j->f.oversized - over : 1;
  char *p = malloc(want);
  if (!p) abort();
  static const char pat[] = "lorem ipsum dolor sit amet ";
  for (size_t i = 0; i < want; i++) p[i] = pat[i % (sizeof pat - 1)];
  *n = want;
  return p;
}

/* Next token to send; moves from reasoning to answer. 0 = text complete. */
static size_t next_token(job *j, bool *reasoning, const char **tok) {
  size_t n;
  if (j->split_n) {
    *tok = j->split_p;
    n = j->split_n;
    j->split_n = 0;
    return n;
  }
  if (*reasoning && (n = tokseq_next(&j->rseq, tok))) return n;
  *reasoning = false;
  n = tokseq_next(&j->aseq, tok);
  if (n && j->f.utf8_split && j->cap - j->ntok >= 2) {
    size_t cut = utf8_cut(*tok, n);
    if (cut) {
      j->split_p = *tok + cut;
      j->split_n = n - cut;
      n = cut;
    }
  }
  return n;
}

static void maybe_oversized(job *j, bool reasoning) {
  if (reasoning || !j->f.oversized || j->oversized_done || j->ntok >= j->cap) return;
  j->oversized_done = true;
  size_t n;
  char *p = oversized_filler(j, &n);
  if (!pace(j)) emit_token(j, false, p, n);
  free(p);
}

/* ---- the other choices (n > 1) ------------------------------------------ */

/* The finish frame of choice i (> 0): an empty delta, its reason. */
static void choice_finish(job *j, int i, const char *finish) {
  j->more[i - 1].finish = finish;
  if (!j->stream) return;
  frame_open_at(j, finish, i);
  sbuf_add(&j->out, "{}", 2);
  frame_close(j, finish, "");
}

/* One token of each choice past the first still going, in index order;
 * one that ends gets its finish frame. */
static void more_round(job *j) {
  for (int i = 1; i < j->n; i++) {
    sim_choice *c = &j->more[i - 1];
    const char *tok;
    size_t n = 0;
    if (c->finish) continue;
    if (c->reasoning && !(n = tokseq_next(&c->rseq, &tok))) c->reasoning = false;
    if (!n) n = tokseq_next(&c->aseq, &tok);
    if (!n || c->ntok >= j->cap) {
      choice_finish(j, i, n ? "length" : "stop");
      continue;
    }
    if (j->stream) token_frame(j, i, c->reasoning, tok, n);
    else sbuf_add(c->reasoning ? &c->reasoning_text : &c->content, tok, n);
    c->ntok++;
    j->ntok_more++;
  }
}

static bool more_going(const job *j) {
  for (int i = 1; i < j->n; i++)
    if (!j->more[i - 1].finish) return true;
  return false;
}

/* Choice 0 is over: the others to their end, paced as it was. 0: done,
 * else the client left or cancelled. */
static int more_rest(job *j) {
  while (more_going(j)) {
    j->rest++;
    if (pace(j)) return -1;
    more_round(j);
  }
  return 0;
}

/* Produce tokens until the text ends, the cap is hit, a fault ends the
 * stream, or the client leaves. Returns the finish reason, or NULL when
 * the response is already over (fault, disconnect). With n > 1 each
 * token of choice 0 is followed by one of each other choice, and those
 * still going after it ends go on to their own end first. */
static const char *generate(job *j) {
  bool reasoning = j->has_reasoning;
  const char *fin = NULL;
  for (;;) {
    if (checkpoint(j, false)) return NULL;
    const char *tok;
    size_t n = next_token(j, &reasoning, &tok);
    if (!n) break;
    if (j->ntok >= j->cap) {
      fin = "length";
      break;
    }
    maybe_oversized(j, reasoning);
    if (!j->gone && !j->cancelled && !pace(j)) emit_token(j, reasoning, tok, n);
    if (j->more && !j->gone && !j->cancelled) more_round(j);
    if (j->gone) return NULL;
    if (j->cancelled) return "cancelled";
  }
  if (j->more && more_rest(j)) return j->gone ? NULL : "cancelled";
  if (checkpoint(j, true)) return NULL;
  return fin ? fin : tools_emit(j);
}

/* ---- the request ---------------------------------------------------------- */

/* Queue for a slot, then "prefill": ttft_ms, plus the prompt tokens not
 * found cached at prefill_rate. Then the slot caches the whole prompt.
 * 0 = ready to decode. */
static int acquire_and_prefill(job *j) {
  long common = 0;
  int rc = sched_acquire(j->srv, queue_tick, j, j->prompt, j->prompt_len, j->id_slot, &j->slot_index, &common);
  if (rc) return rc;
  j->slot = true;
  if (!j->has_session) /* the slot's cache; an MTPLX session keeps its own */
    j->cached_tokens = common / 4 < j->prompt_tokens ? common / 4 : j->prompt_tokens - 1;
  if (j->stream && j->srv->cfg.dialect == DIALECT_LLAMA && http_begin_chunked(j->c, 200, "text/event-stream", NULL))
    return -1;
  j->t_slot = sim_now();
  j->t_first = j->t_slot + (double)(j->ttft_ms > 0 ? j->ttft_ms : 0) / 1000.0;
  if (j->prefill_rate > 0) j->t_first += (double)(j->prompt_tokens - j->cached_tokens) / j->prefill_rate;
  rc = wait_phase(j, j->t_first, "prefill");
  if (rc == 0) sched_prefilled(j->srv, j->slot_index, j->prompt, j->prompt_len);
  return rc;
}

/* --step-growth: a generation joins the batch with each of its choices;
 * it is paced by the batch's clock unless its body chose its own rate
 * (mirza_sim.tok_rate), and --tok-rate 0 stays as fast as possible. Its
 * first token comes with the end of the step it joined, not at once: a
 * GPU server samples it from the step that carries the prompt beside the
 * running sequences' tokens (llama-server's update_slots builds one batch
 * of both), so a first token takes longer the fuller the batch. */
static void batch_join(job *j) {
  const sim_config *cfg = &j->srv->cfg;
  if (!cfg->step_growth || cfg->tok_rate <= 0) return;
  j->batched = j->n > 1 ? j->n : 1;
  j->step0 = decode_join(j->srv, j->batched) + 1.0;
  j->clocked = j->rate == cfg->tok_rate;
}

int job_run(job *j) {
  j->t0 = j->t_hb = j->t_last = sim_now();
  snprintf(j->fl.id, sizeof j->fl.id, "%s", j->id);
  inflight_add(j->srv, &j->fl);
  build_pieces(j);
  if (j->f.head_delay_ms > 0) /* queued without a response head */
    j->gone = conn_wait_until(j->c, j->t0 + (double)j->f.head_delay_ms / 1000.0, &j->fl.cancel) != 0;
  if (j->stream && j->srv->cfg.dialect == DIALECT_MTPLX) {
    if (http_begin_chunked(j->c, 200, "text/event-stream", NULL)) j->gone = true;
    if (!j->completion) role_frame(j);
    job_flush(j);
  }
  int rc = j->gone ? -1 : acquire_and_prefill(j);
  const char *finish = NULL;
  if (rc == 0) {
    j->t_first = sim_now(); /* the schedule starts when prefill really ended */
    batch_join(j);
    finish = generate(j);
    if (j->batched) decode_leave(j->srv, j->batched);
    j->batched = 0;
  }
  j->gone = j->gone || rc == -1;
  if (rc == -2) finish = "cancelled";
  if (j->slot) sched_release(j->srv, j->slot_index);
  j->slot = false;
  inflight_remove(j->srv, &j->fl);
  if (j->gone) {
    j->c->must_close = true;
    return 499; /* nginx's "client closed request", for the log only */
  }
  return finish ? finish_ok(j, finish) : 200;
}

void job_free(job *j) {
  for (int i = 1; j->more && i < j->n; i++) {
    sbuf_free(&j->more[i - 1].content);
    sbuf_free(&j->more[i - 1].reasoning_text);
  }
  free(j->more);
  tools_free(j);
  free(j->json_text);
  free(j->prompt);
  sbuf_free(&j->out);
  sbuf_free(&j->pre);
  sbuf_free(&j->post);
  sbuf_free(&j->content);
  sbuf_free(&j->reasoning);
}
