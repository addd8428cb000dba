/*
 * metrics.c - GET /metrics in the llama dialect: llama-server's Prometheus
 * text (tools/server/server-context.cpp, get_metrics, llama.cpp b9928),
 * "# HELP" and "# TYPE" lines then "llamacpp:NAME VALUE" for its counters
 * and gauges, Content-Type "text/plain; version=0.0.4". What a client
 * reads for load: requests_processing (busy slots) and requests_deferred
 * (requests waiting for a slot); the other counters and gauges are
 * there, at 0. Without --metrics the
 * route answers 501 as llama-server's does.
 *
 * --vllm-metrics (either dialect): vLLM's instead (vllm/v1/metrics/
 * loggers.py, PrometheusStatLogger, as prometheus_client writes it: the
 * labels sorted, values as floats): vllm:num_requests_running (the
 * requests holding one of the --parallel slots, vLLM's --max-num-seqs:
 * prefilling or generating) and vllm:num_requests_waiting (queued).
 */
#include <stdio.h>
#include <time.h>

#include "sim.h"

typedef struct metric {
  const char *name, *help, *type;
  double value;
} metric;

/* A gauge in prometheus_client's words, labelled as vLLM labels them. */
static void vllm_gauge(sbuf *b, const char *model, const char *name, const char *help, long value) {
  sbuf_printf(b, "# HELP vllm:%s %s\n# TYPE vllm:%s gauge\nvllm:%s{engine=\"0\",model_name=", name, help, name, name);
  sbuf_json_str(b, model);
  sbuf_printf(b, "} %ld.0\n", value);
}

static int vllm_metrics(conn *c) {
  long running, waiting;
  sched_counts(c->srv, &running, &waiting);
  sbuf b = {0};
  vllm_gauge(&b, c->srv->cfg.model_id, "num_requests_running", "Number of requests in model execution batches.",
             running);
  vllm_gauge(&b, c->srv->cfg.model_id, "num_requests_waiting", "Number of requests waiting to be processed.", waiting);
  http_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.p, b.len);
  sbuf_free(&b);
  return 200;
}

int route_metrics(conn *c) {
  server *s = c->srv;
  if (s->cfg.vllm_metrics) return vllm_metrics(c);
  if (!s->cfg.metrics)
    return send_error(c, 501, "This server does not support metrics endpoint. Start it with `--metrics`",
                      "not_supported_error", NULL);
  long processing, deferred;
  sched_counts(s, &processing, &deferred);
  const metric m[] = {
      {"prompt_tokens_total", "Number of prompt tokens processed.", "counter", 0},
      {"prompt_seconds_total", "Prompt process time", "counter", 0},
      {"tokens_predicted_total", "Number of generation tokens processed.", "counter", 0},
      {"tokens_predicted_seconds_total", "Predict process time", "counter", 0},
      {"n_decode_total", "Total number of llama_decode() calls", "counter", 0},
      {"n_tokens_max", "Largest observed n_tokens.", "counter", 0},
      {"prompt_tokens_seconds", "Average prompt throughput in tokens/s.", "gauge", 0},
      {"predicted_tokens_seconds", "Average generation throughput in tokens/s.", "gauge", 0},
      {"requests_processing", "Number of requests processing.", "gauge", (double)processing},
      {"requests_deferred", "Number of requests deferred.", "gauge", (double)deferred},
      {"n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", "gauge", 0},
  };
  sbuf b = {0};
  for (size_t i = 0; i < sizeof m / sizeof *m; i++)
    sbuf_printf(&b, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %g\n", m[i].name, m[i].help, m[i].name,
                m[i].type, m[i].name, m[i].value);
  char extra[64];
  snprintf(extra, sizeof extra, "Process-Start-Time-Unix: %ld\r\n", (long)time(NULL) - (long)(sim_now() - s->t_start));
  http_send(c, 200, "text/plain; version=0.0.4", extra, b.p, b.len);
  sbuf_free(&b);
  return 200;
}
