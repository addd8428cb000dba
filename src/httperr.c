/*
 * httperr.c - the short human message of an HTTP error response (decode.h:
 * mz_http_error_message, mz_http_reason, mz_http_error_object).
 *
 * Daemons answer errors in JSON ({"error": {...}}), but what sits in
 * front of them does not: a proxy's HTML 502/503 page, a plain-text 500,
 * a framework's {"detail": ...}. The message names the status and its
 * reason phrase and then one short line a human can act on: the server's
 * error message, the page's <title>, or the first line of text. The raw
 * body stays available to the caller. Pure C over cJSON, bounded work on
 * any input (a fuzzer calls it), no allocation but cJSON's parse.
 * mz_http_summary (httperr.h) is that line alone, for a 2xx that is not
 * what was asked for (a web UI's page where an event stream was awaited).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "decode.h"
#include "httperr.h"

#define SUMMARY_MAX 200  /* bytes of a body's text line in a message */
#define MESSAGE_MAX 1000 /* bytes of a server's own error message */

const char *mz_http_reason(long status) {
  static const struct {
    short code;
    const char *text;
  } reasons[] = {
      {300, "Multiple Choices"},
      {301, "Moved Permanently"},
      {302, "Found"},
      {303, "See Other"},
      {304, "Not Modified"},
      {307, "Temporary Redirect"},
      {308, "Permanent Redirect"},
      {400, "Bad Request"},
      {401, "Unauthorized"},
      {402, "Payment Required"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {406, "Not Acceptable"},
      {408, "Request Timeout"},
      {409, "Conflict"},
      {410, "Gone"},
      {411, "Length Required"},
      {413, "Content Too Large"},
      {414, "URI Too Long"},
      {415, "Unsupported Media Type"},
      {422, "Unprocessable Content"},
      {429, "Too Many Requests"},
      {431, "Request Header Fields Too Large"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {502, "Bad Gateway"},
      {503, "Service Unavailable"},
      {504, "Gateway Timeout"},
      {505, "HTTP Version Not Supported"},
      {507, "Insufficient Storage"},
  };
  for (size_t i = 0; i < sizeof reasons / sizeof *reasons; i++)
    if (reasons[i].code == status) return reasons[i].text;
  return "";
}

/* ---- one line of text ---- */

/* Text collected with whitespace runs collapsed to one space (control
 * characters count as whitespace), cut at max bytes. */
typedef struct line {
  char p[MESSAGE_MAX + 8];
  size_t len, max;
  int space, cut;
} line;

static void put(line *l, char c) {
  unsigned char u = (unsigned char)c;
  if (u < 0x20 || u == 0x7f || c == ' ') {
    l->space = l->len > 0;
    return;
  }
  if (l->len + 1 + (size_t)l->space > l->max) {
    l->cut = 1;
    return;
  }
  if (l->space) l->p[l->len++] = ' ';
  l->space = 0;
  l->p[l->len++] = c;
}

/* First line of plain text holding something other than whitespace. */
static void first_text_line(const char *b, size_t len, line *l) {
  for (size_t i = 0; i < len && !l->cut; i++) {
    if ((b[i] == '\n' || b[i] == '\r') && l->len) return;
    put(l, b[i]);
  }
}

static int starts_with_ci(const char *b, size_t len, const char *lit) {
  size_t n = strlen(lit);
  return len >= n && strncasecmp(b, lit, n) == 0;
}

/* Offset of the first case-insensitive occurrence of lit at or after i,
 * or len. */
static size_t find_ci(const char *b, size_t len, size_t i, const char *lit) {
  for (; i < len; i++)
    if (starts_with_ci(b + i, len - i, lit)) return i;
  return len;
}

/* &amp; &lt; &gt; &quot; &#39; &nbsp; at b[i] ('&'): the character put,
 * returns the bytes consumed (1 when it is none of them). */
static size_t entity(const char *b, size_t len, size_t i, line *l) {
  static const struct {
    const char *name;
    char c;
  } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&#39;", '\''}, {"&nbsp;", ' '}};
  for (size_t k = 0; k < sizeof ents / sizeof *ents; k++)
    if (starts_with_ci(b + i, len - i, ents[k].name)) {
      put(l, ents[k].c);
      return strlen(ents[k].name);
    }
  put(l, '&');
  return 1;
}

/* Text from b[i] up to the end of the first line with text (all of it up
 * to stop when `whole`: a title's line breaks are spaces), skipping tags
 * (a tag is a space) and script/style contents; stops at `stop` (an
 * offset) at the latest. */
static void html_text(const char *b, size_t stop, size_t i, int whole, line *l) {
  while (i < stop && !l->cut) {
    char c = b[i];
    if (c == '<') {
      size_t end = find_ci(b, stop, i, ">");
      if (starts_with_ci(b + i, stop - i, "<script")) end = find_ci(b, stop, i, "</script");
      else if (starts_with_ci(b + i, stop - i, "<style")) end = find_ci(b, stop, i, "</style");
      if (end < stop && b[end] != '>') end = find_ci(b, stop, end, ">");
      put(l, ' ');
      i = end + 1;
    } else if ((c == '\n' || c == '\r') && l->len && !whole) {
      return;
    } else if (c == '&') {
      i += entity(b, stop, i, l);
    } else {
      put(l, c);
      i++;
    }
  }
}

/* An HTML page's <title>, else its first line of text. */
static void html_summary(const char *b, size_t len, line *l) {
  size_t t = find_ci(b, len, 0, "<title"), open = t < len ? find_ci(b, len, t, ">") : len;
  if (open < len) {
    html_text(b, find_ci(b, len, open, "</title"), open + 1, 1, l);
    if (l->len) return;
  }
  html_text(b, len, 0, 0, l);
}

/* A page starts with a tag, or names <html> in its first 512 bytes (after
 * a BOM, white space or a doctype written oddly). */
static int looks_html(const char *b, size_t len) {
  size_t head = len < 512 ? len : 512;
  if (!len) return 0;
  if (b[0] == '<') return 1;
  return find_ci(b, head, 0, "<html") < head;
}

/* ---- JSON bodies ---- */

static const char *json_str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* The server's message: error.message (or error as a string), else a
 * top-level "detail" (FastAPI) or "message" (vLLM's {"object": "error",
 * "message": ...}). */
static const char *json_message(const cJSON *root) {
  const char *m;
  if (!cJSON_IsObject(root)) return NULL;
  m = mz_error_message(cJSON_GetObjectItemCaseSensitive(root, "error"), NULL, NULL, 0);
  if (m && *m) return m;
  if ((m = json_str(root, "detail"))) return m;
  return json_str(root, "message");
}

static void put_str(line *l, const char *s) {
  while (*s && !l->cut) put(l, *s++);
}

/* FastAPI's validation errors (vLLM's 422), {"detail": [{"loc": ["body",
 * "messages"], "msg": "Field required", ...}, ...]}: the first as
 * "body.messages: Field required", then how many more. 0 (l untouched)
 * when root is no such list. */
static int detail_list(const cJSON *root, line *l) {
  const cJSON *d = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "detail") : NULL;
  const cJSON *first = cJSON_IsArray(d) ? cJSON_GetArrayItem(d, 0) : NULL, *p;
  const char *msg = cJSON_IsObject(first) ? json_str(first, "msg") : NULL;
  char num[32];
  int parts = 0;
  if (!msg) return 0;
  l->max = MESSAGE_MAX;
  cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(first, "loc")) {
    const char *s = cJSON_IsString(p) ? p->valuestring : NULL;
    if (cJSON_IsNumber(p)) snprintf(num, sizeof num, "%.0f", p->valuedouble), s = num;
    if (!s || !*s) continue;
    if (parts++) put(l, '.');
    put_str(l, s);
  }
  if (parts) put_str(l, ": ");
  for (size_t i = 0; msg[i] && msg[i] != '\n' && msg[i] != '\r'; i++) put(l, msg[i]);
  int more = cJSON_GetArraySize(d) - 1;
  if (more > 0) {
    snprintf(num, sizeof num, " (and %d more)", more);
    put_str(l, num);
  }
  return 1;
}

cJSON *mz_http_error_object(const char *body, size_t len) {
  cJSON *root = body && len ? mz_json_parse(body, len, NULL) : NULL, *e;
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return NULL;
  }
  e = cJSON_GetObjectItemCaseSensitive(root, "error");
  if (cJSON_IsObject(e)) {
    e = cJSON_DetachItemViaPointer(root, e);
    cJSON_Delete(root);
    return e;
  }
  if (cJSON_IsString(e)) { /* {"error": "text"} -> {"message": "text"} */
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "message", e->valuestring)) cJSON_Delete(o), o = NULL;
    cJSON_Delete(root);
    return o;
  }
  return root; /* another JSON object: the whole body ({"detail": ...}) */
}

/* ---- the message ---- */

/* "HTTP <status>[ <reason>][: <text>]" into out; text (len bytes) is cut
 * to the room left on a UTF-8 boundary, with "..." when shortened (cut:
 * it was shortened already). */
static void render(long status, const char *text, size_t len, int cut, char *out, size_t outlen) {
  const char *reason = mz_http_reason(status);
  int n = snprintf(out, outlen, "HTTP %ld%s%s%s", status, *reason ? " " : "", reason, len ? ": " : "");
  size_t o = n < 0 ? 0 : (size_t)n >= outlen ? outlen - 1 : (size_t)n;
  if (!len) return;
  size_t room = outlen - o - 1, take = len;
  if (take > room) take = room > 3 ? room - 3 : 0, cut = 1;
  if (cut && take + 3 > room) take = room > 3 ? room - 3 : 0;
  take = mz_utf8_complete(text, take);
  memcpy(out + o, text, take);
  o += take;
  if (cut && o + 3 < outlen) memcpy(out + o, "...", 3), o += 3;
  out[o] = '\0';
}

/* The one line a body says (see the top of the file) into l. */
static void summarize(const char *body, size_t len, line *l) {
  if (!body) len = 0;
  while (len && (*body == ' ' || *body == '\t' || *body == '\r' || *body == '\n')) body++, len--;
  cJSON *root = len && (*body == '{' || *body == '[') ? mz_json_parse(body, len, NULL) : NULL;
  const char *msg = json_message(root);
  if (msg) {
    l->max = MESSAGE_MAX;
    first_text_line(msg, strlen(msg), l);
  } else if (detail_list(root, l)) {
    /* l holds the first validation error */
  } else if (looks_html(body, len)) {
    html_summary(body, len, l);
  } else {
    first_text_line(body, len, l);
  }
  cJSON_Delete(root);
}

char *mz_http_error_message(long status, const char *body, size_t len, char *out, size_t outlen) {
  line l = {.max = SUMMARY_MAX};
  if (!out || !outlen) return out;
  summarize(body, len, &l);
  render(status, l.p, l.len, l.cut, out, outlen);
  return out;
}

/* What render puts after "HTTP <status> <reason>: ", alone: the page's
 * <title> or first line of text, the server's message, the body's first
 * line. */
char *mz_http_summary(const char *body, size_t len, char *out, size_t outlen) {
  line l = {.max = SUMMARY_MAX};
  if (!out || !outlen) return out;
  summarize(body, len, &l);
  size_t take = l.len, room = outlen - 1;
  int cut = l.cut || take > room;
  int dots = cut && room > 3;
  if (dots && take + 3 > room) take = room - 3;
  if (take > room) take = room;
  take = mz_utf8_complete(l.p, take);
  memcpy(out, l.p, take);
  if (dots) memcpy(out + take, "...", 3), take += 3;
  out[take] = '\0';
  return out;
}
