/*
 * curl_floor.c - what libcurl alone costs on a batch's traffic: ITEMS
 * POSTs of one body, CONCURRENCY at a time over kept connections, each
 * answer read and thrown away (no SSE parsing, no JSON, no Lua), the
 * transfers run once per TICK_MS like mirza's scheduler at its tick
 * (curl_multi_perform reads every ready socket, then a sleep; 0: as bytes
 * come, curl_multi_poll). The CPU this process spends is the floor under
 * `mirza batch` on the same items: scripts/bench.lua prints it next to
 * the batch rows (issue 20, goal 4). By hand, against mirza-sim:
 *
 *   curl_floor URL BODYFILE ITEMS CONCURRENCY TICK_MS
 *
 * prints one line of JSON: {"items", "ok" (answered 200), "bytes", "cpu",
 * "wall"} (seconds: CPU of this process, user + system, over the run);
 * exits 1 when an item failed, 2 on bad arguments.
 */
#define _POSIX_C_SOURCE 200809L
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static const char *url;
static char *body;
static long body_len;
static struct curl_slist *hdrs;
static size_t bytes;

static size_t sink(char *p, size_t size, size_t n, void *ud) {
  (void)p;
  (void)ud;
  bytes += size * n;
  return size * n;
}

static CURL *start(CURLM *m) {
  CURL *e = curl_easy_init();
  if (!e) return NULL;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, body_len);
  curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, body);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_multi_add_handle(m, e);
  return e;
}

static double now(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

static char *slurp(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = malloc(1 << 20);
  *len = b ? (long)fread(b, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  if (b) b[*len] = 0;
  return b;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: curl_floor URL BODYFILE ITEMS CONCURRENCY TICK_MS\n");
    return 2;
  }
  url = argv[1];
  long items = atol(argv[3]), conc = atol(argv[4]), tick_ms = atol(argv[5]);
  if (!(body = slurp(argv[2], &body_len)) || items < 1 || conc < 1 || tick_ms < 0) {
    fprintf(stderr, "curl_floor: cannot read %s, or a count out of range\n", argv[2]);
    return 2;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  hdrs = curl_slist_append(hdrs, "Accept: text/event-stream");
  hdrs = curl_slist_append(hdrs, "Expect:");
  CURLM *m = curl_multi_init();
  double c0 = cpu(), t0 = now(CLOCK_MONOTONIC);
  long started = 0, done = 0, ok = 0;
  for (; started < conc && started < items; started++)
    if (!start(m)) return fprintf(stderr, "curl_floor: out of memory\n"), 1;
  for (int again = 0; done < items;) {
    int running;
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
      if (msg->msg != CURLMSG_DONE) continue;
      long status = 0;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
      ok += msg->data.result == CURLE_OK && status == 200;
      curl_multi_remove_handle(m, msg->easy_handle);
      curl_easy_cleanup(msg->easy_handle);
      done++;
      if (started < items) {
        if (!start(m)) return fprintf(stderr, "curl_floor: out of memory\n"), 1;
        started++, again = 1;
      }
    }
    if (done == items) break;
    if (again) { /* the next items' requests go out now, not a tick later (as mirza's pause sends them) */
      again = 0;
      continue;
    }
    if (tick_ms > 0) {
      struct timespec ts = {tick_ms / 1000, (tick_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    } else curl_multi_poll(m, NULL, 0, 1000, NULL);
  }
  printf("{\"items\":%ld,\"ok\":%ld,\"bytes\":%zu,\"cpu\":%.6f,\"wall\":%.6f}\n", items, ok, bytes, cpu() - c0,
         now(CLOCK_MONOTONIC) - t0);
  curl_multi_cleanup(m);
  curl_slist_free_all(hdrs);
  free(body);
  curl_global_cleanup();
  return ok == items ? 0 : 1;
}
