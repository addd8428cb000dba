/*
 * fault.c - parsing of fault specs ("cut-after=5,utf8-split").
 *
 * A spec is a comma-separated list of items; each item sets one field of a
 * sim_faults, so specs from --fault, the X-Mirza-Sim-Fault header and the
 * body's mirza_sim.fault can be applied one after the other onto the same
 * struct (later ones win). An http message therefore cannot contain a comma.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

void faults_clear(sim_faults *f) {
  memset(f, 0, sizeof *f);
  f->error_after = f->cut_after = f->stall_after = -1;
  f->malformed_after = f->crash_after = -1;
  f->stall_ms = -1;
  f->bad_utf8_after = f->nul_after = -1;
}

/* Parse a non-negative decimal integer that must fill [s, s+n). */
static int parse_count(const char *s, size_t n, long *out) {
  char tmp[32];
  if (n == 0 || n >= sizeof tmp) return -1;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  long v = strtol(tmp, &end, 10);
  if (errno || *end || v < 0 || tmp[0] == '-' || tmp[0] == '+') return -1;
  *out = v;
  return 0;
}

/* "N" or "N:MS" for stall-after; other items reject the colon. */
static int parse_after(const char *v, size_t n, long *count, long *ms) {
  const char *colon = memchr(v, ':', n);
  if (!colon) return parse_count(v, n, count);
  if (!ms || parse_count(v, (size_t)(colon - v), count)) return -1;
  return parse_count(colon + 1, n - (size_t)(colon - v) - 1, ms);
}

static int parse_http(sim_faults *f, const char *v, size_t n, int body) {
  const char *colon = memchr(v, ':', n);
  size_t sn = colon ? (size_t)(colon - v) : n;
  long st;
  if (parse_count(v, sn, &st) || st < 100 || st > 599) return -1;
  f->http_status = (int)st;
  f->http_text = body != HTTP_BODY_JSON;
  f->http_body = body;
  f->http_msg[0] = '\0';
  if (colon) {
    size_t mn = n - sn - 1;
    if (mn >= sizeof f->http_msg) mn = sizeof f->http_msg - 1;
    memcpy(f->http_msg, colon + 1, mn);
    f->http_msg[mn] = '\0';
  }
  return 0;
}

/* html-page[=TITLE]: a 200 text/html page (a web UI, a proxy's login
 * page) where the API was asked; TITLE in its <title> (default: a web
 * UI's). */
static int parse_html_page(sim_faults *f, const char *v, size_t n) {
  if (n >= sizeof f->http_msg) return -1;
  f->http_status = 200;
  f->http_text = true;
  f->http_body = HTTP_BODY_WEB_PAGE;
  memcpy(f->http_msg, v, n);
  f->http_msg[n] = '\0';
  return 0;
}

static int copy_value(char *dst, size_t cap, const char *v, size_t n) {
  if (n == 0 || n >= cap) return -1;
  memcpy(dst, v, n);
  dst[n] = '\0';
  return 0;
}

/* redirect=STATUS[:LOCATION] */
static int parse_redirect(sim_faults *f, const char *v, size_t n) {
  const char *colon = memchr(v, ':', n);
  size_t sn = colon ? (size_t)(colon - v) : n;
  long st;
  if (parse_count(v, sn, &st) || (st != 301 && st != 302 && st != 303 && st != 307 && st != 308)) return -1;
  f->redirect = (int)st;
  f->location[0] = '\0';
  return colon ? copy_value(f->location, sizeof f->location, colon + 1, n - sn - 1) : 0;
}

/* The items added for issue 8. Returns 1 when k is none of them. */
static int parse_more(sim_faults *f, const char *k, size_t kn, const char *v, size_t vn) {
#define KEY(s) (kn == sizeof(s) - 1 && memcmp(k, s, kn) == 0)
  if (KEY("http-html")) return parse_http(f, v, vn, HTTP_BODY_HTML_PAGE);
  if (KEY("http-plain")) return parse_http(f, v, vn, HTTP_BODY_PLAIN);
  if (KEY("bad-utf8-after")) return parse_count(v, vn, &f->bad_utf8_after);
  if (KEY("nul-after")) return parse_count(v, vn, &f->nul_after);
  if (KEY("slow-head")) return parse_count(v, vn, &f->slow_head_ms);
  if (KEY("slow-head-bytes")) return parse_count(v, vn, &f->head_bytes_ms);
  if (KEY("head-delay")) return parse_count(v, vn, &f->head_delay_ms);
  if (KEY("redirect")) return parse_redirect(f, v, vn);
  if (KEY("retry-after")) return copy_value(f->retry_after, sizeof f->retry_after, v, vn);
  return 1;
#undef KEY
}

static int parse_item(sim_faults *f, const char *k, size_t kn, const char *v, size_t vn, bool has_v) {
#define KEY(s) (kn == sizeof(s) - 1 && memcmp(k, s, kn) == 0)
  if (KEY("utf8-split") && !has_v) return f->utf8_split = true, 0;
  if (KEY("no-done") && !has_v) return f->no_done = true, 0;
  if (KEY("gzip") && !has_v) return f->gzip = true, 0;
  if (KEY("tool-name-split") && !has_v) return f->tool_name_split = true, 0;
  if (KEY("schema-ignore") && !has_v) return f->schema_ignore = true, 0;
  if (KEY("schema-break") && !has_v) return f->schema_break = true, 0;
  if (KEY("schema-cut") && !has_v) return f->schema_cut = true, 0;
  if (KEY("html-page")) return parse_html_page(f, has_v ? v : "", has_v ? vn : 0);
  if (KEY("loop")) {
    if (!has_v) return f->loop = LOOP_LINE, 0;
    if (vn == 6 && memcmp(v, "phrase", 6) == 0) return f->loop = LOOP_PHRASE, 0;
    if (vn == 4 && memcmp(v, "line", 4) == 0) return f->loop = LOOP_LINE, 0;
    return -1;
  }
  if (!has_v) return -1;
  if (KEY("http")) return parse_http(f, v, vn, HTTP_BODY_JSON);
  if (KEY("http-text")) return parse_http(f, v, vn, HTTP_BODY_TEXT_HTML);
  if (KEY("error-after")) return parse_after(v, vn, &f->error_after, NULL);
  if (KEY("cut-after")) return parse_after(v, vn, &f->cut_after, NULL);
  if (KEY("crash-after")) return parse_after(v, vn, &f->crash_after, NULL);
  if (KEY("malformed-after")) return parse_after(v, vn, &f->malformed_after, NULL);
  if (KEY("stall-after")) {
    f->stall_ms = -1;
    return parse_after(v, vn, &f->stall_after, &f->stall_ms);
  }
  if (KEY("oversized")) return parse_count(v, vn, &f->oversized);
  int more = parse_more(f, k, kn, v, vn);
  if (more != 1) return more;
  if (KEY("replay")) {
    if (vn == 0 || vn >= sizeof f->replay) return -1;
    memcpy(f->replay, v, vn);
    f->replay[vn] = '\0';
    return 0;
  }
  return -1;
#undef KEY
}

/* Apply every item of spec onto f. On error, err names the bad item and f
 * may be partly updated. Empty items (",,") are ignored. */
int faults_parse(sim_faults *f, const char *spec, char *err, size_t errlen) {
  const char *p = spec;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n && (*p == ' ' || *p == '\t')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    const char *eq = memchr(p, '=', n);
    size_t kn = eq ? (size_t)(eq - p) : n;
    if (n && parse_item(f, p, kn, eq ? eq + 1 : "", eq ? n - kn - 1 : 0, eq != NULL)) {
      snprintf(err, errlen, "invalid fault spec item '%.*s'", (int)n, p);
      return -1;
    }
    if (!end) break;
    p = end + 1;
  }
  return 0;
}
