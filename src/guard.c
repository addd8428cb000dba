/*
 * guard.c - the repetition guard (guard.h): the rules of the Lua guard it
 * replaced (tests/lua/repetition_ref.lua), each pattern of it written as
 * the byte test it amounts to in the C locale, and the work incremental:
 * a piece is scanned once for segment ends (an end is decided by the
 * bytes before it), appended to the character tail once, and the phrase
 * rule compares the tail's last bytes with those a period before them.
 *
 * Ownership: the guard owns its pending text, its tail, its segments (a
 * key and a text in one block each) and the report's line.
 */
#include "guard.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RUNAWAY 4096 /* pending bytes judged as one segment */

typedef struct seg {
  char *key; /* key, NUL, then the text: one block */
  size_t klen;
  const char *text;
  size_t tlen;
  int prose;
} seg;

typedef struct buf {
  char *p;
  size_t len, cap;
} buf;

struct mz_guard {
  mz_guard_opts o;
  double seg_max; /* segments kept: max(window, repeats * max_cycle) */
  size_t cap;     /* the tail's bound */
  size_t k_least; /* the fewest of the tail's last bytes a passing period repeats (at most 8 counted) */
  buf pend;       /* text not yet cut into segments */
  buf tail;       /* the normalised character tail */
  buf scratch;    /* a key being made */
  seg *segs;
  size_t nseg, seg_alloc;
  int fence; /* inside a ``` or ~~~ fence */
  mz_guard_rule rule;
  char *line;
  size_t line_len;
  long count;
};

/* ------------------------------------------------------------ bytes */

static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }
static int is_alpha(unsigned char c) { return is_upper(c) || (c >= 'a' && c <= 'z'); }
static int is_alnum(unsigned char c) { return is_alpha(c) || (c >= '0' && c <= '9'); }
static int is_punct(unsigned char c) { return c >= 33 && c <= 126 && !is_alnum(c); }
static int is_letter(unsigned char c) { return c >= 128 || is_alpha(c); } /* [%a\128-\255] */
static int is_stop(unsigned char c) { return c == '.' || c == '!' || c == '?'; }
static int is_closer(unsigned char c) { return c == '"' || c == '\'' || c == ')' || c == ']'; }
static unsigned char to_lower(unsigned char c) { return is_upper(c) ? (unsigned char)(c + 32) : c; }

static const char ELLIPSIS[] = "\xe2\x80\xa6";
static const char BULLET[] = "\xe2\x80\xa2";

static size_t letters(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += is_letter((unsigned char)s[i]);
  return k;
}

static int reserve(buf *b, size_t more) {
  if (b->cap - b->len >= more) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap - b->len < more) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}

/* ------------------------------------------------------------ segments */

/* The comparison key of the trimmed segment t[0..n) into g->scratch:
 * lower-cased, white space runs as one space, a bullet, a list marker and
 * the trailing punctuation and spaces removed. Its length, 0 when it is
 * to be ignored (too few letters), -1 out of memory. */
static long key_of(mz_guard *g, const char *t, size_t n) {
  buf *b = &g->scratch;
  b->len = 0;
  if (reserve(b, n + 1)) return -1;
  char *k = b->p;
  size_t len = 0;
  for (size_t i = 0; i < n;) { /* gsub("%s+", " ") */
    unsigned char c = (unsigned char)t[i];
    if (is_space(c)) {
      while (i < n && is_space((unsigned char)t[i])) i++;
      k[len++] = ' ';
    } else {
      k[len++] = (char)to_lower(c);
      i++;
    }
  }
  size_t a = 0;
  if (len && k[0] == ' ') a = 1;                       /* ^ */
  if (len > a && k[len - 1] == ' ') len--;             /* $ */
  if (len - a >= 3 && memcmp(k + a, BULLET, 3) == 0) { /* ^• ? */
    a += 3;
    if (a < len && k[a] == ' ') a++;
  }
  size_t m = a; /* ^[%-%*+>]+ (a run, then one space) */
  while (m < len && (k[m] == '-' || k[m] == '*' || k[m] == '+' || k[m] == '>')) m++;
  if (m > a && m < len && k[m] == ' ') a = m + 1;
  m = a; /* ^%d+[%.%)] */
  while (m < len && k[m] >= '0' && k[m] <= '9') m++;
  if (m > a && m + 1 < len && (k[m] == '.' || k[m] == ')') && k[m + 1] == ' ') a = m + 2;
  size_t out = 0; /* the ellipses as "...", moved to the front */
  for (size_t i = a; i < len;) {
    if (i + 3 <= len && memcmp(k + i, ELLIPSIS, 3) == 0) {
      memcpy(k + out, "...", 3);
      out += 3;
      i += 3;
    } else {
      k[out++] = k[i++];
    }
  }
  len = out;
  while (len && (k[len - 1] == ' ' || is_punct((unsigned char)k[len - 1]))) len--; /* [%p ]+$ */
  if ((double)letters(k, len) < g->o.min_letters) return 0;
  return (long)len;
}

static const char *const CODE_WORDS[] = {
    "return", "end",    "local",   "else",  "elif",   "elseif", "fi",       "done",  "break", "continue",
    "pass",   "import", "from",    "def",   "fn",     "func",   "function", "let",   "const", "var",
    "if",     "for",    "while",   "case",  "switch", "goto",   "print",    "raise", "throw", "try",
    "catch",  "except", "finally", "defer", "go",     "val",    NULL};

/* Whether the trimmed segment looks like a line of code rather than prose:
 * [{};=`], a call "f(", or a code word first with no final stop. */
static int is_code(const char *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char c = t[i];
    if (c == '{' || c == '}' || c == ';' || c == '=' || c == '`') return 1;
    if (c == '(' && i > 0 && (is_alnum((unsigned char)t[i - 1]) || t[i - 1] == '_')) return 1;
  }
  size_t w = 0; /* ^[%a_#]+ */
  while (w < n && (is_alpha((unsigned char)t[w]) || t[w] == '_' || t[w] == '#')) w++;
  if (w == 0 || w > 8 || is_stop((unsigned char)t[n - 1])) return 0;
  char low[9];
  for (size_t i = 0; i < w; i++) low[i] = (char)to_lower((unsigned char)t[i]);
  low[w] = '\0';
  for (const char *const *cw = CODE_WORDS; *cw; cw++)
    if (strcmp(*cw, low) == 0) return 1;
  return 0;
}

static int trigger(mz_guard *g, mz_guard_rule rule, const char *line, size_t len, long count) {
  char *p = malloc(len + 1);
  if (!p) return -1;
  memcpy(p, line, len);
  p[len] = '\0';
  g->rule = rule;
  g->line = p;
  g->line_len = len;
  g->count = count;
  return 1;
}

static int same_key(const seg *a, const seg *b) { return a->klen == b->klen && memcmp(a->key, b->key, a->klen) == 0; }

/* Cycle rule: the tail of the segment list periodic with a short cycle. */
static int check_cycle(mz_guard *g) {
  size_t n = g->nseg;
  for (size_t p = 1; (double)p <= g->o.max_cycle && p <= n; p++) {
    size_t m = 0;
    while (n - m > p && same_key(&g->segs[n - 1 - m], &g->segs[n - 1 - m - p])) m++;
    long cycles = (long)((m + p) / p);
    if ((double)cycles >= g->o.repeats) {
      const seg *s = &g->segs[n - p];
      return trigger(g, MZ_GUARD_CYCLE, s->text, s->tlen, cycles);
    }
  }
  return 0;
}

/* Count rule: the newest prose segment, counted among those kept. */
static int check_count(mz_guard *g) {
  const seg *last = &g->segs[g->nseg - 1];
  if (!last->prose) return 0;
  long c = 0;
  for (size_t i = 0; i < g->nseg; i++) c += same_key(&g->segs[i], last);
  if ((double)c >= g->o.count) return trigger(g, MZ_GUARD_COUNT, last->text, last->tlen, c);
  return 0;
}

/* One complete segment: track fences, then apply the segment rules. */
static int segment(mz_guard *g, const char *raw, size_t n) {
  size_t a = 0;
  while (a < n && is_space((unsigned char)raw[a])) a++;
  while (n > a && is_space((unsigned char)raw[n - 1])) n--;
  const char *t = raw + a;
  n -= a;
  if (n >= 3 && (memcmp(t, "```", 3) == 0 || memcmp(t, "~~~", 3) == 0)) {
    g->fence = !g->fence;
    return 0;
  }
  long klen = key_of(g, t, n);
  if (klen <= 0) return (int)klen;
  if (g->nseg == g->seg_alloc) {
    size_t cap = g->seg_alloc ? g->seg_alloc * 2 : 8;
    seg *s = realloc(g->segs, cap * sizeof *s);
    if (!s) return -1;
    g->segs = s;
    g->seg_alloc = cap;
  }
  char *block = malloc((size_t)klen + 1 + n + 1);
  if (!block) return -1;
  memcpy(block, g->scratch.p, (size_t)klen);
  block[klen] = '\0';
  memcpy(block + klen + 1, t, n);
  block[klen + 1 + n] = '\0';
  g->segs[g->nseg++] = (seg){block, (size_t)klen, block + klen + 1, n, !g->fence && !is_code(t, n)};
  if ((double)g->nseg > g->seg_max) {
    free(g->segs[0].key);
    memmove(g->segs, g->segs + 1, --g->nseg * sizeof *g->segs);
  }
  int r = check_cycle(g);
  return r ? r : check_count(g);
}

/* Whether b[i] ends a segment: a line break; white space after a stop and
 * its closers (find "[%.!%?][\"')%]]*%s"); white space after an ellipsis.
 * Decided by the bytes before it alone: the byte before a segment is its
 * predecessor's end, white space, which neither pattern crosses. */
static int is_end(const char *b, size_t i) {
  unsigned char c = (unsigned char)b[i];
  if (c == '\n') return 1;
  if (!is_space(c)) return 0;
  size_t k = i;
  while (k > 0 && is_closer((unsigned char)b[k - 1])) k--;
  if (k > 0 && is_stop((unsigned char)b[k - 1])) return 1;
  return i >= 3 && memcmp(b + i - 3, ELLIPSIS, 3) == 0;
}

/* Append s to the pending text, cut the segments it completes and judge
 * each; a pending text over RUNAWAY bytes is judged as one. */
static int feed_segments(mz_guard *g, const char *s, size_t n) {
  buf *p = &g->pend;
  if (reserve(p, n)) return -1;
  size_t from = p->len, pos = 0;
  memcpy(p->p + p->len, s, n);
  p->len += n;
  for (size_t i = from; i < p->len; i++) {
    if (!is_end(p->p, i)) continue;
    int r = segment(g, p->p + pos, i + 1 - pos);
    if (r) return r;
    pos = i + 1;
  }
  if (pos) {
    p->len -= pos;
    memmove(p->p, p->p + pos, p->len);
  }
  if (p->len > RUNAWAY) { /* a runaway line: judge what there is */
    size_t len = p->len;
    p->len = 0;
    return segment(g, p->p, len);
  }
  return 0;
}

/* ------------------------------------------------------------ characters */

/* Append s to the tail: lower-cased, each white space run of the piece as
 * one " ", or "\n" when it holds a line break; a run at the start of the
 * piece merges into one the tail ends in. Over the bound, the tail keeps
 * its last 3/4 of it. */
static int feed_tail(mz_guard *g, const char *s, size_t n) {
  buf *t = &g->tail;
  if (reserve(t, n)) return -1;
  char *w = t->p + t->len;
  size_t out = 0;
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (!is_space(c)) {
      w[out++] = (char)to_lower(c);
      i++;
      continue;
    }
    char ws = ' ';
    for (; i < n && is_space((unsigned char)s[i]); i++)
      if (s[i] == '\n') ws = '\n';
    char *last = t->len ? &t->p[t->len - 1] : NULL;
    if (out == 0 && last && (*last == ' ' || *last == '\n')) {
      if (*last == ' ') *last = ws;
    } else {
      w[out++] = ws;
    }
  }
  t->len += out;
  if (t->len > g->cap) {
    size_t keep = g->cap * 3 / 4;
    memmove(t->p, t->p + t->len - keep, keep);
    t->len = keep;
  }
  return 0;
}

/* How many times the last p bytes of t[0..n) repeat back to back at its end. */
static size_t repeats_at_end(const char *t, size_t n, size_t p) {
  const char *unit = t + n - p;
  size_t r = 1;
  while ((r + 1) * p <= n && memcmp(t + n - (r + 1) * p, unit, p) == 0) r++;
  return r;
}

/* Report the phrase of period p repeated r times at the tail's end: the
 * unit as it first appeared (the run extended backwards byte by byte),
 * rotated to begin on a line, else on a word ("and so on", not "so on
 * and"), trimmed. */
static int trigger_phrase(mz_guard *g, size_t p, size_t r) {
  const char *t = g->tail.p;
  size_t k = g->tail.len - r * p; /* the bytes before the run */
  while (k >= 1 && t[k - 1] == t[k - 1 + p]) k--;
  const char *u = t + k;
  size_t i = 0; /* the rotation: the unit's first i bytes go last */
  const char *nl = memchr(u, '\n', p);
  if (nl) {
    i = (size_t)(nl - u) + 1;
  } else if (k >= 1 && !is_space((unsigned char)t[k - 1])) {
    for (size_t j = 0; j < p && !i; j++)
      if (is_space((unsigned char)u[j])) i = j + 1;
  }
  if (i >= p) i = 0;
  buf *b = &g->scratch;
  b->len = 0;
  if (reserve(b, p)) return -1;
  memcpy(b->p, u + i, p - i);
  memcpy(b->p + p - i, u, i);
  size_t a = 0, z = p;
  while (a < z && is_space((unsigned char)b->p[a])) a++;
  while (z > a && is_space((unsigned char)b->p[z - 1])) z--;
  return trigger(g, MZ_GUARD_PHRASE, b->p + a, z - a, (long)r);
}

/* Phrase rule: the smallest period that passes the counts decides; a unit
 * with too few letters ends the search (its multiples are as trivial), a
 * unit with a line break needs line_repeats. */
/* The verdict on period p: 1 or -1 decide (triggered, out of memory), 0
 * ends the search (a trivial unit), 2 goes on to the next period. */
static int judge_period(mz_guard *g, size_t p) {
  const char *t = g->tail.p;
  size_t n = g->tail.len, r = repeats_at_end(t, n, p);
  if ((double)r < g->o.phrase_repeats || (double)(r * p) < g->o.phrase_min_chars) return 2;
  const char *u = t + n - p;
  if ((double)letters(u, p) < g->o.phrase_min_letters) return 0;
  if (memchr(u, '\n', p) && (double)r < g->o.line_repeats) return 0;
  return trigger_phrase(g, p, r);
}

static int check_phrase(mz_guard *g) {
  const char *t = g->tail.p;
  const size_t n = g->tail.len;
  size_t pmax = n / 2;
  if ((double)pmax > g->o.max_phrase) pmax = (size_t)g->o.max_phrase;
  if (pmax == 0) return 0;
  if (g->k_least == 0) { /* one repetition may pass: every period is judged */
    for (size_t p = 1; p <= pmax; p++) {
      int v = judge_period(g, p);
      if (v != 2) return v;
    }
    return 0;
  }
  /* The usual case: only the periods whose byte a period back is the last
   * byte may pass (and with k_least >= 8, its last 8 bytes): found right
   * to left, smallest period first. */
  uint64_t last = 0, w;
  if (n >= 8) memcpy(&last, t + n - 8, 8);
  const char c = t[n - 1], *end = t + n - 1;
  for (size_t p = 1; p <= pmax; p++) {
    if (end[-(ptrdiff_t)p] != c) continue;
    if (g->k_least >= 8 && n >= p + 8 && (memcpy(&w, t + n - 8 - p, 8), w != last)) continue;
    int v = judge_period(g, p);
    if (v != 2) return v;
  }
  return 0;
}

/* ------------------------------------------------------------ the guard */

mz_guard *mz_guard_new(const mz_guard_opts *o) {
  mz_guard *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->o = *o;
  double cycles = o->repeats * o->max_cycle, cap = o->max_phrase * o->line_repeats * 2;
  g->seg_max = o->window > cycles ? o->window : cycles;
  if (!(cap >= 1024)) cap = 1024; /* NaN too */
  if (cap > (double)(SIZE_MAX / 4)) cap = (double)(SIZE_MAX / 4);
  g->cap = (size_t)cap;
  /* A period p passes with r repetitions, r >= phrase_repeats and r * p >=
   * phrase_min_chars, so the tail's last (r - 1) * p bytes equal those p
   * before them: at least max((phrase_repeats - 1) * p, phrase_min_chars -
   * p) of them, whatever p. Fewer equal bytes rule p out at once. */
  double least = 8;
  for (size_t p = 1; (double)p <= o->max_phrase && least > 0; p++) {
    double a = (o->phrase_repeats - 1) * (double)p, b = o->phrase_min_chars - (double)p;
    if ((a > b ? a : b) < least) least = a > b ? a : b;
  }
  g->k_least = least >= 8 ? 8 : least >= 1 ? (size_t)least : 0;
  return g;
}

void mz_guard_free(mz_guard *g) {
  if (!g) return;
  for (size_t i = 0; i < g->nseg; i++) free(g->segs[i].key);
  free(g->segs);
  free(g->pend.p);
  free(g->tail.p);
  free(g->scratch.p);
  free(g->line);
  free(g);
}

int mz_guard_feed(mz_guard *g, const char *s, size_t n) {
  if (g->rule != MZ_GUARD_NONE) return 1;
  if (n == 0) return 0;
  if (feed_tail(g, s, n)) return -1;
  int r = feed_segments(g, s, n);
  return r ? r : check_phrase(g);
}

int mz_guard_check(mz_guard *g, const char *s, size_t n) {
  int r = mz_guard_feed(g, s, n);
  if (r == 0 && g->pend.len) {
    size_t len = g->pend.len;
    g->pend.len = 0;
    r = segment(g, g->pend.p, len);
  }
  return r;
}

mz_guard_rule mz_guard_rule_of(const mz_guard *g) { return g->rule; }

const char *mz_guard_rule_name(mz_guard_rule r) {
  switch (r) {
  case MZ_GUARD_CYCLE: return "cycle";
  case MZ_GUARD_COUNT: return "count";
  case MZ_GUARD_PHRASE: return "phrase";
  default: return NULL;
  }
}

const char *mz_guard_line(const mz_guard *g, size_t *len) {
  if (len) *len = g->line_len;
  return g->line;
}

long mz_guard_count(const mz_guard *g) { return g->count; }
