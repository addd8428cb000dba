/*
 * jsonstream.c - incremental JSON parser (see jsonstream.h for the rules).
 *
 * One pass over each byte, whatever the pieces: the lexer is a state
 * machine whose whole state lives in the struct (nothing on the C stack
 * between calls), so a piece can end anywhere, and no earlier piece is
 * ever read again. Invariants:
 *  - nest containers are open; kind[0..nest) says which; a value starting
 *    now has depth nest.
 *  - for 1 <= L <= min(nest, depth): path[0..plen[L]) is the pointer of
 *    the container at depth L-1, and the part after it names the member
 *    or element of depth L being read (written when its key or element
 *    starts); levels deeper than `depth` keep no pointer at all.
 *  - capturing: a value of depth `depth` is open; its bytes seen in
 *    earlier calls are cap[0..cap_len), the rest are in the current
 *    buffer from cap_from. Only those bytes are kept across calls, and
 *    only while the value is open (cap_len <= max).
 *  - a call returns as soon as a value completes, so the caller can
 *    decode it (and raise, in a binding) with the parser between bytes.
 * A number only ends at the byte after it; that byte is not taken by the
 * call that hands the number out (the next call reads it).
 */
#include "jsonstream.h"

#include <stdlib.h>
#include <string.h>

enum {
  S_PRE,       /* before the first { or [ */
  S_VALUE,     /* a value must come (after ':' or ',' in an array) */
  S_FIRST,     /* a value or ']' (after '[') */
  S_KEY,       /* a member name must come (after ',' in an object) */
  S_KEY_FIRST, /* a member name or '}' (after '{') */
  S_COLON,     /* after a member name */
  S_AFTER,     /* after a value: ',' or the container's close */
  S_STR,       /* in a string */
  S_ESC,       /* after '\' */
  S_HEX,       /* in \uXXXX */
  S_LOW_BS,    /* after a high surrogate: '\' of the low half */
  S_LOW_U,     /* ... its 'u' */
  S_LIT,       /* in true, false or null */
  S_NUM_MINUS, /* after '-' */
  S_NUM_ZERO,  /* after a leading 0 */
  S_NUM_INT,   /* in the integer part */
  S_NUM_DOT,   /* after '.' */
  S_NUM_FRAC,  /* in the fraction */
  S_NUM_E,     /* after 'e' */
  S_NUM_ESIGN, /* after the exponent's sign */
  S_NUM_EXP,   /* in the exponent */
  S_DONE       /* the top-level value ended */
};

int mz_js_init(mz_jsonstream *p, int depth, size_t max) {
  memset(p, 0, sizeof *p);
  p->depth = depth < 0 ? 0 : depth > MZ_JS_MAX_NEST + 1 ? MZ_JS_MAX_NEST + 1 : depth;
  p->max = max ? max : MZ_JS_DEFAULT_MAX;
  p->state = S_PRE;
  p->candidates = 1;
  p->plen = calloc((size_t)p->depth + 1, sizeof *p->plen);
  p->index = calloc((size_t)p->depth + 1, sizeof *p->index);
  if (p->plen && p->index) return 0;
  mz_js_free(p);
  return p->status = MZ_JS_NOMEM;
}

void mz_js_start(mz_jsonstream *p, int root, int candidates) {
  p->root = root == '{' || root == '[' ? root : 0;
  p->candidates = candidates < 1 ? 1 : candidates;
}

void mz_js_free(mz_jsonstream *p) {
  free(p->plen);
  free(p->index);
  free(p->path);
  free(p->cap);
  p->plen = p->index = NULL;
  p->path = p->cap = NULL;
  p->path_len = p->path_cap = p->cap_len = p->cap_cap = 0;
}

/* Make *buf hold need bytes (doubling from 64). 0 or MZ_JS_NOMEM. */
static int grow(char **buf, size_t *cap, size_t need) {
  size_t n = *cap ? *cap : 64;
  char *nb;
  if (need <= *cap) return 0;
  while (n < need) n *= 2;
  nb = realloc(*buf, n);
  if (!nb) return MZ_JS_NOMEM;
  *buf = nb;
  *cap = n;
  return 0;
}

/* Fail at byte i of the current buffer. An error met inside a captured
 * value past its cap is the cap's (the byte past it came first), so the
 * verdict does not depend on where the pieces were cut. */
static int fail(mz_jsonstream *p, int status, size_t i) {
  size_t at = p->pos + i;
  if (p->capturing && at > p->cap_abs + p->max && status != MZ_JS_NOMEM) {
    status = MZ_JS_TOOBIG;
    at = p->cap_abs + p->max;
  }
  p->err_at = at;
  return p->status = status;
}

static int path_add(mz_jsonstream *p, const char *s, size_t n, size_t i) {
  if (n > p->max - p->path_len) return fail(p, MZ_JS_TOOBIG, i);
  if (grow(&p->path, &p->path_cap, p->path_len + n)) return fail(p, MZ_JS_NOMEM, i);
  memcpy(p->path + p->path_len, s, n);
  p->path_len += n;
  return 0;
}

/* One decoded byte of a member name into the pointer, '~' and '/' escaped. */
static int path_char(mz_jsonstream *p, unsigned char c, size_t i) {
  if (c == '~') return path_add(p, "~0", 2, i);
  if (c == '/') return path_add(p, "~1", 2, i);
  return path_add(p, (const char *)&c, 1, i);
}

/* A decoded code point of a member name, as UTF-8. */
static int path_code(mz_jsonstream *p, unsigned cp, size_t i) {
  char u[4];
  size_t n;
  if (cp < 0x80) return path_char(p, (unsigned char)cp, i);
  if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
  }
  return path_add(p, u, n, i);
}

/* A value starts at byte i with nest containers open: name it if it is an
 * element of an array at a tracked level, capture it at the chosen depth. */
static int begin_value(mz_jsonstream *p, size_t i) {
  int d = p->nest;
  if (d > 0 && d <= p->depth && p->kind[d - 1] == '[') {
    char num[24];
    size_t k = sizeof num, n = p->index[d]++;
    do num[--k] = (char)('0' + n % 10);
    while (n /= 10);
    num[--k] = '/';
    p->path_len = p->plen[d];
    if (path_add(p, num + k, sizeof num - k, i)) return p->status;
  }
  if (d == p->depth) {
    p->capturing = p->cap_here = 1;
    p->cap_from = i;
    p->cap_abs = p->pos + i;
    p->cap_len = 0;
  }
  return 0;
}

/* A container opens at byte i. */
static int open_container(mz_jsonstream *p, unsigned char c, size_t i) {
  if (begin_value(p, i)) return p->status;
  if (p->nest >= MZ_JS_MAX_NEST) return fail(p, MZ_JS_DEPTH, i);
  p->kind[p->nest++] = c;
  if (p->nest <= p->depth) {
    p->plen[p->nest] = p->path_len;
    p->index[p->nest] = 0;
  }
  p->state = c == '{' ? S_KEY_FIRST : S_FIRST;
  return 0;
}

/* A value ended just before byte e of buf (e = one past its last byte).
 * Returns MZ_JS_VALUE with *out filled when it is at the chosen depth, 0
 * when not, or an error. The state moves on to what follows a value. */
static int end_value(mz_jsonstream *p, const char *buf, size_t e, mz_js_value *out) {
  int at_depth = p->nest == p->depth && p->capturing;
  if (p->nest) p->inner = 1;
  p->state = p->nest ? S_AFTER : S_DONE;
  if (!at_depth) return 0;
  p->capturing = 0;
  if (p->pos + e - p->cap_abs > p->max) {
    p->capturing = 1; /* fail() reports the cap */
    return fail(p, MZ_JS_TOOBIG, e);
  }
  if (p->cap_here) {
    out->text = buf + p->cap_from;
    out->len = e - p->cap_from;
  } else {
    if (grow(&p->cap, &p->cap_cap, p->cap_len + e)) return fail(p, MZ_JS_NOMEM, e);
    memcpy(p->cap + p->cap_len, buf, e);
    p->cap_len += e;
    out->text = p->cap;
    out->len = p->cap_len;
  }
  out->path = p->path ? p->path : "";
  out->path_len = p->depth ? p->path_len : 0;
  out->offset = p->cap_abs;
  p->values++;
  return MZ_JS_VALUE;
}

/* The buffer ends with a captured value open: keep its bytes. */
static int keep_capture(mz_jsonstream *p, const char *buf, size_t len) {
  size_t from = p->cap_here ? p->cap_from : 0, n = len - from;
  if (p->cap_len + n > p->max) return fail(p, MZ_JS_TOOBIG, len);
  if (grow(&p->cap, &p->cap_cap, p->cap_len + n)) return fail(p, MZ_JS_NOMEM, len);
  memcpy(p->cap + p->cap_len, buf + from, n);
  p->cap_len += n;
  p->cap_here = 0;
  return 0;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Between tokens: 1 for white space to skip, else 0; a control byte that
 * is not white space is an error (returned negative). */
static int skip_ws(mz_jsonstream *p, unsigned char c, size_t i) {
  if (is_ws(c)) return 1;
  if (c < 0x20) return fail(p, MZ_JS_CONTROL, i);
  return 0;
}

/* The close c of the innermost container at byte i. */
static int close_container(mz_jsonstream *p, unsigned char c, size_t i) {
  if (p->nest == 0 || p->kind[p->nest - 1] != (c == '}' ? '{' : '[')) return fail(p, MZ_JS_SYNTAX, i);
  p->nest--;
  return 0;
}

/* A value's first byte c at i (state S_VALUE or S_FIRST). */
static int start_value(mz_jsonstream *p, unsigned char c, size_t i) {
  if (c == '{' || c == '[') return open_container(p, c, i);
  if (c == '"' || c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
    if (begin_value(p, i)) return p->status;
    p->key = p->key_path = 0;
    switch (c) {
    case '"': p->state = S_STR; break;
    case '-': p->state = S_NUM_MINUS; break;
    case '0': p->state = S_NUM_ZERO; break;
    case 't': p->lit = "rue", p->state = S_LIT; break;
    case 'f': p->lit = "alse", p->state = S_LIT; break;
    case 'n': p->lit = "ull", p->state = S_LIT; break;
    default: p->state = S_NUM_INT; break;
    }
    return 0;
  }
  return fail(p, c < 0x20 ? MZ_JS_CONTROL : MZ_JS_SYNTAX, i);
}

/* A member name starts at byte i. */
static int start_key(mz_jsonstream *p, size_t i) {
  p->key = 1;
  p->key_path = p->nest <= p->depth;
  p->state = S_STR;
  if (!p->key_path) return 0;
  p->path_len = p->plen[p->nest];
  return path_add(p, "/", 1, i);
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The fourth hex digit of a \u escape was read: pair surrogates. */
static int end_hex(mz_jsonstream *p, size_t i) {
  unsigned u = p->hex;
  if (p->high) {
    if (u < 0xDC00 || u > 0xDFFF) return fail(p, MZ_JS_SURROGATE, i);
    u = 0x10000 + (((p->high & 0x3FF) << 10) | (u & 0x3FF));
    p->high = 0;
  } else if (u >= 0xD800 && u <= 0xDBFF) {
    p->high = u;
    p->state = S_LOW_BS;
    return 0;
  } else if (u >= 0xDC00 && u <= 0xDFFF) {
    return fail(p, MZ_JS_SURROGATE, i);
  }
  p->state = S_STR;
  return p->key_path ? path_code(p, u, i) : 0;
}

/* An escape's letter c at i. */
static int escape(mz_jsonstream *p, unsigned char c, size_t i) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  const char *k;
  if (c == 'u') {
    p->hex = 0;
    p->hexn = 0;
    p->state = S_HEX;
    return 0;
  }
  if (!c || !(k = strchr(from, c))) return fail(p, MZ_JS_ESCAPE, i);
  p->state = S_STR;
  return p->key_path ? path_char(p, (unsigned char)to[k - from], i) : 0;
}

/* A number's state after byte c, or -1 when c ends it, or an error. */
static int number(mz_jsonstream *p, unsigned char c, size_t i) {
  int digit = c >= '0' && c <= '9', e = c == 'e' || c == 'E';
  switch (p->state) {
  case S_NUM_MINUS:
    if (digit) return c == '0' ? S_NUM_ZERO : S_NUM_INT;
    break;
  case S_NUM_ZERO:
    if (digit) break; /* a leading zero */
    return c == '.' ? S_NUM_DOT : e ? S_NUM_E : -1;
  case S_NUM_INT: return digit ? S_NUM_INT : c == '.' ? S_NUM_DOT : e ? S_NUM_E : -1;
  case S_NUM_DOT:
    if (digit) return S_NUM_FRAC;
    break;
  case S_NUM_FRAC: return digit ? S_NUM_FRAC : e ? S_NUM_E : -1;
  case S_NUM_E:
    if (c == '+' || c == '-') return S_NUM_ESIGN;
    if (digit) return S_NUM_EXP;
    break;
  case S_NUM_ESIGN:
    if (digit) return S_NUM_EXP;
    break;
  default: return digit ? S_NUM_EXP : -1;
  }
  return fail(p, MZ_JS_NUMBER, i);
}

/* The bytes of a string from i that need no care (not a key being
 * decoded): up to the next quote, backslash or control byte. */
static size_t plain_run(const unsigned char *s, size_t i, size_t len) {
  while (i < len && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\') i++;
  return i;
}

/* White space between tokens (indentation: most of a pretty-printed
 * answer's bytes), and the digits of a number, skipped in a tight loop. */
static size_t ws_run(const unsigned char *s, size_t i, size_t len) {
  while (i < len && is_ws(s[i])) i++;
  return i;
}

static size_t digit_run(const unsigned char *s, size_t i, size_t len) {
  while (i < len && s[i] >= '0' && s[i] <= '9') i++;
  return i;
}

#define AGAIN 3 /* step: the byte is not taken, read it again in the new state */

/* One byte c at i. Returns 0 (taken), AGAIN, MZ_JS_VALUE (taken unless the state says a number ended:
 * see mz_js_feed) or an error. */
static int step(mz_jsonstream *p, const char *buf, size_t i, mz_js_value *out) {
  unsigned char c = (unsigned char)buf[i];
  int r;
  switch (p->state) {
  case S_VALUE:
  case S_FIRST:
    if ((r = skip_ws(p, c, i))) return r < 0 ? r : 0;
    if (c == ']' && p->state == S_FIRST) {
      p->nest--;
      return end_value(p, buf, i + 1, out);
    }
    return start_value(p, c, i);
  case S_KEY:
  case S_KEY_FIRST:
    if ((r = skip_ws(p, c, i))) return r < 0 ? r : 0;
    if (c == '"') return start_key(p, i);
    if (c == '}' && p->state == S_KEY_FIRST) {
      p->nest--;
      return end_value(p, buf, i + 1, out);
    }
    return fail(p, MZ_JS_SYNTAX, i);
  case S_COLON:
    if ((r = skip_ws(p, c, i))) return r < 0 ? r : 0;
    if (c != ':') return fail(p, MZ_JS_SYNTAX, i);
    p->state = S_VALUE;
    return 0;
  case S_AFTER:
    if ((r = skip_ws(p, c, i))) return r < 0 ? r : 0;
    if (c == ',') {
      p->state = p->kind[p->nest - 1] == '[' ? S_VALUE : S_KEY;
      return 0;
    }
    if (c == ']' || c == '}') return close_container(p, c, i) ? p->status : end_value(p, buf, i + 1, out);
    return fail(p, MZ_JS_SYNTAX, i);
  case S_STR:
    if (c == '"') {
      if (!p->key) return end_value(p, buf, i + 1, out);
      p->state = S_COLON;
      return 0;
    }
    if (c == '\\') {
      p->state = S_ESC;
      return 0;
    }
    if (c < 0x20) return fail(p, MZ_JS_CONTROL, i);
    return p->key_path ? path_char(p, c, i) : 0;
  case S_ESC: return escape(p, c, i);
  case S_HEX:
    if ((r = hexval(c)) < 0) return fail(p, MZ_JS_HEX, i);
    p->hex = p->hex << 4 | (unsigned)r;
    return ++p->hexn == 4 ? end_hex(p, i) : 0;
  case S_LOW_BS:
  case S_LOW_U:
    if (c != (p->state == S_LOW_BS ? '\\' : 'u')) return fail(p, MZ_JS_SURROGATE, i);
    if (p->state == S_LOW_BS) p->state = S_LOW_U;
    else p->hex = 0, p->hexn = 0, p->state = S_HEX;
    return 0;
  case S_LIT:
    if (c != (unsigned char)*p->lit) return fail(p, MZ_JS_SYNTAX, i);
    return *++p->lit ? 0 : end_value(p, buf, i + 1, out);
  default: /* a number */
    if ((r = number(p, c, i)) < -1) return r;
    if (r >= 0) {
      p->state = r;
      return 0;
    }
    if ((r = end_value(p, buf, i, out)) != 0) return r; /* c is not the number's: read it again */
    return AGAIN;
  }
}

/* Skip to the next byte that starts the top-level value, from i. */
static size_t pre_run(const mz_jsonstream *p, const unsigned char *s, size_t i, size_t len) {
  if (p->root) {
    const unsigned char *at = memchr(s + i, p->root, len - i);
    return at ? (size_t)(at - s) : len;
  }
  while (i < len && s[i] != '{' && s[i] != '[') i++;
  return i;
}

/* The current start broke the grammar (p->status): give it up for the
 * next one when that is allowed (see mz_js_start). 1: the parser is back
 * before a value, the byte in error to be read again; 0: the error stands
 * (the first given-up start's, if any). */
static int give_up(mz_jsonstream *p) {
  int syntax = p->status <= MZ_JS_SYNTAX && p->status >= MZ_JS_SURROGATE;
  if (syntax && !p->first_status) {
    p->first_status = p->status;
    p->first_err_at = p->err_at;
  }
  if (!syntax || p->inner || p->tried >= p->candidates) {
    if (syntax) p->status = p->first_status, p->err_at = p->first_err_at;
    return 0;
  }
  p->status = 0;
  p->state = S_PRE;
  p->nest = 0;
  p->path_len = 0;
  p->capturing = p->cap_here = 0;
  p->cap_len = 0;
  p->key = p->key_path = 0;
  p->high = 0;
  return 1;
}

int mz_js_feed(mz_jsonstream *p, const char *buf, size_t len, size_t *used, mz_js_value *out) {
  const unsigned char *s = (const unsigned char *)buf;
  size_t i = 0;
  *used = 0;
  if (p->status) return p->status;
  if (p->state == S_DONE) return MZ_JS_END;
  p->cap_here = 0;
  p->cap_from = 0;
  while (i < len) {
    if (p->state == S_PRE) {
      if ((i = pre_run(p, s, i, len)) == len) break;
      if (open_container(p, s[i], i)) return p->status;
      p->tried++;
      p->inner = 0;
      i++;
      continue;
    }
    if (p->state == S_STR && !p->key_path && (i = plain_run(s, i, len)) == len) break;
    if (p->state >= S_VALUE && p->state <= S_AFTER && (i = ws_run(s, i, len)) == len) break;
    if ((p->state == S_NUM_INT || p->state == S_NUM_FRAC || p->state == S_NUM_EXP) && (i = digit_run(s, i, len)) == len)
      break;
    int was_number = p->state >= S_NUM_MINUS && p->state <= S_NUM_EXP;
    int r = step(p, buf, i, out);
    if (r < 0) {
      if (!give_up(p)) return p->status;
      continue; /* the byte in error may start the next value */
    }
    if (r == MZ_JS_VALUE) {
      *used = was_number ? i : i + 1; /* a number's end byte is the next call's */
      p->pos += *used;
      return MZ_JS_VALUE;
    }
    if (r == 0) i++;
    if (p->state == S_DONE) {
      *used = i;
      p->pos += i;
      return MZ_JS_END;
    }
  }
  if (p->capturing && keep_capture(p, buf, len)) return p->status;
  *used = len;
  p->pos += len;
  return MZ_JS_MORE;
}

int mz_js_finish(mz_jsonstream *p) {
  if (p->status) return p->status;
  if (p->state == S_DONE) return MZ_JS_END;
  if (p->state == S_PRE && p->first_status) {
    p->err_at = p->first_err_at;
    return p->status = p->first_status;
  }
  p->err_at = p->pos;
  return p->status = p->state == S_PRE ? MZ_JS_NOJSON : MZ_JS_CUT;
}

const char *mz_js_strerror(int status) {
  switch (status) {
  case MZ_JS_MORE: return "more input needed";
  case MZ_JS_VALUE: return "a value";
  case MZ_JS_END: return "complete";
  case MZ_JS_SYNTAX: return "unexpected byte";
  case MZ_JS_NUMBER: return "malformed number";
  case MZ_JS_CONTROL: return "control character";
  case MZ_JS_ESCAPE: return "invalid escape";
  case MZ_JS_HEX: return "invalid \\u escape";
  case MZ_JS_SURROGATE: return "unpaired surrogate";
  case MZ_JS_DEPTH: return "nesting too deep";
  case MZ_JS_TOOBIG: return "value too large";
  case MZ_JS_NOMEM: return "out of memory";
  case MZ_JS_CUT: return "cut";
  case MZ_JS_NOJSON: return "no JSON";
  default: return "unknown status";
  }
}
