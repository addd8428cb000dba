/*
 * replay.c - the replay=PATH fault: send a recorded .sse body verbatim.
 *
 * Real captures (the .sse files under tests/fixtures/traces) can thus be served over real
 * HTTP, byte for byte, including whatever oddities they contain. Events are
 * separated at blank lines and paced by the request's token rate (one event
 * per token, after ttft); at rate 0 the whole body goes out in large chunks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "stream.h"

#define REPLAY_MAX (256u << 20)

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  sbuf b = {0};
  char tmp[65536];
  size_t r;
  while ((r = fread(tmp, 1, sizeof tmp, f)) > 0 && b.len < REPLAY_MAX)
    sbuf_add(&b, tmp, r);
  fclose(f);
  *n = b.len;
  if (!b.p)
    b.p = sim_strndup("", 0);
  return b.p;
}

/* Length of the event starting at p, including its blank-line separator
 * (LF LF or CRLF CRLF); the rest of the file when there is none. */
static size_t event_len(const char *p, size_t n) {
  for (size_t i = 0; i + 1 < n; i++) {
    if (p[i] == '\n' && p[i + 1] == '\n')
      return i + 2;
    if (p[i] == '\n' && p[i + 1] == '\r' && i + 2 < n && p[i + 2] == '\n')
      return i + 3;
  }
  return n;
}

int replay_run(job *j) {
  size_t n;
  char *body = slurp(j->f.replay, &n);
  if (!body) {
    char msg[1200];
    snprintf(msg, sizeof msg, "replay: cannot read %s", j->f.replay);
    return send_error(j->c, 500, msg, "server_error", "ReplayError");
  }
  j->stream = true; /* the recording decides what the body is */
  if (http_begin_chunked(j->c, 200, "text/event-stream", NULL))
    j->gone = true;
  double t = sim_now() + (double)(j->ttft_ms > 0 ? j->ttft_ms : 0) / 1000.0;
  for (size_t off = 0, i = 0; off < n && !j->gone; i++) {
    size_t len = event_len(body + off, n - off);
    if (j->rate > 0 || j->ttft_ms > 0) {
      job_flush(j);
      double due = t + (j->rate > 0 ? (double)i / j->rate : 0);
      if (!j->gone && conn_wait_until(j->c, due, NULL))
        j->gone = true;
    }
    sbuf_add(&j->out, body + off, len);
    if (j->out.len >= SIM_FLUSH_BYTES)
      job_flush(j);
    off += len;
  }
  job_flush(j);
  free(body);
  if (j->gone || http_end_chunked(j->c)) {
    j->c->must_close = true;
    return 499;
  }
  return 200;
}
