/*
 * state.c - process-wide state shared by connection threads: the RAM
 * "sessions" (last prompt per session id, for cached-token accounting), the
 * generation slots (--parallel) with a FIFO queue, and the registry of
 * in-flight requests that /v1/mtplx/cancel/{id} searches.
 *
 * Each slot keeps the last prompt it served, as llama-server's slots keep
 * their KV cache: a request is given the free slot whose prompt shares the
 * longest prefix with its own (the least recently used free slot when none
 * shares more than a tenth), and that prefix is what it finds cached. So a
 * client that sends requests sharing a preamble to the same server reuses
 * it, and one that spreads them over more preambles than slots evicts it.
 *
 * One mutex guards everything: contention is negligible next to the
 * simulated decode, and a single lock cannot deadlock.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"

void state_init(server *s) {
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  s->slots = calloc((size_t)s->cfg.parallel, sizeof *s->slots);
  if (!s->slots) abort();
}

static size_t common_prefix(const char *a, size_t an, const char *b, size_t bn) {
  size_t n = 0;
  while (n < an && n < bn && a[n] == b[n]) n++;
  return n;
}

/* The free slot for a prompt (under the lock), as llama-server's
 * get_available_slot: the longest shared prefix if it is more than a tenth
 * of the prompt (--slot-prompt-similarity 0.1), else the least recently
 * used; *common: the prefix shared with the chosen slot's prompt. */
static int slot_pick(server *s, const char *prompt, size_t n, size_t *common) {
  int best = -1, lru = -1;
  size_t best_n = 0, lru_n = 0;
  for (int i = 0; i < (int)s->cfg.parallel; i++) {
    slot *sl = &s->slots[i];
    if (sl->busy) continue;
    size_t c = common_prefix(prompt, n, sl->prompt ? sl->prompt : "", sl->prompt_len);
    if (c * 10 > n && c > best_n) best = i, best_n = c;
    if (lru < 0 || sl->last_used < s->slots[lru].last_used) lru = i, lru_n = c;
  }
  *common = best >= 0 ? best_n : lru_n;
  return best >= 0 ? best : lru;
}

/* Forget every slot's prompt (MTPLX's /admin/cache/clear); returns how
 * many held one. */
long slots_clear(server *s) {
  long n = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < (int)s->cfg.parallel; i++) {
    n += s->slots[i].prompt != NULL;
    free(s->slots[i].prompt);
    s->slots[i].prompt = NULL;
    s->slots[i].prompt_len = 0;
  }
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

/* Wait for a generation slot, first come first served. Every SIM_SLICE_MS
 * the lock is dropped and tick(arg) runs (heartbeats, disconnect checks); a
 * nonzero tick abandons the wait and is returned. 0 = slot held: its index,
 * and the bytes of prompt its cache held; the slot now caches prompt. */
int sched_acquire(server *s, sched_tick tick, void *arg, const char *prompt, size_t n, int *slot_index,
                  long *cached_bytes) {
  waiter w = {0}; /* queued on our stack: removed before every return below */
  pthread_mutex_lock(&s->mu);
  if (s->queue_tail) s->queue_tail->next = &w;
  else s->queue_head = &w; // cppcheck-suppress autoVariables ; unlinked by queue_remove before return
  s->queue_tail = &w;      // cppcheck-suppress autoVariables ; unlinked by queue_remove before return
  while (!(s->queue_head == &w && s->busy_slots < s->cfg.parallel)) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += SIM_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    pthread_mutex_unlock(&s->mu);
    int rc = tick ? tick(arg) : 0;
    pthread_mutex_lock(&s->mu);
    if (rc) {
      queue_remove(s, &w);
      pthread_cond_broadcast(&s->cv);
      pthread_mutex_unlock(&s->mu);
      return rc;
    }
  }
  queue_remove(s, &w);
  s->busy_slots++;
  size_t common = 0;
  int i = slot_pick(s, prompt ? prompt : "", prompt ? n : 0, &common);
  slot *sl = &s->slots[i];
  sl->busy = true;
  sl->last_used = sim_now();
  free(sl->prompt);
  sl->prompt = sim_strndup(prompt ? prompt : "", prompt ? n : 0);
  sl->prompt_len = prompt ? n : 0;
  *slot_index = i;
  *cached_bytes = (long)common;
  pthread_cond_broadcast(&s->cv); /* the next in line may fit too */
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void sched_release(server *s, int slot_index) {
  pthread_mutex_lock(&s->mu);
  s->busy_slots--;
  s->slots[slot_index].busy = false;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}
