/*
 * decode.c - chat.completion.chunk frames and HTTP error bodies (decode.h).
 *
 * Servers differ and change often (MTPLX adds mtplx_progress/mtplx_stats,
 * llama.cpp adds timings and usage-only frames, errors come as objects or
 * plain strings), so nothing here is required: a missing, null or mistyped
 * field reads as absent and never fails the frame. The only failures are a
 * payload that is not JSON or not an object. The top level is walked once,
 * keys matched by first letter, so a frame costs one cJSON parse plus a few
 * string compares.
 */
#include "decode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* "[DONE]" with optional surrounding whitespace. */
static int is_done(const char *s, size_t len) {
  while (len && is_space(*s)) s++, len--;
  while (len && is_space(s[len - 1])) len--;
  return len == 6 && memcmp(s, "[DONE]", 6) == 0;
}

static const cJSON *object_or_null(const cJSON *item) { return cJSON_IsObject(item) ? item : NULL; }

/* One top-level member. Returns 0 if the key is known, 1 if not; a known
 * key with a value of the wrong type is known but stays NULL. */
static int take_member(mz_frame *f, const cJSON *item) {
  const char *k = item->string;
  switch (k[0]) {
  case 'c':
    if (strcmp(k, "choices") == 0) {
      f->choices = cJSON_IsArray(item) ? item : NULL;
      f->nchoices = f->choices ? cJSON_GetArraySize(item) : 0;
      return 0;
    }
    if (strcmp(k, "created") != 0) return 1;
    f->created = cJSON_IsNumber(item) ? item : NULL;
    return 0;
  case 'u':
    if (strcmp(k, "usage") != 0) return 1;
    f->usage = object_or_null(item);
    return 0;
  case 't':
    if (strcmp(k, "timings") != 0) return 1;
    f->timings = object_or_null(item);
    return 0;
  case 'm':
    if (strcmp(k, "mtplx_stats") == 0) f->stats = object_or_null(item);
    else if (strcmp(k, "mtplx_progress") == 0) f->progress = object_or_null(item);
    else if (strcmp(k, "model") == 0) f->model = cJSON_IsString(item) ? item->valuestring : NULL;
    else return 1;
    return 0;
  case 'e':
    if (strcmp(k, "error") != 0) return 1;
    f->error = cJSON_IsNull(item) ? NULL : item;
    return 0;
  case 'i':
    if (strcmp(k, "id") != 0) return 1;
    f->id = cJSON_IsString(item) ? item->valuestring : NULL;
    return 0;
  case 'o': return strcmp(k, "object") != 0;
  case 's':
    if (strcmp(k, "system_fingerprint") != 0) return 1;
    f->fprint = cJSON_IsString(item) ? item->valuestring : NULL;
    return 0;
  default: return 1;
  }
}

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
}

/* ---- NUL characters ----
 * cJSON decodes "\u0000" but its strings are NUL-terminated, so the text
 * after it would be lost. A payload holding that escape (rare: checked
 * with one scan for a backslash-u-0000) is parsed from a copy where each
 * one is replaced by the escape of a character the payload does not
 * otherwise hold: a control character (U+0001..U+001F), else a
 * noncharacter (U+FDD0..U+FDEF, which no text uses); afterwards that
 * character is turned back into NUL and the string's real length is kept
 * in its (otherwise unused) valueint, read by mz_json_strlen(). Keys still
 * end at their first NUL (json.encode refuses such keys anyway). Only a
 * payload holding all 63 of those characters falls back to cJSON's cut. */

static int hex_val(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* The value of the 4 hex digits at d (-1 when they are not hex). */
static long hex4(const char *d) {
  long v = 0;
  for (int k = 0; k < 4; k++) {
    int h = hex_val(d[k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

/* The sentinel candidates the payload holds, raw or escaped, as bits:
 * ctl for U+0000..U+001F, nc for U+FDD0..U+FDEF; returns the number of
 * \u0000 escapes. */
static int scan_controls(const char *d, size_t len, unsigned long *ctl, unsigned long *nc) {
  int nuls = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)d[i];
    if (c < 32) *ctl |= 1ul << c;
    if (c == 0xEF && i + 2 < len && (unsigned char)d[i + 1] == 0xB7) {
      unsigned char c2 = (unsigned char)d[i + 2];
      if (c2 >= 0x90 && c2 <= 0xAF) *nc |= 1ul << (c2 - 0x90);
    }
    if (c != '\\' || i + 1 >= len) continue;
    switch (d[++i]) { /* skip the escaped character: an escaped backslash before u0000 is no NUL */
    case 'b': *ctl |= 1ul << 8; break;
    case 't': *ctl |= 1ul << 9; break;
    case 'n': *ctl |= 1ul << 10; break;
    case 'f': *ctl |= 1ul << 12; break;
    case 'r': *ctl |= 1ul << 13; break;
    case 'u': {
      long v = i + 4 < len ? hex4(d + i + 1) : -1;
      if (v >= 0 && v < 32) *ctl |= 1ul << v, nuls += v == 0;
      else if (v >= 0xFDD0 && v <= 0xFDEF) *nc |= 1ul << (v - 0xFDD0);
      break;
    }
    default: break;
    }
  }
  return nuls;
}

/* A sentinel: its code point, and its UTF-8 bytes (1 or 3). */
typedef struct {
  long cp;
  char bytes[4];
  size_t n;
} sentinel;

/* A copy of the payload with every \u0000 replaced by the escape of the
 * sentinel, or NULL (none needed, none free, or out of memory). */
static char *nul_copy(const char *d, size_t len, sentinel *sn) {
  unsigned long ctl = 0, nc = 0;
  sn->cp = 0;
  if (!memchr(d, '\\', len) || !scan_controls(d, len, &ctl, &nc)) return NULL;
  for (int c = 1; c < 32 && !sn->cp; c++)
    if (!(ctl & (1ul << c))) sn->cp = c, sn->bytes[0] = (char)c, sn->n = 1;
  for (int k = 0; k < 32 && !sn->cp; k++)
    if (!(nc & (1ul << k)))
      sn->cp = 0xFDD0 + k, sn->bytes[0] = '\xEF', sn->bytes[1] = '\xB7', sn->bytes[2] = (char)(0x90 + k), sn->n = 3;
  char *copy = sn->cp ? malloc(len ? len : 1) : NULL;
  if (!copy) return NULL;
  memcpy(copy, d, len);
  for (size_t i = 0; i + 5 < len; i++) {
    if (copy[i] != '\\') continue;
    if (memcmp(copy + i + 1, "u0000", 5) == 0) {
      static const char hex[] = "0123456789abcdef";
      for (int k = 0; k < 4; k++) copy[i + 2 + k] = hex[(sn->cp >> (12 - 4 * k)) & 15];
    }
    i++;
  }
  return copy;
}

/* Turn the sentinel back into NUL everywhere in the tree. */
static void restore_nuls(cJSON *item, const sentinel *sn) {
  for (; item; item = item->next) {
    char *p;
    if (item->string && (p = strstr(item->string, sn->bytes))) *p = '\0';
    if (cJSON_IsString(item) && item->valuestring && strstr(item->valuestring, sn->bytes)) {
      char *r = item->valuestring, *w = r;
      while (*r) {
        if (strncmp(r, sn->bytes, sn->n) == 0) *w++ = '\0', r += sn->n;
        else *w++ = *r++;
      }
      *w = '\0';
      size_t n = (size_t)(w - item->valuestring);
      item->valueint = n < (size_t)1 << 30 ? (int)n : 0;
    }
    restore_nuls(item->child, sn);
  }
}

cJSON *mz_json_parse(const char *data, size_t len, size_t *end) {
  const char *stop = NULL;
  sentinel sn;
  sn.bytes[3] = sn.bytes[1] = '\0';
  char *copy = nul_copy(data, len, &sn);
  const char *src = copy ? copy : data;
  cJSON *root = cJSON_ParseWithLengthOpts(src, len, &stop, 0);
  if (!root) stop = cJSON_GetErrorPtr(); /* set by this failure, into src */
  if (end) *end = stop && stop >= src && stop <= src + len ? (size_t)(stop - src) : 0;
  free(copy);
  if (root && copy) restore_nuls(root, &sn);
  return root;
}

size_t mz_json_strlen(const cJSON *v) { return v->valueint > 0 ? (size_t)v->valueint : strlen(v->valuestring); }

cJSON *mz_json_parse_all(const char *data, size_t len, size_t *at) {
  size_t end = 0;
  cJSON *root = mz_json_parse(data, len, &end);
  *at = end;
  if (!root) return NULL;
  while (end < len && is_space(data[end])) end++;
  if (end == len) return root;
  *at = end;
  cJSON_Delete(root);
  return NULL;
}

int mz_frame_decode(mz_frame *f, const char *data, size_t len, char *err, size_t errlen) {
  const cJSON *item;
  size_t at = 0;
  memset(f, 0, sizeof *f);
  if (err && errlen) err[0] = '\0';
  if (is_done(data, len)) {
    f->done = 1;
    return 0;
  }
  f->root = mz_json_parse_all(data, len, &at);
  if (!f->root) {
    char msg[64];
    snprintf(msg, sizeof msg, "malformed JSON in SSE data at byte %zu", at);
    set_err(err, errlen, msg);
    return -1;
  }
  if (!cJSON_IsObject(f->root)) {
    set_err(err, errlen, "SSE data is JSON but not an object");
    return -1;
  }
  for (item = f->root->child; item; item = item->next) f->unknown += take_member(f, item);
  if (f->progress) f->heartbeat = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f->progress, "heartbeat"));
  return 0;
}

void mz_frame_free(mz_frame *f) {
  cJSON_Delete(f->root);
  memset(f, 0, sizeof *f);
}

/* A string member, or NULL (absent, null or not a string). */
static const char *str_of(const cJSON *obj, const char *key, size_t *len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
  if (len) *len = s ? strlen(s) : 0;
  return s;
}

static const char *str_val(const cJSON *v) { return cJSON_IsString(v) ? v->valuestring : NULL; }

/* The text fields of a delta (or message), in one pass over its members:
 * this runs for every token, and a lookup per field would walk the list
 * once per field. Reasoning is "reasoning_content" (llama.cpp, MTPLX),
 * else "reasoning" (vLLM, Ollama); an empty one reads as absent. */
static void read_delta(const cJSON *src, mz_choice *c) {
  const cJSON *v, *cv = NULL, *rc = NULL, *r = NULL;
  for (v = src->child; v; v = v->next) {
    const char *k = v->string;
    if (strcmp(k, "content") == 0) cv = cJSON_IsString(v) ? v : NULL;
    else if (strcmp(k, "reasoning_content") == 0) rc = cJSON_IsString(v) ? v : NULL;
    else if (strcmp(k, "role") == 0) c->role = str_val(v);
    else if (strcmp(k, "tool_calls") == 0) c->tool_calls = cJSON_IsArray(v) ? v : NULL;
    else if (strcmp(k, "reasoning") == 0) r = cJSON_IsString(v) ? v : NULL;
  }
  if (cv) c->content = cv->valuestring, c->content_len = mz_json_strlen(cv);
  if (rc && !mz_json_strlen(rc)) rc = NULL;
  if (!rc && r && mz_json_strlen(r)) rc = r;
  if (rc) c->reasoning = rc->valuestring, c->reasoning_len = mz_json_strlen(rc);
}

/* Same single pass over the choice itself. */
int mz_frame_choice(const mz_frame *f, int i, mz_choice *c) {
  const cJSON *ch, *v, *delta = NULL;
  memset(c, 0, sizeof *c);
  c->index = i;
  if (!f->choices || i < 0 || i >= f->nchoices) return -1;
  ch = cJSON_GetArrayItem(f->choices, i);
  if (!cJSON_IsObject(ch)) return -1;
  for (v = ch->child; v; v = v->next) {
    const char *k = v->string;
    if (strcmp(k, "delta") == 0) delta = object_or_null(v);
    else if (strcmp(k, "finish_reason") == 0) c->finish_reason = str_val(v);
    else if (strcmp(k, "index") == 0 && cJSON_IsNumber(v) && v->valuedouble > -2147483648.0 &&
             v->valuedouble < 2147483648.0) /* else absent: casting it would be undefined */
      c->index = (int)v->valuedouble;
    else if (strcmp(k, "message") == 0) c->message = object_or_null(v);
    else if (strcmp(k, "logprobs") == 0) c->logprobs = object_or_null(v);
  }
  if (delta || c->message) read_delta(delta ? delta : c->message, c);
  return 0;
}

/* A numeric code is rendered as an integer when it is one (llama.cpp's
 * 400, 503), else with %g. */
static void render_code(const cJSON *code, char *buf, size_t len) {
  double d;
  if (cJSON_IsString(code)) {
    snprintf(buf, len, "%s", code->valuestring);
  } else if (cJSON_IsNumber(code)) {
    d = code->valuedouble;
    if (d > -1e15 && d < 1e15 && d == (double)(long long)d) snprintf(buf, len, "%lld", (long long)d);
    else snprintf(buf, len, "%g", d);
  }
}

const char *mz_error_message(const cJSON *error, const char **type, char *code_buf, size_t code_len) {
  if (type) *type = NULL;
  if (code_buf && code_len) code_buf[0] = '\0';
  if (cJSON_IsString(error)) return error->valuestring;
  if (!cJSON_IsObject(error)) return NULL;
  if (type) *type = str_of(error, "type", NULL);
  if (code_buf && code_len) render_code(cJSON_GetObjectItemCaseSensitive(error, "code"), code_buf, code_len);
  return str_of(error, "message", NULL);
}

/* Length of the sequence a lead byte starts, 0 for ASCII, a continuation
 * byte or a byte that can never start one (C0, C1, F5..FF). */
static int seq_len(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

/* The second byte's range depends on the lead (no overlongs, no
 * surrogates, nothing past U+10FFFF); later ones are 80..BF. */
static int second_ok(unsigned char lead, unsigned char b) {
  unsigned char lo = 0x80, hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;
  else if (lead == 0xED) hi = 0x9F;
  else if (lead == 0xF0) lo = 0x90;
  else if (lead == 0xF4) hi = 0x8F;
  return b >= lo && b <= hi;
}

/* Only the last (at most 4) bytes matter: find where the last sequence
 * starts, and hold it back only if it is a valid prefix still missing
 * bytes. Anything that cannot become valid passes through. */
size_t mz_utf8_complete(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = len, k = 0, have;
  int need;
  while (i > 0 && k < 3 && (u[i - 1] & 0xC0) == 0x80) i--, k++;
  if (i == 0) return len;
  i--;
  need = seq_len(u[i]);
  have = len - i;
  if (need == 0 || have >= (size_t)need) return len;
  if (have >= 2 && !second_ok(u[i], u[i + 1])) return len;
  return i;
}

/* ---- invalid UTF-8 ----
 * Text events promise UTF-8. Ill-formed input is repaired the way the
 * WHATWG Encoding Standard's decoder (browsers' TextDecoder) does: each
 * "maximal subpart" of an ill-formed sequence (the longest prefix of a
 * valid sequence, or else one byte) becomes one U+FFFD. */

/* At u[i] (not ASCII): the length of the valid sequence starting there,
 * or minus the length of the maximal subpart to replace (at least 1). */
static int utf8_step(const unsigned char *u, size_t i, size_t len) {
  int need = seq_len(u[i]), k = 2;
  if (!need || i + 1 >= len || !second_ok(u[i], u[i + 1])) return -1;
  while (k < need && i + (size_t)k < len && (u[i + k] & 0xC0) == 0x80) k++;
  return k == need ? need : -k;
}

size_t mz_utf8_valid(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    uint64_t w;
    if (len - i >= 8 && (memcpy(&w, u + i, 8), !(w & 0x8080808080808080u))) {
      i += 8; /* eight ASCII bytes */
      continue;
    }
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    int n = utf8_step(u, i, len);
    if (n < 0) return i;
    i += (size_t)n;
  }
  return len;
}

size_t mz_utf8_repair(const char *s, size_t len, char *out, size_t *bad) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, o = 0;
  while (i < len) {
    int n = u[i] < 0x80 ? 1 : utf8_step(u, i, len);
    if (n > 0) {
      memcpy(out + o, s + i, (size_t)n);
      o += (size_t)n, i += (size_t)n;
      continue;
    }
    memcpy(out + o, "\xEF\xBF\xBD", 3); /* U+FFFD */
    o += 3, i += (size_t)-n;
    if (bad) (*bad)++;
  }
  return o;
}
