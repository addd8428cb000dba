/*
 * step.c - a decode step that grows with the batch (--step-growth), as the
 * pure functions of a shared step clock (state.c holds the clock under its
 * lock; tests/c/test_sim_step.c drives these on clocks of its own).
 *
 * A GPU server decodes its running sequences together, one token of each
 * per step, and the step takes longer the more sequences it carries:
 * step(n) = base + a*m + b*m^2 ms, m = max(0, n - knee), n the sequences
 * generating at that moment, base = 1000 / --tok-rate. The knee is the
 * batch that rides along free (decode is memory-bound until the batch is
 * big enough to be compute-bound); knee 0 is the plain quadratic. With b =
 * 0 the aggregate rate n / step(n) rises and flattens toward 1 / a (vLLM's
 * shape); with b > 0 it rises to a peak and falls past it (the H100
 * measurement of issue 41: llama-server CUDA -np 256, a 0.6B model: 254
 * tokens/s at 1 in flight, 1640 at 16, 1400 at 64, 1088 at 256).
 *
 * The clock counts the steps the batch has made: between two changes of n
 * it advances at 1000 / step(n) steps a second, so every generation in
 * the batch changes pace the moment a sequence joins or leaves, as in one
 * shared batch step. A generation that joined at `steps` = s0 has its
 * token k due when the clock reaches s0 + k.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

double step_ms(const step_curve *c, long n) {
  double m = n > c->knee ? (double)(n - c->knee) : 0;
  return c->base_ms + c->a * m + c->b * m * m;
}

/* Bring the clock to now at the batch size it had since its last change. */
void step_advance(step_clock *k, const step_curve *c, double now) {
  if (now <= k->t) return;
  if (k->n > 0) k->steps += (now - k->t) * 1000.0 / step_ms(c, k->n);
  k->t = now;
}

/* When the clock (already advanced) reaches target if n stays as it is;
 * a time <= k->t when it has. */
double step_due(const step_clock *k, const step_curve *c, double target) {
  double left = target - k->steps;
  if (left <= 1e-9) return k->t;
  return k->t + left * step_ms(c, k->n > 0 ? k->n : 1) / 1000.0;
}

/* The curves --step-growth names: their a, b, knee (and the tok-rate that
 * makes their base, 0: --tok-rate's). The h100 curve is fitted to the
 * measurement above (its peak near 15, 1034 tokens/s at 256); vllm
 * saturates toward 4,000 tokens/s (1,778 at 64, 3,048 at 256 with the
 * default base of 20 ms). */
static const struct preset {
  const char *name;
  double a, b;
  long knee;
  double tok_rate;
} presets[] = {{"h100", 0.6, 0.0015, 6, 256}, {"vllm", 0.25, 0, 0, 0}};

int step_parse(const char *spec, step_curve *c, double *tok_rate) {
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
    if (strcmp(spec, presets[i].name) == 0) {
      c->a = presets[i].a, c->b = presets[i].b, c->knee = presets[i].knee;
      *tok_rate = presets[i].tok_rate;
      return 0;
    }
  char *end;
  double v[3] = {0, 0, 0};
  const char *p = spec;
  for (int i = 0; i < 3; i++) {
    v[i] = strtod(p, &end);
    if (end == p || !(v[i] >= 0 && v[i] <= 1e6)) return -1;
    if (*end == 0) break;
    if (*end != ',' || i == 2) return -1;
    p = end + 1;
  }
  if (v[2] != (double)(long)v[2]) return -1; /* the knee counts sequences */
  c->a = v[0], c->b = v[1], c->knee = (long)v[2];
  *tok_rate = 0;
  return 0;
}
