/*
 * serve.c - the connection loop and the routes: health, models, admin,
 * cancel, and the validation half of chat completions (turning a request
 * body into a job that stream.c runs).
 *
 * Error bodies follow the dialect: MTPLX (FastAPI) answers
 * {"error":{"message","type","code","param"}} and keeps the connection;
 * llama-server answers {"error":{"code","message","type"}} with
 * "Connection: close", so the client's reconnect path gets exercised.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

static bool is_llama(const server *s) { return s->cfg.dialect == DIALECT_LLAMA; }

static int send_json(conn *c, int status, cJSON *body, const char *extra) {
  char *txt = cJSON_PrintUnformatted(body);
  cJSON_Delete(body);
  const char *ct = is_llama(c->srv) ? "application/json; charset=utf-8" : "application/json";
  http_send(c, status, ct, extra, txt, strlen(txt));
  free(txt);
  return status;
}

/* An error in the dialect's shape. code: MTPLX's string code (NULL = the
 * status number); fields: extra members for the error object (taken). */
static int send_error_ex(conn *c, int status, const char *msg, const char *type, const char *code, cJSON *fields) {
  cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
  if (is_llama(c->srv)) {
    cJSON_AddNumberToObject(e, "code", status);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    c->must_close = true;
  } else {
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNumberToObject(e, "code", status);
    cJSON_AddNullToObject(e, "param");
  }
  for (cJSON *f = fields ? fields->child : NULL; f; f = f->next)
    cJSON_AddItemToObject(e, f->string, cJSON_Duplicate(f, 1));
  cJSON_Delete(fields);
  char ra[48];
  snprintf(ra, sizeof ra, "Retry-After: %ld\r\n", c->srv->cfg.retry_after);
  return send_json(c, status, root, status == 429 || status == 503 ? ra : NULL);
}

int send_error(conn *c, int status, const char *msg, const char *type, const char *code) {
  return send_error_ex(c, status, msg, type, code, NULL);
}

static const char *type_for(int status) {
  switch (status) {
  case 401: return "authentication_error";
  case 404: return "not_found_error";
  case 429: return "rate_limit_error";
  case 503: return "unavailable_error";
  default: return status < 500 ? "invalid_request_error" : "server_error";
  }
}

/* "Retry-After: ...\r\n" for an error answer: the retry-after= fault
 * ("N" as is, "date+N" as the HTTP-date N seconds ahead), else
 * --retry-after (default 1 s) for 429/503, else none. */
static const char *retry_after(const sim_faults *f, long dflt, int status, char *out, size_t n) {
  long ahead;
  if (!f->retry_after[0]) {
    if (status != 429 && status != 503) return NULL;
    snprintf(out, n, "Retry-After: %ld\r\n", dflt);
    return out;
  }
  if (strncmp(f->retry_after, "date+", 5) != 0) {
    snprintf(out, n, "Retry-After: %s\r\n", f->retry_after);
    return out;
  }
  ahead = strtol(f->retry_after + 5, NULL, 10);
  time_t t = time(NULL) + ahead;
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, n, "Retry-After: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
  return out;
}

/* The body of an http= fault other than JSON: a bare HTML fragment
 * (http-text), an nginx-style error page with a <title> (http-html), a
 * line of plain text (http-plain) or a web UI's page (html-page: msg is
 * its title). */
static int fault_body(const sim_faults *f, const char *msg, char *body, size_t n, const char **ctype) {
  int st = f->http_status;
  *ctype = "text/html";
  switch (f->http_body) {
  case HTTP_BODY_HTML_PAGE:
    return snprintf(body, n,
                    "<html>\r\n<head><title>%d %s</title></head>\r\n<body>\r\n"
                    "<center><h1>%d %s</h1></center>\r\n<hr><center>nginx</center>\r\n"
                    "</body>\r\n</html>\r\n",
                    st, msg, st, msg);
  case HTTP_BODY_PLAIN: *ctype = "text/plain; charset=utf-8"; return snprintf(body, n, "%s\n", msg);
  case HTTP_BODY_WEB_PAGE:
    *ctype = "text/html; charset=utf-8";
    return snprintf(body, n,
                    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>%s</title>\n"
                    "<script>window.app = {};</script>\n</head>\n<body>\n<div id=\"app\">Sign in to continue</div>\n"
                    "</body>\n</html>\n",
                    msg);
  default: return snprintf(body, n, "<html><body>%s</body></html>\n", msg);
  }
}

/* The http= / http-text= / http-html= / http-plain= faults: a failure
 * before any stream starts. */
static int send_http_fault(conn *c, const sim_faults *f) {
  const char *msg = f->http_msg[0]                       ? f->http_msg
                    : f->http_body == HTTP_BODY_WEB_PAGE ? "mirza-sim web UI"
                                                         : http_reason(f->http_status);
  char ra[96], body[1024];
  const char *extra = retry_after(f, c->srv->cfg.retry_after, f->http_status, ra, sizeof ra), *ctype;
  if (!f->http_text && !f->retry_after[0]) return send_error(c, f->http_status, msg, type_for(f->http_status), NULL);
  if (!f->http_text) { /* JSON error with a chosen Retry-After */
    char js[512];
    int jn = snprintf(js, sizeof js, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":%d}}", msg,
                      type_for(f->http_status), f->http_status);
    http_send(c, f->http_status, "application/json", extra, js, (size_t)jn);
    return f->http_status;
  }
  int n = fault_body(f, msg, body, sizeof body, &ctype);
  http_send(c, f->http_status, ctype, extra, body, (size_t)n);
  return f->http_status;
}

/* The redirect= fault: a 3xx with Location and a short text body. */
static int send_redirect(conn *c, const http_request *r, const sim_faults *f) {
  char loc[560], extra[600], body[600];
  if (f->location[0]) snprintf(loc, sizeof loc, "%s", f->location);
  else snprintf(loc, sizeof loc, "%s/moved", r->path);
  snprintf(extra, sizeof extra, "Location: %s\r\n", loc);
  int n = snprintf(body, sizeof body, "Redirecting to %s\n", loc);
  http_send(c, f->redirect, "text/plain", extra, body, (size_t)n);
  return f->redirect;
}

static int route_health(conn *c) {
  server *s = c->srv;
  cJSON *r = cJSON_CreateObject();
  if (is_llama(s)) {
    cJSON_AddStringToObject(r, "status", "ok");
    return send_json(c, 200, r, NULL);
  }
  cJSON_AddBoolToObject(r, "ok", 1);
  cJSON_AddStringToObject(r, "model", s->cfg.model_id);
  cJSON_AddNumberToObject(r, "context_window", (double)s->cfg.context_window);
  cJSON *st = cJSON_AddObjectToObject(r, "startup");
  cJSON_AddNumberToObject(st, "pid", s->cfg.health_pid ? (double)s->cfg.health_pid : (double)getpid());
  cJSON_AddStringToObject(st, "launch_id", s->launch_id);
  cJSON_AddBoolToObject(st, "ready", 1);
  cJSON_AddStringToObject(st, "server", "mirza-sim");
  return send_json(c, 200, r, NULL);
}

static int route_models(conn *c) {
  server *s = c->srv;
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "object", "list");
  cJSON *m = cJSON_CreateObject();
  cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "data"), m);
  cJSON_AddStringToObject(m, "id", s->cfg.model_id);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)time(NULL));
  cJSON_AddStringToObject(m, "owned_by", "mirza-sim");
  cJSON_AddNumberToObject(m, "context_length", (double)s->cfg.context_window);
  if (is_llama(s)) cJSON_AddNumberToObject(cJSON_AddObjectToObject(m, "meta"), "n_ctx", (double)s->cfg.context_window);
  return send_json(c, 200, r, NULL);
}

/* llama-server's GET /props (llama dialect): what a client reads to know
 * it talks to llama-server, its slots and its model. */
static int route_props(conn *c) {
  server *s = c->srv;
  cJSON *r = cJSON_CreateObject();
  cJSON *g = cJSON_AddObjectToObject(r, "default_generation_settings");
  cJSON_AddNumberToObject(g, "n_ctx", (double)s->cfg.context_window);
  cJSON_AddNumberToObject(r, "total_slots", (double)s->cfg.parallel);
  cJSON_AddBoolToObject(r, "endpoint_metrics", s->cfg.metrics); /* b9928's /props has it */
  char path[300];
  snprintf(path, sizeof path, "/models/%s.gguf", s->cfg.model_id);
  cJSON_AddStringToObject(r, "model_path", path);
  cJSON_AddStringToObject(r, "model_alias", s->cfg.model_id);
  cJSON_AddStringToObject(r, "build_info", "mirza-sim");
  return send_json(c, 200, r, NULL);
}

/* --route / --no-route: a path posed as another server's, or removed; -1
 * when the path is not one of them. */
static int custom_route(conn *c, const http_request *r) {
  const sim_config *cfg = &c->srv->cfg;
  for (int i = 0; i < cfg->n_no_routes; i++)
    if (strcmp(r->path, cfg->no_routes[i]) == 0) return send_error(c, 404, "Not Found", "not_found_error", NULL);
  size_t n = strlen(r->path);
  for (int i = 0; i < cfg->n_routes; i++) {
    const char *rt = cfg->routes[i], *body = strchr(rt, '=');
    if ((size_t)(body - rt) != n || strncmp(rt, r->path, n) != 0) continue;
    if (strcmp(r->method, "GET") != 0) return send_error(c, 405, "Method Not Allowed", "invalid_request_error", NULL);
    http_send(c, 200, "application/json", NULL, body + 1, strlen(body + 1));
    return 200;
  }
  return -1;
}

static int route_clear(conn *c, const char *id) {
  long n = sessions_clear(c->srv, id);
  if (!id) slots_clear(c->srv);
  cJSON *r = cJSON_CreateObject();
  cJSON_AddBoolToObject(r, "ok", 1);
  cJSON_AddNumberToObject(r, "sessions_cleared", (double)n);
  if (id) cJSON_AddStringToObject(r, "session_id", id);
  return send_json(c, 200, r, NULL);
}

static int route_cancel(conn *c, const char *id) {
  if (!inflight_cancel(c->srv, id))
    return send_error(c, 404, "request not found or already finished", "not_found_error", NULL);
  cJSON *r = cJSON_CreateObject();
  cJSON_AddBoolToObject(r, "ok", 1);
  cJSON_AddStringToObject(r, "request_id", id);
  cJSON_AddBoolToObject(r, "cancelled", 1);
  return send_json(c, 200, r, NULL);
}

/* ---- chat completions: validation ------------------------------------ */

static long json_long(const cJSON *o, const char *k, long dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

static const char *json_str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Text of the last user message (serialised when it is not a string): the
 * seed of the generated text. */
static char *last_user_text(const cJSON *messages) {
  const cJSON *last = NULL, *m;
  cJSON_ArrayForEach(m, messages) {
    const char *role = json_str(m, "role");
    if (role && strcmp(role, "user") == 0) last = m;
  }
  const cJSON *content = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
  if (cJSON_IsString(content)) return sim_strndup(content->valuestring, strlen(content->valuestring));
  return content ? cJSON_PrintUnformatted(content) : sim_strndup("", 0);
}

/* The prompt of a /v1/completions request: a string, or a list holding
 * one string; NULL otherwise. */
static const char *completion_prompt(const cJSON *body) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
  if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = p->child;
  return cJSON_IsString(p) ? p->valuestring : NULL;
}

/* Session id and where it came from; explicit ones are exclusive (409). */
static void pick_session(job *j, const http_request *r, const cJSON *body) {
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(body, "metadata");
  const char *id = http_get_header(r, "X-MTPLX-Session-Id"), *src = "header.x-mtplx-session-id";
  if (!id || !*id) id = json_str(meta, "session_id"), src = "body.metadata.session_id";
  if (!id || !*id) id = json_str(body, "user"), src = "body.user";
  /* llama-server knows no session: its slots' caches serve everyone (state.c) */
  if (is_llama(j->srv)) id = NULL;
  j->session_exclusive = id && *id && strcmp(src, "body.user") != 0;
  if (!id || !*id) id = NULL, src = NULL;
  j->has_session = id != NULL;
  snprintf(j->session, sizeof j->session, "%s", id ? id : "");
  j->session_source = src;
}

/* Faults: --fault, then the header, then the body's mirza_sim.fault. */
static int collect_faults(job *j, const http_request *r, const cJSON *ctl, char *err, size_t errlen) {
  j->f = j->srv->faults;
  const char *h = http_get_header(r, "X-Mirza-Sim-Fault");
  if (h && faults_parse(&j->f, h, err, errlen)) return -1;
  const char *b = json_str(ctl, "fault");
  if (b && faults_parse(&j->f, b, err, errlen)) return -1;
  long n = atomic_fetch_add(&j->srv->fail_count, 1) + 1;
  if (n <= j->srv->cfg.fail_first && !j->f.http_status) j->f.http_status = 429; /* --fail-first */
  return 0;
}

/* --crash-after N: arm the crash on the Nth chat request that is served
 * (one refused with an error, a 409 say, does not count). */
static void count_chat(job *j) {
  long n = atomic_fetch_add(&j->srv->chat_count, 1) + 1;
  if (j->srv->cfg.crash_after > 0 && n == j->srv->cfg.crash_after && j->f.crash_after < 0) j->f.crash_after = 3;
}

static bool thinking_on(const job *j, const cJSON *body) {
  if (!is_llama(j->srv)) return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "enable_thinking"));
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
  return !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(k, "enable_thinking"));
}

/* Dialect-specific field checks; returns an error message or NULL. */
static const char *check_fields(const job *j, const cJSON *body) {
  if (is_llama(j->srv)) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(k, "enable_thinking");
    return t && !cJSON_IsBool(t) ? "\"enable_thinking\" must be a boolean" : NULL;
  }
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
  if (!e || cJSON_IsNull(e)) return NULL;
  static const char *const ok[] = {"low", "medium", "high", "xhigh", "auto"};
  for (size_t i = 0; cJSON_IsString(e) && i < sizeof ok / sizeof *ok; i++)
    if (strcmp(e->valuestring, ok[i]) == 0) return NULL;
  return "reasoning_effort must be one of: low, medium, high, xhigh, auto";
}

/* n, logprobs and top_logprobs as OpenAI takes them (n > 1 on a chat
 * only); returns an error message or NULL. */
static const char *check_choices(const job *j, const cJSON *body) {
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(body, "n");
  const cJSON *top = cJSON_GetObjectItemCaseSensitive(body, "top_logprobs");
  if (n && !cJSON_IsNull(n) &&
      (!cJSON_IsNumber(n) || n->valuedouble < 1 || n->valuedouble > SIM_MAX_CHOICES ||
       n->valuedouble != (double)(int)n->valuedouble))
    return "n must be an integer from 1 to 16";
  if (j->completion && cJSON_IsNumber(n) && n->valuedouble > 1) return "n > 1 is not simulated on /v1/completions";
  if (top && !cJSON_IsNull(top) &&
      (!cJSON_IsNumber(top) || top->valuedouble < 0 || top->valuedouble > SIM_MAX_TOP_LOGPROBS))
    return "top_logprobs must be an integer from 0 to 20";
  return NULL;
}

/* The choices past the first (n > 1): each its own text, from
 * mirza_sim.texts[i] (else mirza_sim.text, else generated from its own
 * seed), its reasoning as choice 0's is planned (same length, own words). */
static void plan_choices(job *j, const cJSON *body, const cJSON *ctl, uint64_t seed) {
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(body, "n"), *texts = cJSON_GetObjectItemCaseSensitive(ctl, "texts");
  j->logprobs = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "logprobs")) && !j->completion;
  j->top_logprobs = j->logprobs ? (int)json_long(body, "top_logprobs", 0) : 0;
  j->n = cJSON_IsNumber(n) && !j->completion ? (int)n->valuedouble : 1;
  const cJSON *t0 = cJSON_GetArrayItem(texts, 0);
  if (cJSON_IsString(t0)) j->aseq.text = t0->valuestring, j->aseq.text_len = strlen(t0->valuestring);
  if (j->n < 2) return;
  j->more = calloc((size_t)j->n - 1, sizeof *j->more);
  if (!j->more) abort();
  for (int i = 1; i < j->n; i++) {
    sim_choice *c = &j->more[i - 1];
    uint64_t si = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)i);
    gen_init(&c->rseq.gen, si ^ 0x5eedull, j->rseq.gen.remaining, true, 0);
    gen_init(&c->aseq.gen, si, j->aseq.gen.remaining, false, 0);
    if (j->rseq.text) c->rseq.text = j->rseq.text, c->rseq.text_len = j->rseq.text_len;
    const cJSON *ti = cJSON_GetArrayItem(texts, i);
    const char *own = cJSON_IsString(ti) ? ti->valuestring : json_str(ctl, "text");
    if (own) c->aseq.text = own, c->aseq.text_len = strlen(own);
    else if (j->json_text) c->aseq.text = j->aseq.text, c->aseq.text_len = j->aseq.text_len;
    c->reasoning = j->has_reasoning;
  }
}

static void make_id(job *j, const http_request *r) {
  const char *rid = http_get_header(r, "X-MTPLX-Request-Id");
  long n = atomic_fetch_add(&j->srv->id_count, 1) + 1;
  const char *pfx = j->completion ? "cmpl-" : "chatcmpl-";
  if (!is_llama(j->srv)) {
    if (rid && *rid) snprintf(j->id, sizeof j->id, "%s%.180s", pfx, rid);
    else snprintf(j->id, sizeof j->id, "%s%ld", pfx, n);
    return;
  }
  static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t h = gen_hash((uint64_t)n * 7919u, j->srv->launch_id, strlen(j->srv->launch_id));
  size_t pl = strlen(pfx);
  memcpy(j->id, pfx, pl);
  for (int i = 0; i < 32; i++, h = h * 6364136223846793005ull + 1442695040888963407ull)
    j->id[pl + i] = al[(h >> 33) % 62];
  j->id[pl + 32] = '\0';
}

/* Where the reasoning and the answer come from (mirza_sim overrides, loop
 * and utf8-split faults). Strings point into the request's cJSON tree. */
static void plan_text(job *j, const cJSON *body, const cJSON *ctl, const char *user) {
  const sim_config *cfg = &j->srv->cfg;
  uint64_t seed = gen_hash(cfg->seed, user, strlen(user));
  const char *rtext = json_str(ctl, "reasoning"), *atext = json_str(ctl, "text");
  j->has_reasoning = j->thinking || rtext;
  long rn = json_long(ctl, "reasoning_tokens", cfg->reasoning_tokens);
  long an = json_long(ctl, "answer_tokens", cfg->answer_tokens);
  tokseq *loopseq = j->has_reasoning ? &j->rseq : &j->aseq;
  if (j->f.loop && j->has_reasoning && !cJSON_GetObjectItemCaseSensitive(ctl, "reasoning_tokens"))
    rn = 24; /* a few normal lines, then the loop */
  if (j->f.loop && !j->has_reasoning && !cJSON_GetObjectItemCaseSensitive(ctl, "answer_tokens")) an = 24;
  char rsep = !j->f.loop ? 0 : j->f.loop == LOOP_LINE ? '\n' : ' ';
  gen_init(&j->rseq.gen, seed ^ 0x5eedull, rn, true, rsep);
  gen_init(&j->aseq.gen, seed, an, false, j->f.loop && !j->has_reasoning ? ' ' : 0);
  if (rtext) j->rseq.text = rtext, j->rseq.text_len = strlen(rtext);
  const cJSON *rf = cJSON_GetObjectItemCaseSensitive(body, "response_format");
  size_t jn = 0;
  if (!atext && rf && !j->f.schema_ignore) j->json_text = schema_answer(rf, seed, j->f.schema_break, &jn);
  if (j->json_text && j->f.schema_cut) jn = schema_cut(j->json_text, jn);
  if (atext) j->aseq.text = atext, j->aseq.text_len = strlen(atext);
  else if (j->json_text) j->aseq.text = j->json_text, j->aseq.text_len = jn; /* an answer in shape */
  else if (j->f.utf8_split) j->aseq.pre = SIM_UTF8_PREFIX, j->aseq.pre_len = strlen(SIM_UTF8_PREFIX);
  if (j->f.loop) {
    loopseq->loop = j->f.loop == LOOP_LINE ? SIM_LOOP_LINE : SIM_LOOP_PHRASE;
    loopseq->loop_len = strlen(loopseq->loop);
  }
  plan_choices(j, body, ctl, seed);
}

/* Fill the job from the request; returns 0 or the HTTP status already
 * answered. */
static int prepare_chat(job *j, const http_request *r, cJSON *body) {
  char err[300];
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
  const char *ptext = j->completion ? completion_prompt(body) : NULL;
  if (j->completion && !ptext)
    return send_error(j->c, 400, "'prompt' is required: a string, or a list of one string", "invalid_request_error",
                      NULL);
  if (!j->completion && (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0))
    return send_error(j->c, 400, "'messages' is required", "invalid_request_error", NULL);
  const cJSON *ctl = cJSON_GetObjectItemCaseSensitive(body, "mirza_sim");
  if (collect_faults(j, r, ctl, err, sizeof err)) return send_error(j->c, 400, err, "invalid_request_error", NULL);
  const char *bad = check_fields(j, body);
  if (!bad) bad = check_choices(j, body);
  if (bad) return send_error(j->c, 400, bad, "invalid_request_error", NULL);
  http_faults(j->c, &j->f);
  if (j->f.redirect) return send_redirect(j->c, r, &j->f);
  if (j->f.http_status) return send_http_fault(j->c, &j->f);
  char *prompt = j->prompt = ptext ? sim_strndup(ptext, strlen(ptext)) : cJSON_PrintUnformatted(messages);
  size_t plen = j->prompt_len = strlen(prompt);
  j->prompt_tokens = plen / 4 > 0 ? (long)(plen / 4) : 1;
  int st = 0;
  long ctx = j->srv->cfg.context_window;
  if (is_llama(j->srv) ? j->prompt_tokens > ctx : j->prompt_tokens >= ctx) {
    if (is_llama(j->srv)) {
      snprintf(err, sizeof err,
               "request (%ld tokens) exceeds the available context size (%ld tokens), try "
               "increasing it",
               j->prompt_tokens, ctx);
      cJSON *fields = cJSON_CreateObject();
      cJSON_AddNumberToObject(fields, "n_prompt_tokens", (double)j->prompt_tokens);
      cJSON_AddNumberToObject(fields, "n_ctx", (double)ctx);
      st = send_error_ex(j->c, 400, err, "exceed_context_size_error", NULL, fields);
    } else {
      snprintf(err, sizeof err,
               "Prompt contains %ld tokens, but the served context window is %ld tokens. The "
               "prompt must be shorter than the context window to leave room for at least one "
               "generated token.",
               j->prompt_tokens, ctx);
      st = send_error(j->c, 400, err, "invalid_request_error", "HTTPException");
    }
  }
  pick_session(j, r, body);
  if (!st && j->has_session) {
    long common = 0;
    if (session_begin(j->srv, j->session, j->session_exclusive, prompt, plen, &common))
      st = send_error(j->c, 409, "session is already generating", "conflict_error", "SessionBusy");
    j->cached_tokens = common / 4 < j->prompt_tokens ? common / 4 : j->prompt_tokens - 1;
  }
  if (st) j->has_session = false; /* nothing to release */
  return st;
}

/* Stream, limits, rates and the text plan: everything after validation. */
static void configure_chat(job *j, const http_request *r, const cJSON *body) {
  const sim_config *cfg = &j->srv->cfg;
  const cJSON *ctl = cJSON_GetObjectItemCaseSensitive(body, "mirza_sim");
  j->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream"));
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
  j->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
  j->thinking = !j->completion && thinking_on(j, body);
  const char *cc = http_get_header(r, "X-MTPLX-Allow-Client-Controls");
  j->client_controls = cc && strcmp(cc, "1") == 0;
  long max = json_long(body, "max_completion_tokens", -1);
  max = json_long(body, "max_tokens", max);
  j->cap = cfg->context_window - j->prompt_tokens;
  if (max > 0 && max < j->cap) j->cap = max;
  const cJSON *rate = cJSON_GetObjectItemCaseSensitive(ctl, "tok_rate");
  j->rate = cJSON_IsNumber(rate) && rate->valuedouble >= 0 ? rate->valuedouble : cfg->tok_rate;
  j->ttft_ms = json_long(ctl, "ttft_ms", cfg->ttft_ms);
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(ctl, "prefill_rate");
  j->prefill_rate = cJSON_IsNumber(pr) && pr->valuedouble >= 0 ? pr->valuedouble : cfg->prefill_rate;
  /* llama-server's id_slot: that slot (modulo its count), waited for while
   * busy; -1 or none: the one get_available_slot picks. MTPLX has none. */
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(body, "id_slot");
  bool pinned = is_llama(j->srv) && cJSON_IsNumber(ids) && ids->valuedouble >= 0 && ids->valuedouble < 1e9;
  j->id_slot = pinned ? (int)ids->valuedouble : -1;
  j->frames_per_chunk = json_long(ctl, "frames_per_chunk", cfg->frames_per_chunk);
  const cJSON *co = cJSON_GetObjectItemCaseSensitive(ctl, "coalesce_writes");
  j->coalesce_writes = cJSON_IsBool(co) ? cJSON_IsTrue(co) : cfg->coalesce_writes;
  j->c->coalesce = j->coalesce_writes && j->rate <= 0 && !j->c->gzip; /* http_faults cleared it */
  j->created = (long)time(NULL);
  make_id(j, r);
  char *user = j->completion ? sim_strndup(j->prompt, j->prompt_len)
                             : last_user_text(cJSON_GetObjectItemCaseSensitive(body, "messages"));
  plan_text(j, body, ctl, user);
  free(user);
  tools_plan(j, body);
}

/* A body that is not a JSON object, in the dialect's words. */
int serve_bad_json(conn *c) {
  if (is_llama(c->srv))
    return send_error(c, 500,
                      "[json.exception.parse_error.101] parse error: syntax error while "
                      "parsing value - invalid JSON request body",
                      "server_error", NULL);
  return send_error(c, 400, "Invalid JSON in request body", "invalid_request_error", "JSONDecodeError");
}

/* The faults of a request other than a chat (--fault, the header, the
 * body's mirza_sim.fault) into f, and those that answer before any body
 * (a bad spec, redirect=, http=...): 0, or the status already answered. */
int serve_faults(conn *c, const http_request *r, const cJSON *ctl, sim_faults *f) {
  char err[300];
  *f = c->srv->faults;
  const char *h = http_get_header(r, "X-Mirza-Sim-Fault"), *b = json_str(ctl, "fault");
  if ((h && faults_parse(f, h, err, sizeof err)) || (b && faults_parse(f, b, err, sizeof err)))
    return send_error(c, 400, err, "invalid_request_error", NULL);
  http_faults(c, f);
  if (f->redirect) return send_redirect(c, r, f);
  if (f->http_status) return send_http_fault(c, f);
  return 0;
}

static int route_chat(conn *c, const http_request *r, bool completion) {
  cJSON *body = cJSON_ParseWithLength(r->body ? r->body : "", r->body_len);
  if (!cJSON_IsObject(body)) {
    cJSON_Delete(body);
    return serve_bad_json(c);
  }
  job *j = calloc(1, sizeof *j);
  if (!j) abort();
  j->srv = c->srv;
  j->c = c;
  j->completion = completion;
  int st = prepare_chat(j, r, body);
  if (!st) {
    count_chat(j);
    configure_chat(j, r, body);
    st = j->f.replay[0] ? replay_run(j) : job_run(j);
  }
  if (j->has_session && j->session_exclusive) session_end(c->srv, j->session);
  job_free(j);
  free(j);
  cJSON_Delete(body);
  return st;
}

/* ---- dispatch ---------------------------------------------------------- */

/* llama-server's answer while the model loads, byte for byte as captured
 * (member order differs from its other errors), in both dialects. */
static int send_loading(conn *c) {
  static const char body[] = "{\"error\":{\"message\":\"Loading model\",\"type\":\"unavailable_error\",\"code\":503}}";
  http_send(c, 503, "application/json; charset=utf-8", "Retry-After: 1\r\n", body, sizeof body - 1);
  return 503;
}

static bool authorized(const server *s, const http_request *r) {
  if (!s->cfg.api_key) return true;
  const char *a = http_get_header(r, "Authorization");
  return a && strncmp(a, "Bearer ", 7) == 0 && strcmp(a + 7, s->cfg.api_key) == 0;
}

/* "/prefix/{id}/suffix" -> id copied into out; false when no match. */
static bool match_id(const char *path, const char *prefix, const char *suffix, char *out, size_t outlen) {
  size_t pl = strlen(prefix), sl = strlen(suffix), n = strlen(path);
  if (n <= pl + sl || strncmp(path, prefix, pl) != 0 || strcmp(path + n - sl, suffix) != 0) return false;
  size_t idl = n - pl - sl;
  if (idl >= outlen || memchr(path + pl, '/', idl)) return false;
  memcpy(out, path + pl, idl);
  out[idl] = '\0';
  return true;
}

static int route(conn *c, const http_request *r) {
  server *s = c->srv;
  const char *p = r->path;
  bool get = strcmp(r->method, "GET") == 0, post = strcmp(r->method, "POST") == 0;
  char id[256];
  if (!authorized(s, r)) return send_error(c, 401, "Invalid API Key", "authentication_error", NULL);
  int replayed = s->recorded ? recorded_route(c, r) : -1;
  if (replayed >= 0) return replayed;
  if ((sim_now() - s->t_start) * 1000.0 < (double)s->cfg.health_delay_ms) return send_loading(c);
  int custom = s->cfg.n_routes || s->cfg.n_no_routes ? custom_route(c, r) : -1;
  if (custom >= 0) return custom;
  if (strcmp(p, "/health") == 0 && get) return route_health(c);
  if (is_llama(s) && strcmp(p, "/props") == 0 && get) return route_props(c);
  if ((is_llama(s) || s->cfg.vllm_metrics) && strcmp(p, "/metrics") == 0 && get) return route_metrics(c);
  if (strcmp(p, "/v1/models") == 0 && get) return route_models(c);
  if (strcmp(p, "/v1/chat/completions") == 0 && post) return route_chat(c, r, false);
  if (strcmp(p, "/v1/completions") == 0 && post) return route_chat(c, r, true);
  if (strcmp(p, "/v1/embeddings") == 0 && post) return route_embeddings(c, r);
  if (!is_llama(s) && post && strcmp(p, "/admin/cache/clear") == 0) return route_clear(c, NULL);
  if (!is_llama(s) && post && match_id(p, "/admin/sessions/", "/clear", id, sizeof id)) return route_clear(c, id);
  if (!is_llama(s) && post && match_id(p, "/v1/mtplx/cancel/", "", id, sizeof id)) return route_cancel(c, id);
  bool known = strcmp(p, "/health") == 0 || strcmp(p, "/v1/models") == 0 || strcmp(p, "/v1/chat/completions") == 0 ||
               strcmp(p, "/v1/completions") == 0 ||
               (strcmp(p, "/v1/embeddings") == 0 && !(s->cfg.no_embeddings && !is_llama(s)));
  if (known) return send_error(c, 405, "Method Not Allowed", "invalid_request_error", NULL);
  return send_error(c, 404, "Not Found", "not_found_error", NULL);
}

/* Close politely: FIN first, then drain what the peer still sends so that
 * close() does not turn into a reset that eats our last response. */
static void close_gracefully(int fd) {
  shutdown(fd, SHUT_WR);
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char sink[4096];
  for (int i = 0; i < 64 && recv(fd, sink, sizeof sink, 0) > 0; i++)
    ;
  close(fd);
}

void serve_connection(server *s, int fd) {
  conn c = {.fd = fd, .srv = s};
  http_request r;
  while (!c.must_close) {
    int st = http_read_request(&c, &r);
    if (st < 0) break;
    if (st > 0) {
      c.must_close = true;
      send_error(&c, st, http_reason(st), type_for(st), NULL);
      break;
    }
    c.must_close = !r.keep_alive;
    http_faults(&c, NULL);
    double t0 = sim_now();
    int status = route(&c, &r);
    if (s->cfg.verbosity >= 2)
      fprintf(stderr, "mirza-sim: %s %s %d %.1fms\n", r.method, r.target, status, (sim_now() - t0) * 1000.0);
  }
  if (c.fd >= 0) close_gracefully(c.fd);
  free(c.buf);
  free(c.wire.p);
}
