/*
 * state.c - process-wide state shared by connection threads: the RAM
 * "sessions" (last prompt per session id, for cached-token accounting), the
 * generation slots (--parallel) with a FIFO queue, and the registry of
 * in-flight requests that /v1/mtplx/cancel/{id} searches.
 *
 * The prompt cache (--prompt-cache slots, the default) is llama-server's:
 * each slot holds one prompt; a request takes the idle slot chosen by
 * slot_pick (slots.c: the longest shared prefix over a tenth of the
 * request, else the least recently released) or the one its body names
 * (id_slot, waiting for it while it is busy), finds cached the prefix it
 * shares with that slot's prompt, and its own prompt becomes the slot's
 * only once its prefill is done (sched_prefilled, at its first token): two
 * requests that start together with the same new preamble both evaluate
 * it, and a client that sends a preamble's items to the same server after
 * the first is answered reuses it. --prompt-cache endpoint: every prompt is
 * cached for the whole endpoint from the moment it arrives (an upper
 * bound, no server's behaviour).
 *
 * One mutex guards everything: contention is negligible next to the
 * simulated decode, and a single lock cannot deadlock.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"
#include "sys.h"

void state_init(server *s) {
  pthread_mutex_init(&s->mu, NULL);
  sys_cond_init(&s->cv);
  s->slots = calloc((size_t)s->cfg.parallel, sizeof *s->slots);
  s->store = calloc(SIM_STORE_MAX, sizeof *s->store);
  if (!s->slots || !s->store) abort();
}

static void set_prompt(char **dst, size_t *dst_len, const char *p, size_t n) {
  free(*dst);
  *dst = sim_strndup(p, n);
  *dst_len = n;
}

/* Forget every slot's prompt and the endpoint's store (MTPLX's
 * /admin/cache/clear); returns how many slots held one. */
long slots_clear(server *s) {
  long n = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < (int)s->cfg.parallel; i++) {
    n += s->slots[i].prompt != NULL;
    free(s->slots[i].prompt);
    s->slots[i].prompt = NULL;
    s->slots[i].prompt_len = 0;
  }
  for (int i = 0; i < s->store_n; i++) free(s->store[i].p);
  s->store_n = 0;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static session *session_find(server *s, const char *id) {
  for (session *p = s->sessions; p; p = p->next)
    if (strcmp(p->id, id) == 0) return p;
  return NULL;
}

/* Start a request on session id: measure the byte prefix shared with the
 * session's previous prompt (what a KV cache would reuse), then remember
 * this prompt. Returns -1 (409) when exclusive and the session is busy. */
int session_begin(server *s, const char *id, bool exclusive, const char *prompt, size_t n, long *cached_bytes) {
  pthread_mutex_lock(&s->mu);
  session *p = session_find(s, id);
  if (p && p->busy && exclusive) {
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  if (!p) {
    p = calloc(1, sizeof *p);
    if (!p) abort();
    p->id = sim_strndup(id, strlen(id));
    p->next = s->sessions;
    s->sessions = p;
  }
  size_t common = 0;
  while (common < n && common < p->prompt_len && prompt[common] == p->prompt[common]) common++;
  *cached_bytes = (long)common;
  free(p->prompt);
  p->prompt = sim_strndup(prompt, n);
  p->prompt_len = n;
  p->busy = p->busy || exclusive;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void session_end(server *s, const char *id) {
  pthread_mutex_lock(&s->mu);
  session *p = session_find(s, id);
  if (p) p->busy = false;
  pthread_mutex_unlock(&s->mu);
}

/* Drop one session (id) or all (id == NULL); returns how many. A busy
 * session is dropped too: its request simply finds no entry at the end. */
long sessions_clear(server *s, const char *id) {
  long n = 0;
  pthread_mutex_lock(&s->mu);
  for (session **pp = &s->sessions; *pp;) {
    session *p = *pp;
    if (id && strcmp(p->id, id) != 0) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    free(p->id);
    free(p->prompt);
    free(p);
    n++;
  }
  pthread_mutex_unlock(&s->mu);
  return n;
}

void inflight_add(server *s, inflight *f) {
  pthread_mutex_lock(&s->mu);
  f->next = s->inflight;
  s->inflight = f;
  pthread_mutex_unlock(&s->mu);
}

void inflight_remove(server *s, inflight *f) {
  pthread_mutex_lock(&s->mu);
  for (inflight **pp = &s->inflight; *pp; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  pthread_mutex_unlock(&s->mu);
}

/* Raise the cancel flag of every in-flight request named id; the id may be
 * given with or without its "chatcmpl-" prefix. */
bool inflight_cancel(server *s, const char *id) {
  bool found = false;
  pthread_mutex_lock(&s->mu);
  for (inflight *f = s->inflight; f; f = f->next) {
    const char *bare = strncmp(f->id, "chatcmpl-", 9) == 0 ? f->id + 9
                       : strncmp(f->id, "cmpl-", 5) == 0   ? f->id + 5
                                                           : f->id;
    if (strcmp(f->id, id) == 0 || strcmp(bare, id) == 0) {
      atomic_store(&f->cancel, true);
      found = true;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return found;
}

static void queue_remove(server *s, waiter *w) {
  waiter **pp = &s->queue_head;
  waiter *prev = NULL;
  while (*pp && *pp != w) prev = *pp, pp = &(*pp)->next;
  if (!*pp) return;
  *pp = w->next;
  if (s->queue_tail == w) s->queue_tail = prev;
}

/* --prompt-cache endpoint, as a request arrives (under the lock): the
 * longest prefix any earlier prompt shares with it; then it is stored. */
static size_t store_arrive(server *s, const char *prompt, size_t n) {
  size_t common = 0;
  int i = store_best(s->store, s->store_n, prompt, n, &common);
  if (i < 0 || common < n || s->store[i].n != n) { /* not there yet: a new entry */
    i = s->store_n < SIM_STORE_MAX ? s->store_n++ : store_victim(s->store, s->store_n);
    set_prompt(&s->store[i].p, &s->store[i].n, prompt, n);
  }
  s->store[i].used = sim_now();
  return common;
}

/* The slot the waiter w may take now (under the lock), or -1: w must be
 * the first waiter in line that can go (the queue is first come, first
 * served, but one waiting for a busy slot it named lets the next go, as
 * llama-server defers such a task). */
static int slot_for(server *s, waiter *w, const char *prompt, size_t n) {
  if (s->busy_slots >= s->cfg.parallel) return -1;
  if (!s->pinned_waiting && s->queue_head != w) return -1;
  for (waiter *q = s->queue_head; q && q != w; q = q->next)
    if (q->pin < 0 || !s->slots[q->pin].busy) return -1; /* an earlier one can go */
  if (w->pin >= 0) return s->slots[w->pin].busy ? -1 : w->pin;
  double sim = s->cfg.prompt_cache == CACHE_SLOTS ? s->cfg.slot_similarity : 0;
  return slot_pick(s->slots, (int)s->cfg.parallel, prompt, n, sim);
}

/* Wait for a generation slot, first come first served (pin >= 0: that
 * slot, modulo --parallel, as llama-server's id_slot). Every SIM_SLICE_MS
 * the lock is dropped and tick(arg) runs (heartbeats, disconnect checks); a
 * nonzero tick abandons the wait and is returned. 0 = slot held: its index,
 * and the bytes of prompt found cached. The slot keeps only that prefix
 * until sched_prefilled. */
int sched_acquire(server *s, sched_tick tick, void *arg, const char *prompt, size_t n, int pin, int *slot_index,
                  long *cached_bytes) {
  if (!prompt) prompt = "", n = 0;
  waiter w = {.pin = pin >= 0 ? (int)(pin % s->cfg.parallel) : -1}; /* on our stack: unlinked before returning */
  pthread_mutex_lock(&s->mu);
  size_t stored = s->cfg.prompt_cache == CACHE_ENDPOINT ? store_arrive(s, prompt, n) : 0;
  if (s->queue_tail) s->queue_tail->next = &w;
  else s->queue_head = &w; // cppcheck-suppress autoVariables ; unlinked by queue_remove before return
  s->queue_tail = &w;      // cppcheck-suppress autoVariables ; unlinked by queue_remove before return
  s->pinned_waiting += w.pin >= 0;
  int i;
  while ((i = slot_for(s, &w, prompt, n)) < 0) {
    sys_cond_wait_ms(&s->cv, &s->mu, SIM_SLICE_MS);
    pthread_mutex_unlock(&s->mu);
    int rc = tick ? tick(arg) : 0;
    pthread_mutex_lock(&s->mu);
    if (rc) {
      queue_remove(s, &w);
      s->pinned_waiting -= w.pin >= 0;
      pthread_cond_broadcast(&s->cv);
      pthread_mutex_unlock(&s->mu);
      return rc;
    }
  }
  queue_remove(s, &w);
  s->pinned_waiting -= w.pin >= 0;
  s->busy_slots++;
  slot *sl = &s->slots[i];
  size_t common = sim_common_prefix(prompt, n, sl->prompt, sl->prompt_len);
  sl->busy = true;
  sl->prompt_len = common; /* llama-server keeps the shared prefix, evaluates the rest */
  *slot_index = i;
  *cached_bytes = (long)(s->cfg.prompt_cache == CACHE_ENDPOINT ? stored : common);
  pthread_cond_broadcast(&s->cv); /* the next in line may fit too */
  pthread_mutex_unlock(&s->mu);
  return 0;
}

/* The prefill of the request holding slot_index is done (its first token
 * is due): the slot now holds its whole prompt. */
void sched_prefilled(server *s, int slot_index, const char *prompt, size_t n) {
  pthread_mutex_lock(&s->mu);
  slot *sl = &s->slots[slot_index];
  set_prompt(&sl->prompt, &sl->prompt_len, prompt ? prompt : "", prompt ? n : 0);
  pthread_mutex_unlock(&s->mu);
}

void sched_release(server *s, int slot_index) {
  pthread_mutex_lock(&s->mu);
  s->busy_slots--;
  s->slots[slot_index].busy = false;
  s->slots[slot_index].last_used = sim_now();
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* What llama-server's /metrics calls requests_processing (its busy slots)
 * and requests_deferred (the requests waiting for one: queued here). */
void sched_counts(server *s, long *processing, long *deferred) {
  long n = 0;
  pthread_mutex_lock(&s->mu);
  for (const waiter *w = s->queue_head; w; w = w->next) n++;
  *processing = s->busy_slots;
  *deferred = n;
  pthread_mutex_unlock(&s->mu);
}

/* --step-growth: the batch's step clock (step.c), under the one lock. A
 * change of the batch's size first brings the clock to now at the old
 * size, so the steps already made keep their pace. */
double decode_join(server *s, long weight) {
  pthread_mutex_lock(&s->mu);
  step_advance(&s->decode, &s->cfg.curve, sim_now());
  s->decode.n += weight;
  double steps = s->decode.steps;
  pthread_mutex_unlock(&s->mu);
  return steps;
}

void decode_leave(server *s, long weight) {
  pthread_mutex_lock(&s->mu);
  step_advance(&s->decode, &s->cfg.curve, sim_now());
  s->decode.n -= weight;
  pthread_mutex_unlock(&s->mu);
  atomic_fetch_add(&s->decode_leaves, 1);
}

double decode_due(server *s, double target) {
  pthread_mutex_lock(&s->mu);
  step_advance(&s->decode, &s->cfg.curve, sim_now());
  double due = step_due(&s->decode, &s->cfg.curve, target);
  pthread_mutex_unlock(&s->mu);
  return due;
}
