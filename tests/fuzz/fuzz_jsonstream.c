/*
 * fuzz_jsonstream.c - the incremental JSON parser (src/jsonstream.c),
 * differential against cJSON on the whole text.
 *
 * Byte 0 picks the depth (0-3), byte 1 seeds the pieces; the rest is the
 * text. It is fed whole, then in pieces of 1 to 64 bytes drawn from the
 * seed; both must give the same values (pointer, bytes, offset) and the
 * same verdict. Then against cJSON (mz_json_parse from the first { or [):
 *  - a whole value here is one cJSON takes, ending at the same byte, and
 *    the values handed out are cJSON's at that depth, pointer for pointer,
 *    each decoding to an equal tree;
 *  - a value refused here is refused by cJSON too, unless the refusal is
 *    one of the documented places where cJSON is laxer: a leading zero, a
 *    '.' with no digit before or after it, a control byte, a non-hex \u
 *    digit;
 *  - a cut text is refused by cJSON;
 *  - every value handed out, before an error too, is the text's own bytes
 *    at its offset and decodes whole with cJSON.
 */
#include <string.h>

#include "decode.h"
#include "fuzz.h"
#include "jsonstream.h"

#define MAXV 4096
#define MAX_INPUT 65536 /* longer inputs are skipped (libFuzzer's default cap is 4 KiB) */

typedef struct {
  size_t off[MAXV], len[MAXV], plen[MAXV];
  char *path[MAXV];
  size_t n;
  int status;
  size_t err_at, end; /* end: bytes taken when the value ended */
} run;

static void run_free(run *r) {
  for (size_t i = 0; i < r->n; i++) free(r->path[i]);
  r->n = 0;
}

/* Feed text in pieces (seed 0: whole) and finish. */
static void feed(const char *text, size_t len, int depth, uint32_t seed, run *r) {
  mz_jsonstream p;
  size_t from = 0;
  int st = MZ_JS_MORE;
  r->n = 0;
  FUZZ_CHECK(mz_js_init(&p, depth, 0) == 0, "init");
  while (from < len && st >= 0 && st != MZ_JS_END) {
    size_t n = seed ? 1 + fuzz_next(&seed) % 64 : len - from, off = 0, used;
    if (n > len - from) n = len - from;
    char *piece = malloc(n + 1); /* its own buffer: a value pointing into an old one is caught */
    FUZZ_CHECK(piece != NULL, "oom");
    memcpy(piece, text + from, n);
    for (;;) {
      mz_js_value v;
      st = mz_js_feed(&p, piece + off, n - off, &used, &v);
      FUZZ_CHECK(used <= n - off, "used %zu of %zu", used, n - off);
      off += used;
      if (st != MZ_JS_VALUE) break;
      FUZZ_CHECK(r->n < MAXV, "too many values");
      FUZZ_CHECK(v.offset + v.len <= len && !memcmp(v.text, text + v.offset, v.len), "value %zu: not the text's bytes",
                 r->n);
      r->off[r->n] = v.offset;
      r->len[r->n] = v.len;
      r->plen[r->n] = v.path_len;
      r->path[r->n] = malloc(v.path_len + 1);
      FUZZ_CHECK(r->path[r->n] != NULL, "oom");
      memcpy(r->path[r->n], v.path, v.path_len);
      r->path[r->n][v.path_len] = '\0';
      r->n++;
    }
    free(piece);
    from += n;
  }
  r->status = mz_js_finish(&p);
  r->err_at = p.err_at;
  r->end = p.pos;
  mz_js_free(&p);
}

static int same_tree(const cJSON *a, const cJSON *b) {
  if ((a->type & 0xFF) != (b->type & 0xFF)) return 0;
  if (cJSON_IsNumber(a)) return a->valuedouble == b->valuedouble;
  if (cJSON_IsString(a))
    return mz_json_strlen(a) == mz_json_strlen(b) && !memcmp(a->valuestring, b->valuestring, mz_json_strlen(a));
  if (cJSON_IsArray(a) || cJSON_IsObject(a)) {
    const cJSON *x = a->child, *y = b->child;
    for (; x && y; x = x->next, y = y->next)
      if ((cJSON_IsObject(a) && strcmp(x->string, y->string)) || !same_tree(x, y)) return 0;
    return !x && !y;
  }
  return 1;
}

/* Check cJSON's values at `depth` below v against r's, from *k on. A
 * name with a NUL (cJSON cuts it there) is not compared. */
static void walk(const cJSON *v, int depth, char *path, size_t plen, const char *text, const run *r, size_t *k) {
  if (depth == 0) {
    FUZZ_CHECK(*k < r->n, "cJSON has more values than the %zu handed out", r->n);
    FUZZ_CHECK((r->plen[*k] == plen && !memcmp(r->path[*k], path, plen)) || memchr(r->path[*k], '\0', r->plen[*k]),
               "value %zu: pointer %s, cJSON's %.*s", *k, r->path[*k], (int)plen, path);
    size_t end = 0;
    cJSON *mine = mz_json_parse(text + r->off[*k], r->len[*k], &end);
    FUZZ_CHECK(mine && end == r->len[*k], "value %zu does not decode whole", *k);
    FUZZ_CHECK(same_tree(mine, v), "value %zu (%s) differs from cJSON's", *k, r->path[*k]);
    cJSON_Delete(mine);
    (*k)++;
    return;
  }
  size_t i = 0;
  for (const cJSON *c = cJSON_IsArray(v) || cJSON_IsObject(v) ? v->child : NULL; c; c = c->next, i++) {
    size_t n = plen; /* fits: a pointer is at most 2 bytes per input byte, plus the indices */
    if (cJSON_IsArray(v)) n += (size_t)sprintf(path + n, "/%zu", i);
    else {
      path[n++] = '/';
      for (const char *s = c->string; *s; s++) {
        if (*s == '~' || *s == '/') path[n++] = '~', path[n++] = *s == '~' ? '0' : '1';
        else path[n++] = *s;
      }
    }
    walk(c, depth - 1, path, n, text, r, k);
  }
}

/* The refusals cJSON does not make (see the file comment). */
static int cjson_laxer(const run *r, const char *text) {
  if (r->status == MZ_JS_CONTROL || r->status == MZ_JS_HEX) return 1;
  if (r->status != MZ_JS_NUMBER || r->err_at == 0) return 0;
  char before = text[r->err_at - 1], at = text[r->err_at]; /* 01, 1., 1.e5, -.5 (strtod takes them) */
  return before == '0' || before == '.' || (before == '-' && at == '.');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char path[2 * MAX_INPUT + 256];
  static run whole, split;
  if (size < 2 || size > MAX_INPUT) return 0;
  int depth = data[0] % 4;
  uint32_t seed = data[1] | 0x100u;
  const char *text = (const char *)data + 2;
  size_t len = size - 2, s = 0, end = 0;
  feed(text, len, depth, 0, &whole);
  feed(text, len, depth, seed, &split);
  FUZZ_CHECK(whole.status == split.status && whole.n == split.n &&
                 (whole.status == MZ_JS_END || whole.err_at == split.err_at),
             "whole: status %d at %zu, %zu values; pieces: %d at %zu, %zu values", whole.status, whole.err_at, whole.n,
             split.status, split.err_at, split.n);
  for (size_t i = 0; i < whole.n; i++)
    FUZZ_CHECK(whole.off[i] == split.off[i] && whole.len[i] == split.len[i] && whole.plen[i] == split.plen[i] &&
                   !memcmp(whole.path[i], split.path[i], whole.plen[i]),
               "value %zu differs in pieces", i);
  while (s < len && text[s] != '{' && text[s] != '[') s++;
  cJSON *tree = s < len ? mz_json_parse(text + s, len - s, &end) : NULL;
  if (whole.status == MZ_JS_END) {
    size_t k = 0;
    FUZZ_CHECK(tree != NULL, "a whole value cJSON refuses at byte %zu", s + end);
    FUZZ_CHECK(s + end == whole.end, "the value ends at %zu, cJSON's at %zu", whole.end, s + end);
    walk(tree, depth, path, 0, text, &whole, &k);
    FUZZ_CHECK(k == whole.n, "%zu values handed out, cJSON has %zu", whole.n, k);
  } else if (whole.status == MZ_JS_NOJSON) {
    FUZZ_CHECK(s == len, "no JSON, with a bracket at %zu", s);
  } else {
    FUZZ_CHECK(!tree || cjson_laxer(&whole, text), "refused (%s at %zu), cJSON takes it", mz_js_strerror(whole.status),
               whole.err_at);
    for (size_t i = 0; i < whole.n; i++) {
      cJSON *v = mz_json_parse(text + whole.off[i], whole.len[i], &end);
      FUZZ_CHECK(v && end == whole.len[i], "value %zu does not decode whole", i);
      cJSON_Delete(v);
    }
  }
  cJSON_Delete(tree);
  run_free(&whole);
  run_free(&split);
  return 0;
}
