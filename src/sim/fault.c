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
}

/* Parse a non-negative decimal integer that must fill [s, s+n). */
static int parse_count(const char *s, size_t n, long *out) {
  char tmp[32];
  if (n == 0 || n >= sizeof tmp)
    return -1;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  long v = strtol(tmp, &end, 10);
  if (errno || *end || v < 0 || tmp[0] == '-' || tmp[0] == '+')
    return -1;
  *out = v;
  return 0;
}

/* "N" or "N:MS" for stall-after; other items reject the colon. */
static int parse_after(const char *v, size_t n, long *count, long *ms) {
  const char *colon = memchr(v, ':', n);
  if (!colon)
    return parse_count(v, n, count);
  if (!ms || parse_count(v, (size_t)(colon - v), count))
    return -1;
  return parse_count(colon + 1, n - (size_t)(colon - v) - 1, ms);
}

static int parse_http(sim_faults *f, const char *v, size_t n, bool text) {
  const char *colon = memchr(v, ':', n);
  size_t sn = colon ? (size_t)(colon - v) : n;
  long st;
  if (parse_count(v, sn, &st) || st < 100 || st > 599)
    return -1;
  f->http_status = (int)st;
  f->http_text = text;
  f->http_msg[0] = '\0';
  if (colon) {
    size_t mn = n - sn - 1;
    if (mn >= sizeof f->http_msg)
      mn = sizeof f->http_msg - 1;
    memcpy(f->http_msg, colon + 1, mn);
    f->http_msg[mn] = '\0';
  }
  return 0;
}

static int parse_item(sim_faults *f, const char *k, size_t kn, const char *v, size_t vn,
                      bool has_v) {
#define KEY(s) (kn == sizeof(s) - 1 && memcmp(k, s, kn) == 0)
  if (KEY("utf8-split") && !has_v)
    return f->utf8_split = true, 0;
  if (KEY("loop")) {
    if (!has_v)
      return f->loop = LOOP_LINE, 0;
    if (vn == 6 && memcmp(v, "phrase", 6) == 0)
      return f->loop = LOOP_PHRASE, 0;
    if (vn == 4 && memcmp(v, "line", 4) == 0)
      return f->loop = LOOP_LINE, 0;
    return -1;
  }
  if (!has_v)
    return -1;
  if (KEY("http"))
    return parse_http(f, v, vn, false);
  if (KEY("http-text"))
    return parse_http(f, v, vn, true);
  if (KEY("error-after"))
    return parse_after(v, vn, &f->error_after, NULL);
  if (KEY("cut-after"))
    return parse_after(v, vn, &f->cut_after, NULL);
  if (KEY("crash-after"))
    return parse_after(v, vn, &f->crash_after, NULL);
  if (KEY("malformed-after"))
    return parse_after(v, vn, &f->malformed_after, NULL);
  if (KEY("stall-after")) {
    f->stall_ms = -1;
    return parse_after(v, vn, &f->stall_after, &f->stall_ms);
  }
  if (KEY("oversized"))
    return parse_count(v, vn, &f->oversized);
  if (KEY("replay")) {
    if (vn == 0 || vn >= sizeof f->replay)
      return -1;
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
    while (n && (*p == ' ' || *p == '\t'))
      p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
      n--;
    const char *eq = memchr(p, '=', n);
    size_t kn = eq ? (size_t)(eq - p) : n;
    if (n && parse_item(f, p, kn, eq ? eq + 1 : "", eq ? n - kn - 1 : 0, eq != NULL)) {
      snprintf(err, errlen, "invalid fault spec item '%.*s'", (int)n, p);
      return -1;
    }
    if (!end)
      break;
    p = end + 1;
  }
  return 0;
}
