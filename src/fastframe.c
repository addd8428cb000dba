/*
 * fastframe.c - the token-frame fast path (fastframe.h).
 *
 * A frame is scanned once, left to right, with no allocation and no
 * number conversion: values we do not need are validated and skipped,
 * strings are returned as pointers into the payload. Correctness rests on
 * one rule: accept only what cJSON 1.7 also accepts and reads the same way
 * (the differential test in tests/c/test_fastframe.c holds us to it).
 * Where cJSON is lenient (raw control characters in strings, any byte
 * <= 0x20 as whitespace, a leading BOM, "01") or quirky (numbers over 63
 * bytes fail, duplicate keys: last one wins) we refuse and let the slow
 * path decide. \u0000 is the one quirk decode.c repairs on its side.
 */
#include "fastframe.h"

#include <stdint.h>
#include <string.h>

/* The walk is a handful of small functions; the hot ones are forced
 * inline so the frame compiles to one straight scan. */
#ifdef __GNUC__
#define NOINLINE __attribute__((noinline))
#define HOT static inline __attribute__((always_inline))
#else
#define NOINLINE
#define HOT static inline
#endif

#define MAX_DEPTH 32  /* nesting in skipped values; cJSON allows 1000 */
#define MAX_NUMBER 63 /* cJSON copies at most 63 bytes of a number */

typedef struct cur {
  const unsigned char *p, *end;
} cur;

/* Bytes that end a run of plain string bytes: controls, '"' and '\\'. */
static const unsigned char str_stop[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,         1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ['"'] = 1, ['\\'] = 1,
};

static int is_ws(unsigned char c) { return c <= ' ' && (c == ' ' || c == '\n' || c == '\r' || c == '\t'); }

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

HOT void skip_ws(cur *c) {
  while (c->p < c->end && is_ws(*c->p)) c->p++;
}

/* Skip whitespace, then consume ch if it is next. Servers send compact
 * JSON, so the next byte is tried first. */
HOT int eat(cur *c, unsigned char ch) {
  if (c->p < c->end && *c->p == ch) return c->p++, 1;
  skip_ws(c);
  if (c->p >= c->end || *c->p != ch) return 0;
  c->p++;
  return 1;
}

static int hex_digit(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Four hex digits (the caller checked they are there), or -1. */
static long hex4(const unsigned char *p) {
  long v = 0;
  for (int i = 0; i < 4; i++) {
    int d = hex_digit(p[i]);
    if (d < 0) return -1;
    v = v << 4 | d;
  }
  return v;
}

static int is_high(long u) { return u >= 0xD800 && u <= 0xDBFF; }

static int is_low(long u) { return u >= 0xDC00 && u <= 0xDFFF; }

/* p is at a backslash: the byte after a valid escape, or NULL. Unpaired
 * surrogates are refused like cJSON does; \u0000 is taken (decode.c keeps
 * NUL characters in cJSON's strings too, so both paths read the same). */
static const unsigned char *scan_escape(const unsigned char *p, const unsigned char *end) {
  long u;
  if (end - p < 2) return NULL;
  switch (p[1]) {
  case '"':
  case '\\':
  case '/':
  case 'b':
  case 'f':
  case 'n':
  case 'r':
  case 't': return p + 2;
  case 'u': break;
  default: return NULL;
  }
  if (end - p < 6 || (u = hex4(p + 2)) < 0 || is_low(u)) return NULL;
  if (!is_high(u)) return p + 6;
  if (end - p < 12 || p[6] != '\\' || p[7] != 'u' || !is_low(hex4(p + 8))) return NULL;
  return p + 12;
}

/* The string scan reads sixteen bytes at a time with SSE2 (every x86-64),
 * else eight at a time on little-endian GCC/Clang (SWAR), where the first
 * stop byte is found with one ctz; the last few bytes one at a time. */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
#if defined(__SSE2__)
#define VEC16 1
#include <emmintrin.h>
#endif
#endif

#ifdef SWAR
/* The high bit of byte i set where byte i of w is '"', '\\' or a control
 * (below 0x20): the classic "has zero byte" test, applied three times. A
 * borrow can set bits above a true match, never below, so the lowest set
 * bit marks the first stop byte exactly. */
static uint64_t stop_bits(uint64_t w) {
  const uint64_t ones = 0x0101010101010101u, high = 0x8080808080808080u;
  uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
  return (((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w)) & high;
}
#endif

/* The first byte at or after p that is not plain string content. */
static const unsigned char *skip_plain(const unsigned char *p, const unsigned char *end) {
#ifdef VEC16
  const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1F);
  while (end - p >= 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    /* min(v, 0x1F) == v exactly where v <= 0x1F (unsigned) */
    __m128i s = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                             _mm_cmpeq_epi8(_mm_min_epu8(v, ctl), v));
    unsigned m = (unsigned)_mm_movemask_epi8(s);
    if (m) return p + __builtin_ctz(m);
    p += 16;
  }
#endif
#ifdef SWAR
  uint64_t w, m;
  while (end - p >= 8) {
    memcpy(&w, p, 8); /* one unaligned load */
    if ((m = stop_bits(w))) return p + (__builtin_ctzll(m) >> 3);
    p += 8;
  }
#endif
  while (p < end && !str_stop[*p]) p++;
  return p;
}

/* The rest of a string holding escapes, from the backslash at p: the
 * closing quote, or NULL. Out of line, so the common string without any
 * stays a short function. */
static NOINLINE const unsigned char *escaped_tail(const unsigned char *p, const unsigned char *end) {
  for (;;) {
    if (!(p = scan_escape(p, end))) return NULL;
    p = skip_plain(p, end);
    if (p >= end || *p < 0x20) return NULL;
    if (*p == '"') return p;
  }
}

/* A string at c->p (the opening quote): its body into *s. */
HOT int scan_string(cur *c, mz_fast_str *s) {
  const unsigned char *q = c->p, *p;
  if (q >= c->end || *q != '"') return 0;
  p = skip_plain(q + 1, c->end);
  if (p >= c->end || *p < 0x20) return 0;
  s->esc = *p == '\\';
  if (s->esc && !(p = escaped_tail(p, c->end))) return 0;
  s->p = (const char *)q + 1;
  s->len = (size_t)(p - q - 1);
  c->p = p + 1;
  return 1;
}

/* lit (a literal of n >= 4 bytes) is next. Always inlined with a
 * constant lit, the compiler folds its loads into constants: a few
 * compares of 8 (or 4) bytes, the last load overlapping the one before. */
HOT uint64_t load8(const void *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

HOT uint32_t load4(const void *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

HOT int lit_at(const cur *c, const char *lit, size_t n) {
  const unsigned char *p = c->p;
  if ((size_t)(c->end - p) < n) return 0;
  if (n < 8) return load4(p) == load4(lit) && load4(p + n - 4) == load4(lit + n - 4);
  for (size_t i = 0; i + 8 < n; i += 8)
    if (load8(p + i) != load8(lit + i)) return 0;
  /* every caller passes a literal of exactly n bytes (AT: sizeof - 1), so
   * lit + n - 8 stays inside it; cppcheck pairs n = 10 with a shorter one */
  // cppcheck-suppress pointerOutOfBoundsCond
  return load8(p + n - 8) == load8(lit + n - 8);
}

/* At least one digit. With SWAR, eight at a time: t = w ^ "00000000" has
 * a digit byte exactly where t is 0..9, i.e. where the high nibble is 0
 * and the low nibble + 6 does not carry into it (never past the byte). */
static int digits(cur *c) {
  const unsigned char *p = c->p;
#ifdef SWAR
  const uint64_t ones = 0x0101010101010101u;
  while (c->end - c->p >= 8) {
    uint64_t t = load8(c->p) ^ (ones * '0');
    uint64_t m = (t | ((t & ones * 0x0F) + ones * 6)) & ones * 0xF0;
    if (m) {
      c->p += __builtin_ctzll(m) >> 3;
      return c->p > p;
    }
    c->p += 8;
  }
#endif
  while (c->p < c->end && is_digit(*c->p)) c->p++;
  return c->p > p;
}

/* A number in strict JSON grammar, no longer than cJSON will read. */
static int scan_number(cur *c) {
  const unsigned char *start = c->p;
  if (c->p < c->end && *c->p == '-') c->p++;
  if (c->p < c->end && *c->p == '0') c->p++;
  else if (!digits(c)) return 0;
  if (c->p < c->end && *c->p == '.' && (c->p++, !digits(c))) return 0;
  if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
    c->p++;
    if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
    if (!digits(c)) return 0;
  }
  return c->p - start <= MAX_NUMBER;
}

HOT int scan_literal(cur *c, const char *lit, size_t n) {
  if (!lit_at(c, lit, n)) return 0;
  c->p += n;
  return 1;
}

static int skip_value(cur *c, int depth);

/* The rest of an array or object after its opening bracket. */
static int skip_container(cur *c, unsigned char close, int depth) {
  mz_fast_str k;
  c->p++;
  if (eat(c, close)) return 1;
  do {
    if (close == '}') {
      skip_ws(c);
      if (!scan_string(c, &k) || !eat(c, ':')) return 0;
    }
    if (!skip_value(c, depth)) return 0;
  } while (eat(c, ','));
  return eat(c, close);
}

/* Validate and skip any JSON value (leading whitespace allowed). */
static int skip_value(cur *c, int depth) {
  mz_fast_str s;
  skip_ws(c);
  if (c->p >= c->end) return 0;
  switch (*c->p) {
  case '"': return scan_string(c, &s);
  case '{': return depth < MAX_DEPTH && skip_container(c, '}', depth + 1);
  case '[': return depth < MAX_DEPTH && skip_container(c, ']', depth + 1);
  case 't': return scan_literal(c, "true", 4);
  case 'f': return scan_literal(c, "false", 5);
  case 'n': return scan_literal(c, "null", 4);
  default: return scan_number(c);
  }
}

/* ---------------------------------------------------------- the frame */

/* What the walk collects: the output, plus "reasoning" (vLLM, Ollama),
 * which only counts when reasoning_content is empty or absent. */
typedef struct scan {
  mz_fast *out;
  mz_fast_str alt;
  int has_choices;
} scan;

/* One member of an object; c is at its key (the opening quote) and the
 * function must consume the key, the colon and the value. seen is per
 * object. */
typedef int (*member_fn)(cur *c, scan *sc, unsigned *seen);

HOT int walk_object(cur *c, member_fn fn, scan *sc) {
  unsigned seen = 0;
  if (!eat(c, '{')) return 0;
  skip_ws(c);
  if (c->p < c->end && *c->p == '}') return c->p++, 1;
  for (;;) {
    if (!fn(c, sc, &seen)) return 0;
    if (c->p < c->end && *c->p == ',' && c->end - c->p > 1 && c->p[1] == '"') {
      c->p++; /* compact JSON: straight on to the next key */
      continue;
    }
    skip_ws(c);
    if (c->p >= c->end) return 0;
    if (*c->p == '}') return c->p++, 1;
    if (*c->p++ != ',') return 0;
    skip_ws(c);
  }
}

/* Keys are matched as raw bytes, quotes included (lit_at): every key we
 * take is plain ASCII, so these bytes are exactly the string cJSON would
 * read, and any other key (escaped, unknown, malformed) is refused, as the
 * walk refuses unknown keys anyway. */
#define AT(c, lit) lit_at((c), (lit), sizeof(lit) - 1)

/* Each known key once (bit 0 = unknown key): a repeat would make cJSON's
 * last-one-wins matter. Then past the key (n bytes), the colon and the
 * whitespace before the value. */
HOT int key_once(cur *c, size_t n, unsigned *seen, unsigned bit) {
  if (!bit || (*seen & bit)) return 0;
  *seen |= bit;
  c->p += n;
  if (c->p < c->end && *c->p == ':' && c->end - c->p > 1 && !is_ws(c->p[1])) return c->p++, 1;
  if (!eat(c, ':')) return 0;
  skip_ws(c);
  return 1;
}

HOT int string_or_null(cur *c, mz_fast_str *s) {
  if (c->p < c->end && *c->p == 'n') return scan_literal(c, "null", 4);
  return scan_string(c, s);
}

static int delta_member(cur *c, scan *sc, unsigned *seen) {
  if (AT(c, "\"content\"")) return key_once(c, 9, seen, 1) && string_or_null(c, &sc->out->content);
  if (AT(c, "\"reasoning_content\"")) return key_once(c, 19, seen, 2) && string_or_null(c, &sc->out->reasoning);
  if (AT(c, "\"reasoning\"")) return key_once(c, 11, seen, 4) && string_or_null(c, &sc->alt);
  return 0;
}

/* "index": a plain small integer; anything fancier (1.0, 1e0, -1) goes
 * to cJSON, which truncates a double. */
static int scan_index(cur *c, int *index) {
  const unsigned char *start = c->p;
  int v = 0;
  if (c->p < c->end && *c->p == '0') c->p++;
  else
    while (c->p < c->end && is_digit(*c->p) && c->p - start < 6) v = v * 10 + (*c->p++ - '0');
  if (c->p == start) return 0;
  if (c->p < c->end && (is_digit(*c->p) || *c->p == '.' || *c->p == 'e' || *c->p == 'E')) return 0;
  *index = v;
  return 1;
}

static int choice_member(cur *c, scan *sc, unsigned *seen) {
  if (AT(c, "\"index\"")) return key_once(c, 7, seen, 1) && scan_index(c, &sc->out->index);
  if (AT(c, "\"delta\"")) return key_once(c, 7, seen, 8) && walk_object(c, delta_member, sc);
  if (AT(c, "\"finish_reason\"")) return key_once(c, 15, seen, 2) && scan_literal(c, "null", 4);
  /* logprobs asked for: not a plain token frame (cJSON keeps them, decode.c) */
  if (AT(c, "\"logprobs\"")) return key_once(c, 10, seen, 4) && scan_literal(c, "null", 4);
  return 0;
}

/* "choices": [ one choice ]. */
static int scan_choices(cur *c, scan *sc) {
  sc->has_choices = 1;
  return eat(c, '[') && walk_object(c, choice_member, sc) && eat(c, ']');
}

/* A value of the fields we skip: mostly strings, so those inline. */
HOT int skip_field(cur *c) {
  mz_fast_str s;
  if (c->p < c->end && *c->p == '"') return scan_string(c, &s);
  return skip_value(c, 1);
}

static int top_member(cur *c, scan *sc, unsigned *seen) {
  if (c->end - c->p < 2) return 0;
  switch (c->p[1]) {
  case 'c':
    if (AT(c, "\"choices\"")) return key_once(c, 9, seen, 1) && scan_choices(c, sc);
    return AT(c, "\"created\"") && key_once(c, 9, seen, 2) && skip_field(c);
  case 'i': return AT(c, "\"id\"") && key_once(c, 4, seen, 4) && skip_field(c);
  case 'o': return AT(c, "\"object\"") && key_once(c, 8, seen, 8) && skip_field(c);
  case 'm': return AT(c, "\"model\"") && key_once(c, 7, seen, 16) && skip_field(c);
  case 's': return AT(c, "\"system_fingerprint\"") && key_once(c, 20, seen, 32) && skip_field(c);
  default: return 0;
  }
}

int mz_fast_frame(const char *data, size_t len, mz_fast *out) {
  memset(out, 0, sizeof *out);
  if (!data) return 0; /* before data + len: no arithmetic on NULL */
  cur c = {(const unsigned char *)data, (const unsigned char *)data + len};
  scan sc = {out, {NULL, 0, 0}, 0};
  if (!walk_object(&c, top_member, &sc) || !sc.has_choices) return 0;
  skip_ws(&c);
  if (c.p != c.end) return 0;
  if (!out->reasoning.len) out->reasoning = sc.alt.len ? sc.alt : (mz_fast_str){NULL, 0, 0};
  return 1;
}

/* ---------------------------------------------------------- unescape */

static size_t put_utf8(unsigned long cp, char *o) {
  if (cp < 0x80) return o[0] = (char)cp, 1;
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* \uXXXX at p (6 bytes available, hex checked by the caller), joined with
 * a following low surrogate when it is a high one. Sets *cp, returns the
 * bytes consumed. */
static size_t read_u(const unsigned char *p, const unsigned char *end, long u, unsigned long *cp) {
  long lo;
  if (is_high(u) && end - p >= 12 && p[6] == '\\' && p[7] == 'u' && is_low(lo = hex4(p + 8))) {
    *cp = 0x10000 + ((unsigned long)(u - 0xD800) << 10) + (unsigned long)(lo - 0xDC00);
    return 12;
  }
  *cp = is_high(u) || is_low(u) ? 0xFFFD : (unsigned long)u;
  return 6;
}

/* One escape at p (a backslash): writes its bytes at *o, returns the
 * input bytes consumed. A malformed one yields its backslash as is. */
static size_t unescape_one(const unsigned char *p, const unsigned char *end, char **o) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  unsigned long cp;
  long u;
  int ch = end - p >= 2 ? p[1] : -1;
  for (int i = 0; from[i]; i++)
    if (ch == from[i]) return *(*o)++ = to[i], 2;
  if (ch == 'u' && end - p >= 6 && (u = hex4(p + 2)) >= 0) {
    size_t n = read_u(p, end, u, &cp);
    *o += put_utf8(cp, *o);
    return n;
  }
  *(*o)++ = '\\';
  return 1;
}

size_t mz_json_unescape(const char *s, size_t len, char *out) {
  const unsigned char *p = (const unsigned char *)s, *end = p + len;
  char *o = out;
  while (p < end) {
    const unsigned char *b = memchr(p, '\\', (size_t)(end - p));
    size_t run = (size_t)((b ? b : end) - p);
    memcpy(o, p, run);
    o += run;
    p += run;
    if (b) p += unescape_one(p, end, &o);
  }
  return (size_t)(o - out);
}
