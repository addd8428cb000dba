/*
 * embed.c - POST /v1/embeddings: deterministic unit vectors.
 *
 * The input is a string, a list of strings, a list of token ids or a list
 * of such lists (OpenAI's four forms). Each item's vector is drawn from a
 * splitmix64 stream seeded by (--seed, the item's text; a token list by
 * its JSON text), so the same text always gets the same vector and two
 * texts almost surely different ones; components are uniform in [-1, 1)
 * scaled to unit length, rounded to float32 (what a real model returns).
 * `dimensions` = k gives the first k components renormalised (OpenAI's
 * shortened embeddings), default --embedding-dims. A string counts 4 bytes
 * a token (at least 1), a token list its length.
 *
 * The body is written by hand: llama-server's members in the order its
 * code inserts them (format_embeddings_response_oaicompat, an
 * ordered_json: model, object, usage, data; each item embedding, index,
 * object), OpenAI's otherwise (object, data, model, usage; object, index,
 * embedding). encoding_format "base64" gives the little-endian float32
 * bytes in base64, as both do.
 *
 * --no-embeddings: llama-server without --embeddings answers 501
 * not_supported_error with its message; MTPLX has no such route (404).
 */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define EMBED_MAX_DIMS 65536

static bool is_llama(const server *s) { return s->cfg.dialect == DIALECT_LLAMA; }

/* One item of the input: its text (the seed) and its token count; false
 * when the item is not a string or a list of integers. */
static bool item_text(const cJSON *it, sbuf *text, long *tokens) {
  text->len = 0;
  if (cJSON_IsString(it)) {
    size_t n = strlen(it->valuestring);
    sbuf_add(text, it->valuestring, n);
    *tokens = n / 4 > 0 ? (long)(n / 4) : 1;
    return true;
  }
  if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) == 0) return false;
  const cJSON *t;
  cJSON_ArrayForEach(t, it) {
    if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble)) return false;
    sbuf_printf(text, "%s%.0f", text->len ? "," : "", t->valuedouble);
  }
  *tokens = cJSON_GetArraySize(it);
  return true;
}

/* The items of `input` as a list (a single string or token list is one
 * item); NULL when input is missing or of another shape. */
static cJSON *input_items(const cJSON *input) {
  if (cJSON_IsString(input)) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_Duplicate(input, 0));
    return a;
  }
  if (!cJSON_IsArray(input) || cJSON_GetArraySize(input) == 0) return NULL;
  if (cJSON_IsNumber(input->child)) { /* one list of token ids */
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_Duplicate(input, 1));
    return a;
  }
  return cJSON_Duplicate(input, 1);
}

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The unit vector of a text, dims components, as float32. */
static void vector_of(uint64_t seed, const char *text, size_t n, long dims, float *out) {
  uint64_t s = gen_hash(seed ^ 0xe3bedull, text, n);
  double norm = 0;
  for (long i = 0; i < dims; i++) {
    double x = (double)(mix(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    out[i] = (float)x;
    norm += x * x;
  }
  if (norm <= 0) out[0] = 1, norm = 1;
  norm = sqrt(norm);
  for (long i = 0; i < dims; i++) out[i] = (float)(out[i] / norm);
}

static void add_base64(sbuf *b, const unsigned char *p, size_t n) {
  static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  sbuf_reserve(b, (n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    char q[4] = {al[v >> 18 & 63], al[v >> 12 & 63], i + 1 < n ? al[v >> 6 & 63] : '=', i + 2 < n ? al[v & 63] : '='};
    sbuf_add(b, q, 4);
  }
}

static void add_embedding(sbuf *b, const float *v, long dims, bool base64) {
  if (base64) {
    unsigned char *bytes = malloc((size_t)dims * 4);
    if (!bytes) abort();
    for (long i = 0; i < dims; i++) {
      uint32_t u;
      memcpy(&u, &v[i], 4);
      for (int k = 0; k < 4; k++) bytes[i * 4 + k] = (unsigned char)(u >> (8 * k));
    }
    sbuf_add(b, "\"", 1);
    add_base64(b, bytes, (size_t)dims * 4);
    sbuf_add(b, "\"", 1);
    free(bytes);
    return;
  }
  sbuf_add(b, "[", 1);
  for (long i = 0; i < dims; i++) sbuf_printf(b, "%s%.9g", i ? "," : "", (double)v[i]);
  sbuf_add(b, "]", 1);
}

static int embed_error(conn *c, int status, const char *msg) {
  return send_error(c, status, msg, status == 501 ? "not_supported_error" : "invalid_request_error", NULL);
}

int route_embeddings(conn *c, const http_request *r) {
  server *s = c->srv;
  if (s->cfg.no_embeddings) {
    if (!is_llama(s)) return send_error(c, 404, "Not Found", "not_found_error", NULL);
    return embed_error(c, 501, "This server does not support embeddings. Start it with `--embeddings`");
  }
  cJSON *body = cJSON_ParseWithLength(r->body ? r->body : "", r->body_len);
  if (!cJSON_IsObject(body)) {
    cJSON_Delete(body);
    return serve_bad_json(c);
  }
  const cJSON *ctl = cJSON_GetObjectItemCaseSensitive(body, "mirza_sim");
  sim_faults f;
  int st = serve_faults(c, r, ctl, &f);
  if (st) {
    cJSON_Delete(body);
    return st;
  }
  cJSON *items = input_items(cJSON_GetObjectItemCaseSensitive(body, "input"));
  const cJSON *dj = cJSON_GetObjectItemCaseSensitive(body, "dimensions");
  const cJSON *ef = cJSON_GetObjectItemCaseSensitive(body, "encoding_format");
  const cJSON *mj = cJSON_GetObjectItemCaseSensitive(body, "model");
  long dims = s->cfg.embedding_dims;
  const char *bad = NULL;
  if (!cJSON_GetObjectItemCaseSensitive(body, "input"))
    bad = is_llama(s) ? "\"input\" or \"content\" must be provided" : "'input' is required";
  else if (!items) bad = "'input' must be a string, a list of strings or a list of token ids, not empty";
  if (dj && !cJSON_IsNull(dj)) {
    if (!cJSON_IsNumber(dj) || dj->valuedouble < 1 || dj->valuedouble > EMBED_MAX_DIMS ||
        dj->valuedouble != floor(dj->valuedouble))
      bad = "'dimensions' must be an integer from 1 to 65536";
    else dims = (long)dj->valuedouble;
  }
  bool b64 = cJSON_IsString(ef) && strcmp(ef->valuestring, "base64") == 0;
  if (ef && !cJSON_IsNull(ef) && !b64 && !(cJSON_IsString(ef) && strcmp(ef->valuestring, "float") == 0))
    bad = "'encoding_format' must be \"float\" or \"base64\"";
  sbuf text = {0}, out = {0}, data = {0};
  long total = 0, i = 0;
  /* mirza_sim.embed_order = "reverse": the data listed last input first,
   * as a server may list it (a client places each vector by its index) */
  const cJSON *order = cJSON_GetObjectItemCaseSensitive(ctl, "embed_order");
  bool reverse = cJSON_IsString(order) && strcmp(order->valuestring, "reverse") == 0;
  float *v = bad ? NULL : malloc((size_t)dims * sizeof *v);
  const cJSON *it, *list = bad ? NULL : items;
  cJSON_ArrayForEach(it, list) {
    long tokens;
    if (!item_text(it, &text, &tokens)) {
      bad = "'input' must be a string, a list of strings or a list of token ids, not empty";
      break;
    }
    total += tokens;
    vector_of(s->cfg.seed, text.p ? text.p : "", text.len, dims, v);
    size_t item_at = data.len;
    sbuf_adds(&data, i ? ",{" : "{");
    if (is_llama(s)) {
      sbuf_adds(&data, "\"embedding\":");
      add_embedding(&data, v, dims, b64);
      sbuf_printf(&data, ",\"index\":%ld,\"object\":\"embedding\"%s}", i, b64 ? ",\"encoding_format\":\"base64\"" : "");
    } else {
      sbuf_printf(&data, "\"object\":\"embedding\",\"index\":%ld,\"embedding\":", i);
      add_embedding(&data, v, dims, b64);
      sbuf_adds(&data, "}");
    }
    if (reverse && i > 0) { /* this item first: {item}, then what came before */
      sbuf moved = {0};
      sbuf_add(&moved, data.p + item_at + 1, data.len - item_at - 1);
      sbuf_adds(&moved, ",");
      sbuf_add(&moved, data.p, item_at);
      sbuf_free(&data);
      data = moved;
    }
    i++;
  }
  free(v);
  if (bad) {
    st = embed_error(c, 400, bad);
  } else {
    const char *model = is_llama(s) && cJSON_IsString(mj) ? mj->valuestring : s->cfg.model_id;
    char usage[96];
    snprintf(usage, sizeof usage, "{\"prompt_tokens\":%ld,\"total_tokens\":%ld}", total, total);
    if (is_llama(s)) {
      sbuf_adds(&out, "{\"model\":");
      sbuf_json_str(&out, model);
      sbuf_printf(&out, ",\"object\":\"list\",\"usage\":%s,\"data\":[", usage);
      sbuf_add(&out, data.p, data.len);
      sbuf_adds(&out, "]}");
    } else {
      sbuf_adds(&out, "{\"object\":\"list\",\"data\":[");
      sbuf_add(&out, data.p, data.len);
      sbuf_adds(&out, "],\"model\":");
      sbuf_json_str(&out, model);
      sbuf_printf(&out, ",\"usage\":%s}", usage);
    }
    if (f.head_delay_ms > 0) conn_wait_until(c, sim_now() + (double)f.head_delay_ms / 1000.0, NULL);
    http_send(c, 200, is_llama(s) ? "application/json; charset=utf-8" : "application/json", NULL, out.p, out.len);
    st = 200;
  }
  sbuf_free(&text);
  sbuf_free(&out);
  sbuf_free(&data);
  cJSON_Delete(items);
  cJSON_Delete(body);
  return st;
}
