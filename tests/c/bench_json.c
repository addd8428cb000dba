/*
 * bench_json.c - CPU cost per byte of the incremental JSON parser
 * (src/jsonstream.c) against cJSON on the whole answer, on structured
 * answers of 1 KiB, 64 KiB and 1 MiB (an extraction's records as a model
 * writes them: indented, names and prose strings, numbers, a few escapes
 * and non-ASCII), fed in 4-byte pieces (about a token each), 64-byte
 * pieces and whole:
 *   scan     the parser alone at depth 2 (each record located, not decoded)
 *   +decode  the same and each record decoded with cJSON (mz_json_parse),
 *            what mirza.json.stream does in C before building Lua tables
 *   cJSON    mz_json_parse of the whole text once it is all there
 * Not a test (the bench_ prefix keeps it out of the test glob; ctest runs
 * it briefly so it cannot rot); by hand:
 *
 *   gcc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I src -I/usr/include/cjson \
 *       src/jsonstream.c src/decode.c tests/c/bench_json.c -lcjson -o /tmp/bench_json
 *   /tmp/bench_json [N: each figure parses N x 64 bytes, default 1000000]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"
#include "jsonstream.h"

/* {"records": [ {...}, ... ], "count": n}, about `size` bytes. */
static char *make_doc(size_t size, size_t *len) {
  static const char *names[] = {"Ada Lovelace", "Gr\\u00e2ce Hopper", "Edsger W. Dijkstra", "Barbara Liskov",
                                "Donald \\\"Don\\\" Knuth"};
  size_t cap = size + 4096, n = 0;
  char *b = malloc(cap);
  int i = 0;
  if (!b) exit(1);
  n += (size_t)snprintf(b + n, cap - n, "{\n  \"records\": [\n");
  while (n + 300 < size || i == 0) {
    n +=
        (size_t)snprintf(b + n, cap - n,
                         "%s    {\n      \"id\": %d,\n      \"name\": \"%s\",\n      \"year\": %d,\n"
                         "      \"score\": %d.%02d,\n      \"tags\": [\"computing\", \"caf\xc3\xa9\", \"n/a\"],\n"
                         "      \"summary\": \"Record %d of the extraction, a sentence or two of prose as "
                         "the model wrote it.\",\n      \"verified\": %s,\n      \"source\": null\n    }",
                         i ? ",\n" : "", i, names[i % 5], 1815 + i % 200, i % 100, i % 97, i, i % 2 ? "true" : "false");
    i++;
  }
  n += (size_t)snprintf(b + n, cap - n, "\n  ],\n  \"count\": %d\n}\n", i);
  *len = n;
  return b;
}

static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static size_t sink; /* so nothing is optimised away */

/* One pass of the incremental parser over doc in pieces of `piece` bytes
 * (0: whole); decode: each record through cJSON too. */
static void stream_once(const char *doc, size_t len, size_t piece, int decode) {
  mz_jsonstream p;
  if (mz_js_init(&p, 2, 0)) exit(1);
  for (size_t from = 0; from < len;) {
    size_t n = piece && piece < len - from ? piece : len - from, off = 0, used;
    int st;
    mz_js_value v;
    while ((st = mz_js_feed(&p, doc + from + off, n - off, &used, &v)) == MZ_JS_VALUE) {
      off += used;
      if (decode) {
        cJSON *t = mz_json_parse(v.text, v.len, NULL);
        sink += t != NULL;
        cJSON_Delete(t);
      } else sink += v.len;
    }
    if (st < 0) exit(2);
    from += n;
  }
  if (mz_js_finish(&p) != MZ_JS_END) exit(3);
  mz_js_free(&p);
}

static void cjson_once(const char *doc, size_t len) {
  cJSON *t = mz_json_parse(doc, len, NULL);
  if (!t) exit(4);
  sink += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(t, "records"));
  cJSON_Delete(t);
}

/* ns per byte: best of 3 runs of `rounds` passes (the machine may be
 * busy; the minimum is the code's cost, not its neighbours'). */
static double measure(const char *doc, size_t len, size_t rounds, size_t piece, int mode) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = cpu_ns();
    for (size_t k = 0; k < rounds; k++) {
      if (mode == 2) cjson_once(doc, len);
      else stream_once(doc, len, piece, mode);
    }
    t0 = (cpu_ns() - t0) / ((double)rounds * (double)len);
    if (t0 < best) best = t0;
  }
  return best;
}

int main(int argc, char **argv) {
  size_t budget = (argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000UL) * 64; /* bytes per figure */
  static const size_t sizes[] = {1024, 64 * 1024, 1024 * 1024};
  static const size_t pieces[] = {4, 64, 0};
  printf("ns/byte, best of 3 (depth 2: each record)    4-byte  64-byte    whole\n");
  for (size_t s = 0; s < 3; s++) {
    size_t len;
    char *doc = make_doc(sizes[s], &len);
    size_t rounds = budget / len ? budget / len : 1;
    for (int mode = 0; mode < 2; mode++) {
      printf("%7zu B %-34s", len, mode ? "stream + cJSON per record" : "stream scan");
      for (size_t k = 0; k < 3; k++) printf(" %8.2f", measure(doc, len, rounds, pieces[k], mode));
      printf("\n");
    }
    printf("%7zu B %-34s %8s %8s %8.2f\n", len, "cJSON on the whole answer", "", "", measure(doc, len, rounds, 0, 2));
    free(doc);
  }
  printf("(checksum %zu)\n", sink);
  return 0;
}
