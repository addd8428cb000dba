/*
 * slots.c - the choices of mirza-sim's prompt cache, as pure functions of
 * the slot table (state.c calls them under its lock; tests/c/test_sim_slots.c
 * calls them on tables of its own).
 *
 * llama-server (tools/server/server-context.cpp, get_available_slot) gives
 * a request without id_slot an idle slot: first the one whose cached tokens
 * share the longest common prefix with the request, when that prefix is
 * more than --slot-prompt-similarity of the request's length (0 skips this
 * pass; an empty slot never matches; the first of equals wins), else the
 * idle slot least recently released (of equals, the last: its loop keeps
 * a slot whose t_last_used <= the best so far). A slot holds one prompt.
 *
 * The endpoint model (--prompt-cache endpoint) is no server's: every prompt
 * that arrived is cached for every later request, whatever the slot; the
 * most recently used SIM_STORE_MAX of them are kept.
 */
#include <string.h>

#include "sim.h"

size_t sim_common_prefix(const char *a, size_t an, const char *b, size_t bn) {
  size_t n = 0;
  while (n < an && n < bn && a[n] == b[n]) n++;
  return n;
}

int slot_pick(const slot *slots, int n, const char *prompt, size_t len, double similarity) {
  int best = -1, lru = -1;
  double sim_best = 0;
  for (int i = 0; i < n; i++) {
    const slot *sl = &slots[i];
    if (sl->busy) continue;
    if (lru < 0 || sl->last_used <= slots[lru].last_used) lru = i;
    if (similarity <= 0 || sl->prompt_len == 0 || len == 0) continue;
    double sim = (double)sim_common_prefix(prompt, len, sl->prompt, sl->prompt_len) / (double)len;
    if (sim > sim_best && sim > similarity) best = i, sim_best = sim;
  }
  return best >= 0 ? best : lru;
}

int store_best(const cached_prompt *store, int n, const char *prompt, size_t len, size_t *common) {
  int best = -1;
  *common = 0;
  for (int i = 0; i < n; i++) {
    size_t c = sim_common_prefix(prompt, len, store[i].p, store[i].n);
    if (c > *common || (best < 0 && c == len)) best = i, *common = c;
  }
  return best;
}

int store_victim(const cached_prompt *store, int n) {
  int v = 0;
  for (int i = 1; i < n; i++)
    if (store[i].used < store[v].used) v = i;
  return v;
}
