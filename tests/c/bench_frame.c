/*
 * bench_frame.c - CPU cost of decoding one token frame: cJSON (decode.h,
 * what every frame paid before) against the fast path (fastframe.h), on
 * the real token frames of the traces (MTPLX and llama-server), cycled
 * until `frames` (default 1,000,000) have been decoded. Not a test (the
 * bench_ prefix keeps it out of the test glob); build and run by hand:
 *
 *   gcc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I src -I/usr/include/cjson \
 *       src/sse.c src/decode.c src/fastframe.c tests/c/bench_frame.c \
 *       -lcjson -o /tmp/bench_frame
 *   /tmp/bench_frame [frames] [traces-dir]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"
#include "fastframe.h"
#include "sse.h"

#define MAXF 256

typedef struct {
  char *data[MAXF];
  size_t len[MAXF];
  int n;
} frames;

static int collect(void *ud, const mz_sse_event *ev) {
  frames *f = ud;
  mz_fast ff;
  if (f->n == MAXF || !mz_fast_frame(ev->data, ev->data_len, &ff)) return 0;
  if (!ff.content.len && !ff.reasoning.len) return 0; /* token frames only */
  f->data[f->n] = malloc(ev->data_len + 1);
  if (!f->data[f->n]) exit(1);
  memcpy(f->data[f->n], ev->data, ev->data_len + 1);
  f->len[f->n++] = ev->data_len;
  return 0;
}

static void load(const char *dir, const char *name, frames *f) {
  char path[1024];
  static char buf[1 << 20];
  size_t n;
  mz_sse p;
  FILE *fp;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!(fp = fopen(path, "rb"))) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(1);
  }
  n = fread(buf, 1, sizeof buf, fp);
  fclose(fp);
  mz_sse_init(&p, 0, collect, f);
  mz_sse_feed(&p, buf, n);
  mz_sse_finish(&p);
  mz_sse_free(&p);
}

static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* One way of getting the text out of a frame; returns its length so
 * nothing is optimised away. */
typedef size_t (*decoder)(const char *data, size_t len, char *scratch);

static size_t via_cjson(const char *data, size_t len, char *scratch) {
  mz_frame f;
  mz_choice c;
  size_t n = 0;
  (void)scratch;
  if (mz_frame_decode(&f, data, len, NULL, 0) == 0 && mz_frame_choice(&f, 0, &c) == 0)
    n = c.content_len + c.reasoning_len;
  mz_frame_free(&f);
  return n;
}

/* The fast path as client.c uses it: scan, then copy the text out
 * (unescaping when needed), as push_text does into the arena. */
static size_t copy_out(const mz_fast_str *s, char *out) {
  if (s->esc) return mz_json_unescape(s->p, s->len, out);
  if (s->len) memcpy(out, s->p, s->len); /* p is NULL when the field is absent */
  return s->len;
}

static size_t via_fast(const char *data, size_t len, char *scratch) {
  mz_fast f;
  if (!mz_fast_frame(data, len, &f)) return 0;
  return copy_out(&f.reasoning, scratch) + copy_out(&f.content, scratch);
}

/* Best of 5 runs of `total` frames: the minimum is the cost of the code
 * rather than of whatever else the machine was doing. */
static double bench(const frames *f, unsigned long total, decoder d, size_t *sum) {
  static char scratch[1 << 16];
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    double t0 = cpu_ns();
    size_t s = 0;
    for (unsigned long i = 0; i < total; i++)
      s += d(f->data[i % (unsigned long)f->n], f->len[i % (unsigned long)f->n], scratch);
    t0 = (cpu_ns() - t0) / (double)total;
    if (t0 < best) best = t0;
    *sum = s;
  }
  return best;
}

int main(int argc, char **argv) {
  unsigned long total = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000UL;
  const char *dir = argc > 2 ? argv[2] : getenv("MIRZA_TRACES");
  frames f = {.n = 0};
  size_t bytes = 0, a = 0, b = 0;
  if (!dir) dir = "tests/fixtures/traces";
  load(dir, "mtplx.reconstructed.thinking_stream.sse", &f);
  load(dir, "llama-server.reasoning_grammar_stream.sse", &f);
  load(dir, "llama-server.chat_stream_usage.sse", &f);
  load(dir, "llama-server.chat_stream_no_usage.sse", &f);
  if (!f.n) return fprintf(stderr, "no token frames in %s\n", dir), 1;
  for (int i = 0; i < f.n; i++) bytes += f.len[i];
  double cj = bench(&f, total, via_cjson, &a);
  double fa = bench(&f, total, via_fast, &b);
  printf("%d distinct token frames (%.0f bytes avg), %lu decoded per run, best of 5\n", f.n, (double)bytes / f.n,
         total);
  printf("cJSON (mz_frame_decode + choice): %7.1f ns/frame\n", cj);
  printf("fast path (scan + copy text):     %7.1f ns/frame  (%.1fx)\n", fa, cj / fa);
  printf("(text bytes %zu %zu)\n", a, b);
  for (int i = 0; i < f.n; i++) free(f.data[i]);
  return a != b;
}
