/*
 * buf.c - growable byte buffer, JSON string escaping and clocks.
 *
 * Frames are written by hand into an sbuf rather than through cJSON: at
 * "as fast as possible" the simulator must produce hundreds of thousands of
 * frames a second, and the utf8-split fault needs raw, deliberately broken
 * UTF-8 inside JSON strings, which cJSON cannot produce. Allocation failure
 * aborts: a simulator that silently drops bytes would test nothing.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"

void sbuf_reserve(sbuf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    fputs("mirza-sim: out of memory\n", stderr);
    abort();
  }
  b->p = p;
  b->cap = cap;
}

void sbuf_add(sbuf *b, const void *s, size_t n) {
  sbuf_reserve(b, n);
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void sbuf_adds(sbuf *b, const char *s) { sbuf_add(b, s, strlen(s)); }

void sbuf_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  sbuf_reserve(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* Escape for the inside of a JSON string. Bytes >= 0x80 pass through raw,
 * valid UTF-8 or not: that is how llama-server and MTPLX send text, and the
 * utf8-split fault depends on it. */
void sbuf_json_esc(sbuf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  sbuf_reserve(b, n + 8);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch >= 0x20 && ch != '"' && ch != '\\') {
      if (b->len + 2 > b->cap) sbuf_reserve(b, n - i + 8);
      b->p[b->len++] = (char)ch;
      continue;
    }
    char e[7] = {'\\', 0};
    size_t en = 2;
    switch (ch) {
    case '"': e[1] = '"'; break;
    case '\\': e[1] = '\\'; break;
    case '\n': e[1] = 'n'; break;
    case '\r': e[1] = 'r'; break;
    case '\t': e[1] = 't'; break;
    default:
      memcpy(e, "\\u00", 4);
      e[4] = hex[ch >> 4];
      e[5] = hex[ch & 15];
      en = 6;
    }
    sbuf_reserve(b, en + (n - i) + 8);
    memcpy(b->p + b->len, e, en);
    b->len += en;
  }
  b->p[b->len] = '\0';
}

void sbuf_json_str(sbuf *b, const char *s) {
  if (!s) {
    sbuf_adds(b, "null");
    return;
  }
  sbuf_add(b, "\"", 1);
  sbuf_json_esc(b, s, strlen(s));
  sbuf_add(b, "\"", 1);
}

void sbuf_free(sbuf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

char *sim_strndup(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) abort();
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

/* A whole file (at most max bytes; 0: no limit), NUL-terminated; NULL
 * when it cannot be opened. */
char *sim_slurp(const char *path, size_t max, size_t *n) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return NULL;
  sbuf b = {0};
  char tmp[65536];
  size_t r;
  while ((r = fread(tmp, 1, sizeof tmp, f)) > 0 && (!max || b.len < max)) sbuf_add(&b, tmp, r);
  fclose(f);
  *n = b.len;
  return b.p ? b.p : sim_strndup("", 0);
}

/* Length of the SSE event starting at p, including its blank-line
 * separator (LF LF or LF CR LF); the rest of the text when there is none. */
size_t sim_event_len(const char *p, size_t n) {
  for (size_t i = 0; i + 1 < n; i++) {
    if (p[i] == '\n' && p[i + 1] == '\n') return i + 2;
    if (p[i] == '\n' && p[i + 1] == '\r' && i + 2 < n && p[i + 2] == '\n') return i + 3;
  }
  return n;
}

double sim_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Stats are rounded so cJSON prints 0.623, not 0.62312345678901234. */
double sim_round(double x, int digits) {
  double m = pow(10.0, digits);
  return round(x * m) / m;
}
