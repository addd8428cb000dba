/*
 * bench_sse.c - CPU cost per streamed frame of the SSE parser alone and of
 * the parser plus frame decoding, on a synthetic MTPLX-like stream (one
 * content frame per token, compact JSON, "data: ...\n\n"), fed in 16 KiB
 * pieces as libcurl would hand them over. Not a test (the bench_ prefix
 * keeps it out of the test glob); build and run by hand:
 *
 *   gcc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I src -I/usr/include/cjson \
 *       src/sse.c src/decode.c tests/c/bench_sse.c -lcjson -o /tmp/bench_sse
 *   /tmp/bench_sse [frames]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"
#include "sse.h"

#define PIECE 16384
#define DISTINCT 4096 /* frames in the generated buffer, fed over and over */

typedef struct {
  unsigned long frames;
  size_t bytes; /* content bytes seen, so nothing is optimised away */
} sink;

static int on_sse_only(void *ud, const mz_sse_event *ev) {
  sink *k = ud;
  k->frames++;
  k->bytes += ev->data_len;
  return 0;
}

static int on_decode(void *ud, const mz_sse_event *ev) {
  sink *k = ud;
  mz_frame f;
  mz_choice c;
  k->frames++;
  if (mz_frame_decode(&f, ev->data, ev->data_len, NULL, 0) == 0 && !f.done && mz_frame_choice(&f, 0, &c) == 0)
    k->bytes += c.content_len + c.reasoning_len;
  mz_frame_free(&f);
  return 0;
}

/* The floor: what cJSON alone costs, to tell decode.c's share from it. */
static int on_cjson_only(void *ud, const mz_sse_event *ev) {
  sink *k = ud;
  cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
  k->frames++;
  k->bytes += root != NULL;
  cJSON_Delete(root);
  return 0;
}

/* DISTINCT frames of realistic size; ends on a frame boundary so the
 * buffer can be fed back to back as one long stream. */
static char *make_stream(size_t *len) {
  static const char *words[] = {"Il ",    "fait ",       "beau ", "\\u00e0 ", "Lyon", " aujourd\\u2019hui",
                                ", ",     "22 \\u00b0C", ".",     "\\n",      "The",  " quick",
                                " brown", " fox"};
  size_t cap = (size_t)DISTINCT * 320, n = 0;
  char *b = malloc(cap);
  int i;
  if (!b) exit(1);
  for (i = 0; i < DISTINCT; i++)
    n += (size_t)snprintf(b + n, cap - n,
                          "data: {\"id\":\"chatcmpl-3f2a9c\",\"object\":\"chat.completion.chunk\","
                          "\"created\":1760000000,\"model\":\"mtplx-qwen38-9b\",\"choices\":[{\"index\":0,"
                          "\"delta\":{\"content\":\"%s\"},\"finish_reason\":null}]}\n\n",
                          words[i % (int)(sizeof words / sizeof words[0])]);
  *len = n;
  return b;
}

static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Feed `total` frames' worth of the stream; returns ns per frame. */
static double run(const char *buf, size_t len, unsigned long total, mz_sse_on_event cb, sink *k) {
  mz_sse p;
  double t0;
  unsigned long rounds = total / DISTINCT, r;
  mz_sse_init(&p, 0, cb, k);
  t0 = cpu_ns();
  for (r = 0; r < rounds; r++) {
    size_t off;
    for (off = 0; off < len; off += PIECE)
      if (mz_sse_feed(&p, buf + off, len - off < PIECE ? len - off : PIECE) != MZ_SSE_OK) exit(2);
  }
  t0 = cpu_ns() - t0;
  mz_sse_free(&p);
  return t0 / (double)k->frames;
}

/* Best of REPEAT runs: the machine may be busy, and the minimum is the
 * cost of the code rather than of its neighbours. */
#define REPEAT 5
static double best(const char *buf, size_t len, unsigned long total, mz_sse_on_event cb, sink *k) {
  double b = 1e30, t;
  int i;
  for (i = 0; i < REPEAT; i++) {
    k->frames = 0;
    k->bytes = 0;
    t = run(buf, len, total, cb, k);
    if (t < b) b = t;
  }
  return b;
}

int main(int argc, char **argv) {
  unsigned long total = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000UL;
  size_t len;
  char *buf = make_stream(&len);
  sink a = {0, 0}, b = {0, 0}, j = {0, 0};
  double sse_ns, all_ns, cj_ns;
  if (total < DISTINCT) total = DISTINCT;
  run(buf, len, DISTINCT * 8, on_sse_only, &a); /* warm up */
  sse_ns = best(buf, len, total, on_sse_only, &a);
  cj_ns = best(buf, len, total, on_cjson_only, &j);
  all_ns = best(buf, len, total, on_decode, &b);
  printf("frames %lu (best of %d), %.0f bytes/frame, 16 KiB pieces\n", a.frames, REPEAT, (double)len / DISTINCT);
  printf("sse alone:    %7.1f ns/frame\n", sse_ns);
  printf("sse + decode: %7.1f ns/frame (decode %.1f)\n", all_ns, all_ns - sse_ns);
  printf("sse + bare cJSON parse/delete: %7.1f ns/frame (the floor under decode)\n", cj_ns);
  printf("(checksums %zu %zu)\n", a.bytes, b.bytes);
  free(buf);
  return 0;
}
