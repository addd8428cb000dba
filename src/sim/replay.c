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

int replay_run(job *j) {
  size_t n;
  char *body = sim_slurp(j->f.replay, REPLAY_MAX, &n);
  if (!body) {
    char msg[1200];
    snprintf(msg, sizeof msg, "replay: cannot read %s", j->f.replay);
    return send_error(j->c, 500, msg, "server_error", "ReplayError");
  }
  j->stream = true; /* the recording decides what the body is */
  if (http_begin_chunked(j->c, 200, "text/event-stream", NULL)) j->gone = true;
  double t = sim_now() + (double)(j->ttft_ms > 0 ? j->ttft_ms : 0) / 1000.0;
  for (size_t off = 0, i = 0; off < n && !j->gone; i++) {
    size_t len = sim_event_len(body + off, n - off);
    if (j->rate > 0 || j->ttft_ms > 0) {
      job_flush(j);
      double due = t + (j->rate > 0 ? (double)i / j->rate : 0);
      if (!j->gone && conn_wait_until(j->c, due, NULL)) j->gone = true;
    }
    sbuf_add(&j->out, body + off, len);
    if (j->out.len >= SIM_FLUSH_BYTES) job_flush(j);
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
