/*
 * finish.c - the end of a chat completion: usage, MTPLX's mtplx_stats,
 * llama-server's timings, the final SSE frames and the non-streamed body.
 *
 * These run once per request, so they use cJSON; the member order follows
 * the captures in tests/fixtures/traces because some clients (and
 * humans diffing streams) notice. Numbers are rounded for readability.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "stream.h"

static bool llama(const job *j) { return j->srv->cfg.dialect == DIALECT_LLAMA; }

static cJSON *usage_obj(const job *j) {
  cJSON *u = cJSON_CreateObject();
  double p = (double)j->prompt_tokens, c = (double)(j->ntok + j->ntok_more); /* every choice's */
  if (llama(j)) {
    cJSON_AddNumberToObject(u, "completion_tokens", c);
    cJSON_AddNumberToObject(u, "prompt_tokens", p);
  } else {
    cJSON_AddNumberToObject(u, "prompt_tokens", p);
    cJSON_AddNumberToObject(u, "completion_tokens", c);
  }
  cJSON_AddNumberToObject(u, "total_tokens", p + c);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens",
                          (double)j->cached_tokens);
  return u;
}

static void add_rate(cJSON *o, const char *k, double n, double secs) {
  if (secs > 0) cJSON_AddNumberToObject(o, k, sim_round(n / secs, 1));
  else cJSON_AddNullToObject(o, k);
}

static cJSON *int_triple(long a, long b, long c) {
  int v[3] = {(int)a, (int)b, (int)c};
  return cJSON_CreateIntArray(v, 3);
}

/* MTPLX's per-request statistics. The MTP acceptance counts are invented
 * but consistent: drafted at depth d+1 = accepted at depth d. */
static cJSON *stats_obj(const job *j, double t_end) {
  cJSON *s = cJSON_CreateObject();
  double dec = t_end - j->t_first, n = (double)(j->ntok + j->ntok_more);
  long a1 = j->ntok * 53 / 100, a2 = j->ntok * 33 / 100, a3 = j->ntok * 15 / 100;
  cJSON_AddStringToObject(s, "generation_mode", "mtp");
  cJSON_AddNumberToObject(s, "mtp_depth", 3);
  cJSON_AddNumberToObject(s, "prompt_tokens", (double)j->prompt_tokens);
  cJSON_AddNumberToObject(s, "completion_tokens", n);
  cJSON_AddNumberToObject(s, "reasoning_tokens", (double)j->nreason);
  cJSON_AddNumberToObject(s, "answer_tokens", (double)j->nanswer);
  add_rate(s, "tok_s", n, dec);
  add_rate(s, "decode_tok_s", n, dec);
  add_rate(s, "end_to_end_tok_s", n, t_end - j->t0);
  cJSON_AddNumberToObject(s, "ttft_s", sim_round(j->t_first - j->t0, 3));
  cJSON_AddNumberToObject(s, "prompt_eval_time_s", sim_round(j->t_first - j->t_slot, 3));
  cJSON_AddNumberToObject(s, "decode_elapsed_s", sim_round(dec, 3));
  cJSON_AddItemToObject(s, "accepted_by_depth", int_triple(a1, a2, a3));
  cJSON_AddItemToObject(s, "drafted_by_depth", int_triple(a1 + j->ntok / 12, a1, a2));
  if (j->has_session) cJSON_AddStringToObject(s, "session_id", j->session);
  else cJSON_AddNullToObject(s, "session_id");
  if (j->session_source) cJSON_AddStringToObject(s, "request_session_source", j->session_source);
  else cJSON_AddNullToObject(s, "request_session_source");
  cJSON_AddBoolToObject(s, "session_cache_hit", j->cached_tokens > 0);
  cJSON_AddNumberToObject(s, "cached_tokens", (double)j->cached_tokens);
  cJSON_AddNumberToObject(s, "new_prefill_tokens", (double)(j->prompt_tokens - j->cached_tokens));
  cJSON_AddStringToObject(s, "cache_source", j->cached_tokens > 0 ? "ram" : "none");
  if (j->cached_tokens > 0) cJSON_AddNullToObject(s, "cache_miss_reason");
  else cJSON_AddStringToObject(s, "cache_miss_reason", j->has_session ? "prefix_mismatch" : "no_session");
  cJSON_AddStringToObject(s, "mtplx_control_owner", j->client_controls ? "client" : "server");
  return s;
}

static cJSON *timings_obj(const job *j, double t_end) {
  cJSON *t = cJSON_CreateObject();
  double pn = (double)(j->prompt_tokens - j->cached_tokens);
  double pms = (j->t_first - j->t_slot) * 1000.0, dms = (t_end - j->t_first) * 1000.0;
  double n = (double)(j->ntok + j->ntok_more);
  if (pn < 1) pn = 1;
  cJSON_AddNumberToObject(t, "cache_n", (double)j->cached_tokens);
  cJSON_AddNumberToObject(t, "prompt_n", pn);
  cJSON_AddNumberToObject(t, "prompt_ms", sim_round(pms, 3));
  cJSON_AddNumberToObject(t, "prompt_per_token_ms", sim_round(pms / pn, 5));
  cJSON_AddNumberToObject(t, "prompt_per_second", pms > 0 ? sim_round(pn * 1000 / pms, 3) : 0);
  cJSON_AddNumberToObject(t, "predicted_n", n);
  cJSON_AddNumberToObject(t, "predicted_ms", sim_round(dms, 3));
  cJSON_AddNumberToObject(t, "predicted_per_token_ms", n > 0 ? sim_round(dms / n, 5) : 0);
  cJSON_AddNumberToObject(t, "predicted_per_second", dms > 0 ? sim_round(n * 1000 / dms, 3) : 0);
  return t;
}

/* Print obj's members as ",\"a\":..,\"b\":.." to append to a frame. */
static char *members(cJSON *obj) {
  char *s = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  size_t n = strlen(s);
  s[0] = n > 2 ? ',' : '\0';
  if (n > 2) s[n - 1] = '\0';
  return s;
}

static void add_frame_extra(job *j, const char *finish, cJSON *extra) {
  char *x = members(extra);
  if (j->completion) {
    text_frame(j, "", 0, finish, x);
    free(x);
    return;
  }
  frame_open(j, finish);
  sbuf_add(&j->out, "{}", 2);
  frame_close(j, finish, x);
  free(x);
}

/* A session is free again before its answer's last bytes go out: a client
 * that reads the end and at once sends the next turn of the same session
 * must not find it busy (409) because this thread has not returned yet. */
static void release_session(job *j) {
  if (j->has_session && j->session_exclusive) session_end(j->srv, j->session);
  j->has_session = false;
}

static void end_stream(job *j, bool done) {
  if (done) sbuf_adds(&j->out, "data: [DONE]\n\n");
  release_session(j);
  job_flush(j);
  if (j->gone || http_end_chunked(j->c)) j->c->must_close = true;
}

static void llama_final(job *j, const char *finish, double t_end) {
  if (!j->role_sent && !j->completion) role_frame(j);
  cJSON *x = cJSON_CreateObject();
  if (!j->include_usage) {
    cJSON_AddItemToObject(x, "timings", timings_obj(j, t_end));
    add_frame_extra(j, finish, x);
    return;
  }
  add_frame_extra(j, finish, x); /* bare finish frame; usage follows */
  cJSON *u = cJSON_CreateObject();
  cJSON_AddItemToObject(u, "usage", usage_obj(j));
  cJSON_AddItemToObject(u, "timings", timings_obj(j, t_end));
  char *m = members(u);
  sbuf_adds(&j->out, "data: {\"choices\":[]");
  sbuf_add(&j->out, j->post.p + 2, j->post.len - 2); /* skip the "}]" closing a choice */
  sbuf_adds(&j->out, m);
  sbuf_add(&j->out, "}\n\n", 3);
  free(m);
}

/* The assistant message of a choice (its text and reasoning; the tool
 * calls are choice 0's). llama-server (common_chat_msg::to_json_oaicompat)
 * puts reasoning_content, when there is some, before content; MTPLX after
 * it, even when empty. */
static cJSON *message_of(const job *j, const sbuf *content, const sbuf *reasoning, bool first) {
  cJSON *m = cJSON_CreateObject();
  const char *think = reasoning->p ? reasoning->p : "";
  cJSON_AddStringToObject(m, "role", "assistant");
  if (llama(j) && *think) cJSON_AddStringToObject(m, "reasoning_content", think);
  cJSON *calls = first ? tools_message_calls(j) : NULL;
  if (calls) cJSON_AddNullToObject(m, "content"); /* as OpenAI and llama-server: calls, no text */
  else cJSON_AddStringToObject(m, "content", content->p ? content->p : "");
  if (!llama(j) && j->has_reasoning) cJSON_AddStringToObject(m, "reasoning_content", think);
  if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
  return m;
}

static cJSON *message_obj(const job *j) { return message_of(j, &j->content, &j->reasoning, true); }

/* The choices past the first of a non-streamed chat.completion (n > 1),
 * in the dialect's member order. */
static void more_choices(const job *j, cJSON *list) {
  for (int i = 1; i < j->n; i++) {
    const sim_choice *c = &j->more[i - 1];
    cJSON *ch = cJSON_CreateObject();
    if (llama(j)) cJSON_AddStringToObject(ch, "finish_reason", c->finish ? c->finish : "stop");
    cJSON_AddNumberToObject(ch, "index", i);
    cJSON_AddItemToObject(ch, "message", message_of(j, &c->content, &c->reasoning_text, false));
    if (!llama(j)) cJSON_AddStringToObject(ch, "finish_reason", c->finish ? c->finish : "stop");
    cJSON_AddItemToArray(list, ch);
  }
}

/* A /v1/completions choice: text, index, logprobs, finish_reason. */
static cJSON *text_choice(const job *j, const char *finish) {
  cJSON *ch = cJSON_CreateObject();
  if (!llama(j)) cJSON_AddNumberToObject(ch, "index", 0);
  cJSON_AddStringToObject(ch, "text", j->content.p ? j->content.p : "");
  if (llama(j)) cJSON_AddNumberToObject(ch, "index", 0);
  cJSON_AddNullToObject(ch, "logprobs");
  cJSON_AddStringToObject(ch, "finish_reason", finish);
  return ch;
}

/* The non-streamed chat.completion (or text_completion) in the dialect's
 * member order. */
static int send_body(job *j, const char *finish, double t_end) {
  cJSON *r = cJSON_CreateObject(), *ch = j->completion ? text_choice(j, finish) : cJSON_CreateObject();
  const char *object = j->completion ? "text_completion" : "chat.completion";
  if (!llama(j)) {
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)j->created);
    cJSON_AddStringToObject(r, "model", j->srv->cfg.model_id);
    if (!j->completion) {
      cJSON_AddNumberToObject(ch, "index", 0);
      cJSON_AddItemToObject(ch, "message", message_obj(j));
      cJSON_AddStringToObject(ch, "finish_reason", finish);
    }
  } else if (!j->completion) {
    cJSON_AddStringToObject(ch, "finish_reason", finish);
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON_AddItemToObject(ch, "message", message_obj(j));
  }
  cJSON *list = cJSON_AddArrayToObject(r, "choices");
  cJSON_AddItemToArray(list, ch);
  if (j->more && !j->completion) more_choices(j, list);
  if (llama(j)) {
    cJSON_AddNumberToObject(r, "created", (double)j->created);
    cJSON_AddStringToObject(r, "model", j->srv->cfg.model_id);
    cJSON_AddStringToObject(r, "system_fingerprint", "b9928-mirza-sim");
    cJSON_AddStringToObject(r, "object", object);
  }
  cJSON_AddItemToObject(r, "usage", usage_obj(j));
  if (llama(j)) {
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddItemToObject(r, "timings", timings_obj(j, t_end));
  } else {
    cJSON_AddItemToObject(r, "mtplx_stats", stats_obj(j, t_end));
  }
  char *txt = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  const char *ct = llama(j) ? "application/json; charset=utf-8" : "application/json";
  release_session(j);
  http_send(j->c, 200, ct, NULL, txt, strlen(txt));
  free(txt);
  return 200;
}

/* Normal end (stop, length, cancelled): final frame(s) and [DONE]. */
int finish_ok(job *j, const char *finish) {
  double t_end = sim_now();
  if (!j->stream) return send_body(j, finish, t_end);
  if (llama(j)) {
    llama_final(j, finish, t_end);
  } else {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddItemToObject(x, "usage", usage_obj(j));
    cJSON_AddItemToObject(x, "mtplx_stats", stats_obj(j, t_end));
    add_frame_extra(j, finish, x);
  }
  end_stream(j, !j->f.no_done);
  return 200;
}

/* The error-after fault: MTPLX's finish_reason "error" frame then [DONE];
 * llama-server's bare error event and no [DONE]; a 500 when not streaming. */
void finish_error(job *j) {
  char msg[128];
  snprintf(msg, sizeof msg, "simulated failure after %ld tokens", j->frames);
  if (!j->stream) {
    release_session(j);
    send_error(j->c, 500, msg, "server_error", "SimulatedError");
    return;
  }
  cJSON *x = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(x, "error");
  if (llama(j)) {
    cJSON_AddNumberToObject(e, "code", 500);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", "server_error");
    char *s = cJSON_PrintUnformatted(x);
    cJSON_Delete(x);
    sbuf_printf(&j->out, "data: %s\n\n", s);
    free(s);
    end_stream(j, false);
    return;
  }
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", "server_error");
  cJSON_AddStringToObject(e, "code", "SimulatedError");
  cJSON_AddNullToObject(e, "param");
  add_frame_extra(j, "error", x);
  end_stream(j, true);
}
