/*
 * response.c - what a response means: libcurl's write and header callbacks
 * for one transfer, and the end of it (see client_int.h for the units).
 *
 * The status and content type, read at the first body byte (classify),
 * choose how the body is read: an SSE stream (sse.c -> decode.c or the
 * fastframe.c token path -> queued events), a JSON body where a stream was
 * asked for (the same events), an error body (kept up to ERRBODY_MAX for
 * the message and ev.error), or a plain response (kept whole, up to
 * PLAINBODY_MAX). A 2xx that is not what was asked for (a web UI's page
 * where a stream was awaited: foreign) is kept as an error body and ends
 * as a "protocol" error naming its type and <title>. mz_on_complete turns
 * how the transfer ended into the one terminal event; every path that
 * ends a stream flushes the UTF-8 carry first, so nothing received is
 * dropped.
 *
 * No callback here ever leaves C (no Lua); an error is recorded as the
 * terminal event and, when the transfer must stop, s->abort makes the
 * write callback return 0 (libcurl then ends it with CURLE_WRITE_ERROR,
 * which the first cause, already set, outranks). Once a stream has its
 * terminal event the rest of the body is read and dropped, so the
 * connection can be reused. Response headers are kept (names in
 * lowercase, up to HEADERS_MAX) for ev.headers and Retry-After.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "client_int.h"
#include "decode.h"
#include "fastframe.h"
#include "httperr.h"
#include "mirza.h"
#include "nofile.h"

#define ERRBODY_MAX (64u << 10)   /* error bodies: what we keep */
#define HEADERS_MAX (16u << 10)   /* response headers kept for ev.headers */
#define PLAINBODY_MAX (64u << 20) /* plain responses */

/* ------------------------------------------------------- frame handling */

static void replace(cJSON **slot, cJSON *v) {
  cJSON_Delete(*slot);
  *slot = v;
}

/* Take a top-level item out of the frame's tree (NULL-safe). */
static cJSON *take(mz_frame *f, const cJSON *it) {
  return it ? cJSON_DetachItemViaPointer(f->root, (cJSON *)it) : NULL;
}

static int known_key(const char *k) {
  static const char *const keys[] = {"id",      "object", "created", "model",       "system_fingerprint",
                                     "choices", "usage",  "timings", "mtplx_stats", "mtplx_progress",
                                     "error",   NULL};
  for (int i = 0; keys[i]; i++)
    if (strcmp(k, keys[i]) == 0) return 1;
  return 0;
}

/* Unknown top-level fields are kept (last value wins) in done.extra. */
static void keep_unknown(mz_stream *s, mz_frame *f) {
  if (!s->extra && !(s->extra = cJSON_CreateObject())) return;
  for (cJSON *it = f->root->child; it;) {
    cJSON *nx = it->next;
    if (it->string && !known_key(it->string)) {
      const char *k = it->string;
      cJSON_DeleteItemFromObjectCaseSensitive(s->extra, k);
      cJSON *v = cJSON_DetachItemViaPointer(f->root, it);
      cJSON_AddItemToObject(s->extra, v->string, v);
    }
    it = nx;
  }
}

/* ---- what the server said of itself and of each choice ----
 * s->meta, made by the first frame that says any of it: the model that
 * answered, its system_fingerprint and created (each the first frame's
 * that has it), and "choices": per choice, by index, its finish_reason
 * and its logprobs (every frame's content and refusal lists appended in
 * order). Token frames on the fast path carry none of it (their logprobs
 * are null: fastframe.c); the role and finish frames do. done gets it
 * (make_done), its choices only when there is more than choice 0's
 * finish reason to say (n > 1, logprobs). */

static cJSON *meta_of(mz_stream *s) {
  if (!s->meta) s->meta = cJSON_CreateObject();
  return s->meta;
}

static void note_server(mz_stream *s, const mz_frame *f) {
  cJSON *m = f->model || f->fprint || f->created ? meta_of(s) : NULL;
  if (!m) return;
  if (f->model && !cJSON_HasObjectItem(m, "model")) cJSON_AddStringToObject(m, "model", f->model);
  if (f->fprint && !cJSON_HasObjectItem(m, "system_fingerprint"))
    cJSON_AddStringToObject(m, "system_fingerprint", f->fprint);
  if (f->created && !cJSON_HasObjectItem(m, "created")) cJSON_AddNumberToObject(m, "created", f->created->valuedouble);
}

static int index_of(const cJSON *entry) { return cJSON_GetObjectItemCaseSensitive(entry, "index")->valueint; }

/* The entry of choice `index` in meta.choices (in the order first seen:
 * sorted_choices puts them in index order). */
static cJSON *choice_entry(mz_stream *s, int index) {
  cJSON *m = meta_of(s), *list = m ? cJSON_GetObjectItemCaseSensitive(m, "choices") : NULL, *e;
  if (m && !list) list = cJSON_AddArrayToObject(m, "choices");
  if (!list) return NULL;
  cJSON_ArrayForEach(e, list) {
    if (index_of(e) == index) return e;
  }
  if (!(e = cJSON_CreateObject())) return NULL;
  cJSON_AddNumberToObject(e, "index", index);
  cJSON_AddItemToArray(list, e);
  return e;
}

/* The entries moved into a new list in index order (a few choices: the
 * smallest index first, again; cJSON 1.7.15's insert loses items). */
static cJSON *sorted_choices(cJSON *list) {
  cJSON *out = cJSON_CreateArray();
  while (out && list->child) {
    cJSON *min = list->child;
    for (cJSON *e = min->next; e; e = e->next)
      if (index_of(e) < index_of(min)) min = e;
    cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(list, min));
  }
  cJSON_Delete(list);
  return out;
}

/* A frame's logprobs into a choice's: the lists (content, refusal) moved
 * to the end of the ones kept, any other member the last one's. */
static void add_logprobs(cJSON *entry, cJSON *lp) {
  cJSON *have = cJSON_GetObjectItemCaseSensitive(entry, "logprobs");
  if (!have) {
    cJSON_AddItemToObject(entry, "logprobs", cJSON_Duplicate(lp, 1));
    return;
  }
  for (cJSON *it = lp->child; it; it = it->next) {
    cJSON *old = cJSON_GetObjectItemCaseSensitive(have, it->string);
    if (cJSON_IsArray(it) && cJSON_IsArray(old)) {
      while (it->child) cJSON_AddItemToArray(old, cJSON_DetachItemViaPointer(it, it->child));
    } else if (!old || !cJSON_IsNull(it)) {
      cJSON_DeleteItemFromObjectCaseSensitive(have, it->string);
      cJSON_AddItemToObject(have, it->string, cJSON_Duplicate(it, 1));
    }
  }
}

static void note_choice(mz_stream *s, const mz_choice *c) {
  cJSON *e = choice_entry(s, c->index);
  if (!e) return;
  if (c->finish_reason) {
    cJSON_DeleteItemFromObjectCaseSensitive(e, "finish_reason");
    cJSON_AddStringToObject(e, "finish_reason", c->finish_reason);
  }
  if (c->logprobs) add_logprobs(e, (cJSON *)c->logprobs); /* the frame's tree is ours until freed */
}

/* Whether done needs the choices: more than one, or more said of one
 * than its finish reason (done.finish_reason). */
static int choices_worth_it(const cJSON *list) {
  const cJSON *e;
  if (cJSON_GetArraySize(list) > 1) return 1;
  cJSON_ArrayForEach(e, list) {
    if (index_of(e) != 0 || cJSON_HasObjectItem(e, "logprobs")) return 1;
  }
  return 0;
}

/* meta's members into done, then meta is gone. */
static void take_meta(mz_stream *s, cJSON *d) {
  cJSON *m = s->meta;
  s->meta = NULL;
  if (!m) return;
  cJSON *list = cJSON_DetachItemFromObjectCaseSensitive(m, "choices");
  while (m->child) {
    cJSON *it = cJSON_DetachItemViaPointer(m, m->child);
    cJSON_AddItemToObject(d, it->string, it);
  }
  if (list && choices_worth_it(list)) cJSON_AddItemToObject(d, "choices", sorted_choices(list));
  else cJSON_Delete(list);
  cJSON_Delete(m);
}

static cJSON *make_done(mz_stream *s) {
  cJSON *d = cJSON_CreateObject();
  if (!d) return NULL;
  if (s->finish_reason[0]) cJSON_AddStringToObject(d, "finish_reason", s->finish_reason);
  if (s->done_id[0]) cJSON_AddStringToObject(d, "id", s->done_id);
  take_meta(s, d);
  if (s->usage) cJSON_AddItemToObject(d, "usage", s->usage);
  if (s->stats) cJSON_AddItemToObject(d, "stats", s->stats);
  if (s->timings) cJSON_AddItemToObject(d, "timings", s->timings);
  if (s->extra) cJSON_AddItemToObject(d, "extra", s->extra);
  if (s->no_done) cJSON_AddTrueToObject(d, "no_done_marker");
  if (s->invalid_utf8) cJSON_AddNumberToObject(d, "invalid_utf8", (double)s->invalid_utf8);
  if (s->skipped_frames) cJSON_AddNumberToObject(d, "skipped_frames", (double)s->skipped_frames);
  s->usage = s->stats = s->timings = s->extra = NULL;
  return d;
}

static void finish_done(mz_stream *s) {
  mz_flush_carry(s);
  mz_set_terminal(s, MZ_EV_DONE, NULL, NULL);
  s->term_json = make_done(s);
}

static void handle_choice(mz_stream *s, const mz_choice *c) {
  if (c->reasoning_len) mz_push_text(s, MZ_EV_THINK, c->index, c->reasoning, c->reasoning_len, 0);
  if (c->content_len) mz_push_text(s, MZ_EV_TEXT, c->index, c->content, c->content_len, 0);
  if (c->tool_calls) mz_push_json(s, MZ_EV_TOOL_CALL, c->index, cJSON_Duplicate(c->tool_calls, 1));
  if (c->finish_reason && (c->index == 0 || !s->finish_reason[0]))
    snprintf(s->finish_reason, sizeof s->finish_reason, "%s", c->finish_reason);
  if (c->finish_reason || c->logprobs || c->index) note_choice(s, c);
}

static void handle_error_value(mz_stream *s, mz_frame *f) {
  const char *type = NULL;
  char code[64] = "";
  const char *msg = mz_error_message(f->error, &type, code, sizeof code);
  mz_flush_carry(s);
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_SERVER, "server error: %s", msg ? msg : "(no message)");
  s->term_json = take(f, f->error);
}

/* One decoded payload: text first, then side data, then errors/end, so
 * everything a frame carries is queued before the terminal event. */
static void handle_frame(mz_stream *s, mz_frame *f) {
  if (f->done) {
    finish_done(s);
    return;
  }
  mz_choice c;
  /* token frames (the fast path) skip the id; the role and finish frames carry it too */
  if (f->id && !s->done_id[0]) snprintf(s->done_id, sizeof s->done_id, "%s", f->id);
  note_server(s, f);
  for (int i = 0; i < f->nchoices; i++)
    if (mz_frame_choice(f, i, &c) == 0) handle_choice(s, &c);
  if (f->progress) mz_push_json(s, f->heartbeat ? MZ_EV_HEARTBEAT : MZ_EV_PROGRESS, 0, take(f, f->progress));
  if (f->usage) replace(&s->usage, take(f, f->usage));
  if (f->timings) replace(&s->timings, take(f, f->timings));
  if (f->stats) replace(&s->stats, take(f, f->stats));
  if (f->unknown) keep_unknown(s, f);
  if (f->error) handle_error_value(s, f);
}

/* A token frame read by the fast path: same events as handle_choice. */
static void handle_fast(mz_stream *s, const mz_fast *f) {
  if (f->reasoning.len) mz_push_text(s, MZ_EV_THINK, f->index, f->reasoning.p, f->reasoning.len, f->reasoning.esc);
  if (f->content.len) mz_push_text(s, MZ_EV_TEXT, f->index, f->content.p, f->content.len, f->content.esc);
}

int mz_on_sse_event(void *ud, const mz_sse_event *e) {
  mz_stream *s = ud;
  char err[128];
  mz_frame f;
  if (s->term) return 1;
  int is_error = e->type_len == 5 && memcmp(e->type, "error", 5) == 0;
  if (!is_error && strcmp(e->type, "message") != 0) return 0; /* other event types: not ours */
  mz_fast ff;                                                 /* most frames are plain tokens: no cJSON tree for them */
  if (!is_error && mz_fast_frame(e->data, e->data_len, &ff)) {
    handle_fast(s, &ff);
    return s->term ? 1 : 0;
  }
  int bad = mz_frame_decode(&f, e->data, e->data_len, err, sizeof err) != 0;
  if (is_error && (bad || !f.error)) { /* event: error, plain text or no error object */
    mz_flush_carry(s);
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_SERVER, "server error: %.200s", e->data);
  } else if (bad) {
    if (s->skip_bad) { /* a server known to emit junk */
      s->skipped_frames++;
      mz_frame_free(&f);
      return 0;
    }
    mz_flush_carry(s);
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "malformed frame (%s): %.80s", err, e->data);
    s->abort = 1;
  } else {
    handle_frame(s, &f);
  }
  mz_frame_free(&f);
  return s->term ? 1 : 0;
}

/* ------------------------------------------------------ curl callbacks */

/* The media type of a Content-Type (before any ';', trimmed) into out;
 * "" when there is none. */
static const char *media_type(const char *ct, char *out, size_t outlen) {
  size_t n = 0;
  while (ct && (*ct == ' ' || *ct == '\t')) ct++;
  while (ct && ct[n] && ct[n] != ';' && ct[n] != ' ' && ct[n] != '\t') n++;
  snprintf(out, outlen, "%.*s", (int)n, ct ? ct : "");
  return out;
}

/* A 2xx that is not the answer asked for: a streamed request's answer
 * that is neither an event stream nor JSON (a web UI's page, a proxy's
 * login page: an answer without a Content-Type is read as a stream), or
 * a plain request's HTML page (a plain request may fetch text: a health
 * route's "OK"). Its body is kept as an error body's is. */
static int foreign(const mz_stream *s, const char *ct) {
  char mt[64];
  media_type(ct, mt, sizeof mt);
  if (s->plain) return strcasecmp(mt, "text/html") == 0 || strcasecmp(mt, "application/xhtml+xml") == 0;
  return *mt && !strstr(ct, "event-stream") && !strstr(ct, "json");
}

/* Decide how to read the body from the status and content type. */
static void classify(mz_stream *s) {
  char *ct = NULL;
  curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &s->status);
  curl_easy_getinfo(s->easy, CURLINFO_CONTENT_TYPE, &ct);
  if (s->status >= 300) s->mode = MODE_ERRBODY; /* redirects are not followed */
  else if (foreign(s, ct)) s->mode = MODE_ERRBODY;
  else if (s->plain) s->mode = MODE_PLAIN;
  else if (ct && strstr(ct, "json") && !strstr(ct, "event-stream")) s->mode = MODE_JSON;
  else s->mode = MODE_SSE;
}

static void finish_foreign(mz_stream *s);

/* A response byte came: the stall timer runs from now. */
static void received(mz_stream *s) {
  s->last_rx = mz_io_now(s->c);
  if (!s->got_rx) {
    s->got_rx = 1;
    if (s->stall_s > 0) mz_due_at(s, s->last_rx + s->stall_s);
  }
}

size_t mz_on_write(char *p, size_t size, size_t n, void *ud) {
  mz_stream *s = ud;
  size_t len = size * n;
  if (s->rec) fwrite(p, 1, len, s->rec); /* recording: the bytes before any parsing */
  received(s);
  if (s->mode == MODE_UNKNOWN) classify(s);
  if (s->abort) return 0;
  if (s->term) return len; /* read to the end so the connection is reused */
  if (s->mode == MODE_SSE) {
    int rc = mz_sse_feed(&s->sse, p, len);
    if (rc < 0) {
      mz_flush_carry(s);
      mz_set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "%s (limit %zu bytes)", mz_sse_strerror(rc), s->sse.max);
      s->abort = 1;
    }
    return s->abort ? 0 : len;
  }
  size_t cap = s->mode == MODE_ERRBODY ? ERRBODY_MAX : PLAINBODY_MAX;
  size_t room = s->body.len < cap ? cap - s->body.len : 0;
  if (room && mz_buf_add(&s->body, p, len < room ? len : room)) mz_out_of_memory(s);
  if (len >= room && s->mode == MODE_ERRBODY && s->status < 300)
    finish_foreign(s); /* enough of a page that may not end */
  if (len > room && s->mode != MODE_ERRBODY) {
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "response body over %u bytes", PLAINBODY_MAX);
    return 0;
  }
  return s->abort ? 0 : len;
}

/* One line of the response head into a recording: a header whose name
 * looks like a credential (Set-Cookie, ...: mz_is_secret) as "Name:
 * [redacted]", the line end kept. */
static void record_header(FILE *f, const char *p, size_t len) {
  const char *colon = memchr(p, ':', len);
  if (colon && colon > p && !(len >= 5 && memcmp(p, "HTTP/", 5) == 0) && mz_is_secret(p, (size_t)(colon - p))) {
    size_t eol = len;
    while (eol && (p[eol - 1] == '\n' || p[eol - 1] == '\r')) eol--;
    fwrite(p, 1, (size_t)(colon - p), f);
    fputs(": [redacted]", f);
    fwrite(p + eol, 1, len - eol, f);
    return;
  }
  fwrite(p, 1, len, f);
}

/* One line of the response head. Every line counts as received data for
 * the stall timer (a slow head is no stall). A status line starts a new
 * head (after a 1xx), so only the final response's headers are kept. */
size_t mz_on_header(char *p, size_t size, size_t n, void *ud) {
  mz_stream *s = ud;
  size_t len = size * n, name;
  if (s->rec) record_header(s->rec, p, len); /* recording: status line, headers, blank line */
  received(s);
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) {
    s->headers.len = 0;
    s->multiplexed = len > 5 && p[5] >= '2' && p[5] <= '9'; /* "HTTP/2", "HTTP/3": a shared connection */
    return len;
  }
  while (len && (p[len - 1] == '\n' || p[len - 1] == '\r')) len--;
  if (!len) { /* the blank line: a final head unless 1xx */
    long st = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &st);
    s->head_done = st >= 200;
    return size * n;
  }
  const char *colon = memchr(p, ':', len);
  if (!colon || colon == p || s->headers.len + len + 2 > HEADERS_MAX) return size * n;
  name = (size_t)(colon - p);
  size_t at = s->headers.len;
  if (mz_buf_add(&s->headers, p, len) || mz_buf_add(&s->headers, "\n", 1)) return size * n;
  for (size_t i = 0; i < name; i++) s->headers.p[at + i] = (char)tolower((unsigned char)s->headers.p[at + i]);
  return size * n;
}

/* The value of a kept response header (name in lowercase), trimmed, into
 * out; NULL when absent. */
static const char *header_value(const mz_stream *s, const char *name, char *out, size_t outlen) {
  size_t n = strlen(name);
  for (const char *l = s->headers.p, *end = l + s->headers.len; l && l < end;) {
    const char *nl = memchr(l, '\n', (size_t)(end - l));
    if (!nl) break;
    if ((size_t)(nl - l) > n && memcmp(l, name, n) == 0 && l[n] == ':') {
      const char *v = l + n + 1;
      while (v < nl && (*v == ' ' || *v == '\t')) v++;
      size_t vl = (size_t)(nl - v);
      while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
      snprintf(out, outlen, "%.*s", (int)vl, v);
      return out;
    }
    l = nl + 1;
  }
  return NULL;
}

/* Retry-After in seconds from now: delta-seconds or an HTTP-date (a date
 * in the past is 0); -1 when absent or unreadable. */
static double retry_after(const mz_stream *s) {
  char v[128], *end;
  if (!header_value(s, "retry-after", v, sizeof v) || !*v) return -1;
  errno = 0;
  long secs = strtol(v, &end, 10);
  if (*end == '\0' && end != v && !errno) return secs < 0 ? -1 : (double)secs;
  time_t t = curl_getdate(v, NULL);
  if (t == (time_t)-1) return -1;
  double d = difftime(t, time(NULL));
  return d > 0 ? d : 0;
}

/* ------------------------------------------------------ completion */

/* A 3xx: not followed (a redirect silently re-sending a chat request is
 * rarely what a local setup wants): a clear error naming the target. */
static void finish_redirect(mz_stream *s) {
  char *to = NULL, *shown;
  curl_easy_getinfo(s->easy, CURLINFO_REDIRECT_URL, &to);
  shown = to ? mz_redact_url(to) : NULL; /* a Location may carry credentials too */
  const char *reason = mz_http_reason(s->status);
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_HTTP, "%s: HTTP %ld%s%s to %s (redirects are not followed: use that url)",
                  s->url, s->status, *reason ? " " : "", reason,
                  shown ? shown
                  : to  ? "(a url)"
                        : "(no Location)");
  free(shown);
}

/* A 2xx that is not what was asked for (see foreign): a "protocol"
 * error, never retried as a network failure (the same answer would come
 * again), naming the url, the content type and what the page says (its
 * <title>), with what to check. The page stays in the event's body
 * (mz_event.body, as an error body's). */
static void finish_foreign(mz_stream *s) {
  char *ct = NULL, mt[64], said[128], quoted[sizeof said + 8] = "";
  curl_easy_getinfo(s->easy, CURLINFO_CONTENT_TYPE, &ct);
  media_type(ct, mt, sizeof mt);
  if (*mz_http_summary(s->body.p, s->body.len, said, sizeof said)) snprintf(quoted, sizeof quoted, " (\"%s\")", said);
  mz_flush_carry(s);
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL,
                  "%s answered %ld with %s%s, not %s: check that the url is the daemon's API (a base url ending in "
                  "/v1) and that no web UI or proxy answers in its place",
                  s->url, s->status, *mt ? mt : "no content type", quoted, s->plain ? "JSON" : "an event stream");
}

/* An HTTP error: "<url>: HTTP <status> <reason>: <what the body says>"
 * (the url as requested, redacted: a doubled or missing path shows). */
static void finish_http_error(mz_stream *s) {
  char msg[sizeof s->term_msg];
  if (s->status < 300) {
    finish_foreign(s);
    return;
  }
  s->retry_after = retry_after(s);
  if (s->status < 400) {
    finish_redirect(s);
    return;
  }
  int n = snprintf(msg, sizeof msg, "%s: ", s->url);
  size_t at = n < 0 ? 0 : (size_t)n < sizeof msg / 2 ? (size_t)n : 0; /* a url too long for the room: none */
  mz_http_error_message(s->status, s->body.p, s->body.len, msg + at, sizeof msg - at);
  mz_set_terminal(s, MZ_EV_ERROR, MZ_E_HTTP, "%s", msg);
  s->term_json = mz_http_error_object(s->body.p, s->body.len); /* ev.error */
}

/* A 200 with a JSON body where a stream was asked for: a non-streamed
 * chat.completion (some servers ignore "stream"). Same events as a stream. */
static void finish_json_body(mz_stream *s) {
  mz_frame f;
  char err[128];
  if (mz_frame_decode(&f, s->body.p ? s->body.p : "", s->body.len, err, sizeof err) != 0) {
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_PROTOCOL, "malformed response (%s)", err);
  } else {
    handle_frame(s, &f);
    finish_done(s);
  }
  mz_frame_free(&f);
}

/* Which of libcurl's two clocks ended the transfer, and what to change. */
static const char *which_clock(const mz_stream *s) {
  curl_off_t connected = 0;
  curl_easy_getinfo(s->easy, CURLINFO_CONNECT_TIME_T, &connected);
  if (!connected && s->connect_ms && (!s->deadline_ms || s->connect_ms <= s->deadline_ms))
    return "connect timeout: no TCP connection in time; raise the `timeout` option (engine, batch: `connect_timeout`), "
           "or check the address";
  return "deadline: the whole request took longer than the `deadline` option; raise it, or false for none";
}

static void finish_transport_error(mz_stream *s, CURLcode rc) {
  const char *code = MZ_E_IO;
  int closed = 0;
  switch (rc) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_COULDNT_RESOLVE_HOST: code = MZ_E_REFUSED; break;
  case CURLE_OPERATION_TIMEDOUT: code = MZ_E_TIMEOUT; break;
  case CURLE_PARTIAL_FILE:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_SEND_ERROR:
    code = MZ_E_CLOSED;
    closed = 1;
    break;
  default: break;
  }
  mz_flush_carry(s);
  int os_errno = rc == CURLE_COULDNT_CONNECT ? s->sock_errno : 0;
  if (os_errno == ENFILE) { /* not the daemon's failure: no "refused" */
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_IO,
                    "%s: no socket: the system's table of open files is full (%zu streams open here): run fewer "
                    "requests at once, or raise the system's limit (sysctl fs.file-max)",
                    s->url, mz_client_streams(s->c));
    return;
  }
  if (os_errno == EMFILE) {
    long soft, hard, orig;
    mz_nofile(&soft, &hard, &orig);
    mz_set_terminal(s, MZ_EV_ERROR, MZ_E_IO,
                    "%s: no socket: too many open files (%zu streams open; this process may open %ld files, the "
                    "hard limit is %ld): run fewer requests at once, or raise the limit (ulimit -Hn, limits.conf, "
                    "LimitNOFILE=)",
                    s->url, mz_client_streams(s->c), soft, hard);
    return;
  }
  const char *why = s->errbuf[0] ? s->errbuf : curl_easy_strerror(rc);
  if (closed && s->status) mz_set_terminal(s, MZ_EV_ERROR, code, "connection closed mid-stream (%s)", why);
  else if (rc == CURLE_OPERATION_TIMEDOUT)
    mz_set_terminal(s, MZ_EV_ERROR, code, "%s: %s (%s)", s->url, why, which_clock(s));
  else mz_set_terminal(s, MZ_EV_ERROR, code, "%s: %s", s->url, why);
}

void mz_on_complete(mz_stream *s, CURLcode rc) {
  if (s->mode == MODE_UNKNOWN && rc == CURLE_OK) classify(s);
  if (s->mode == MODE_ERRBODY && (rc == CURLE_OK || s->body.len)) finish_http_error(s);
  else if (rc != CURLE_OK) finish_transport_error(s, rc);
  else if (s->mode == MODE_PLAIN) mz_set_terminal(s, MZ_EV_RESPONSE, NULL, NULL);
  else if (s->mode == MODE_JSON) finish_json_body(s);
  else if (!s->term) {
    int partial = mz_sse_finish(&s->sse);
    if (!s->term && !partial && s->finish_reason[0]) {
      s->no_done = 1; /* servers and proxies that never send [DONE] */
      finish_done(s);
    } else if (!s->term) {
      mz_flush_carry(s);
      mz_set_terminal(s, MZ_EV_ERROR, MZ_E_CLOSED, "stream ended without [DONE]%s",
                      partial ? " (cut inside an event)" : "");
    }
  }
}
