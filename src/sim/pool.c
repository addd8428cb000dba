/*
 * pool.c - llama-server's HTTP thread pool (--threads-http), for the llama
 * dialect: a fixed number of threads, each serving one connection for as
 * long as it lives, its keep-alive wait included (http.c waits
 * --keepalive-ms, 5 s by default, for the next request); a connection
 * accepted while every thread holds one waits in the queue, its request
 * unread, until a thread's connection closes.
 *
 * Sources (llama.cpp b9928): tools/server/server-http.cpp sizes the pool
 * max(--parallel + 4, hardware threads - 1) unless --threads-http N (<= 0:
 * that default, common/arg.cpp), and gives it to cpp-httplib's ThreadPool
 * (vendor/cpp-httplib/httplib.cpp): Server::listen_internal accepts and
 * enqueues process_and_close_socket, which loops over the connection's
 * requests until the client closes it or keep_alive() sees no request for
 * CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND (5 s). That ThreadPool may also start
 * up to 1,024 extra threads, but only when it finds none of its threads
 * idle as a connection is queued: a burst of connections arriving while the
 * base threads still count as idle (after the server sat idle more than
 * CPPHTTPLIB_THREAD_POOL_IDLE_TIMEOUT, 3 s, the extra threads gone) queues
 * behind them. The sim takes that case every time: no extra threads, so a
 * test sees it deterministically.
 *
 * The MTPLX dialect (and --threads-http 0 in the llama one) keeps a thread
 * per connection, unbounded (main.c).
 */
#include <stdlib.h>
#include <unistd.h>

#include "sim.h"

typedef struct fdq {
  int fd;
  struct fdq *next;
} fdq;

typedef struct http_pool {
  server *srv;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fdq *head, *tail; /* accepted connections no thread serves yet */
  long queued, threads, idle, max;
  pthread_attr_t attr;
} http_pool;

/* llama-server's default pool size (server-http.cpp). */
long pool_default_threads(long parallel) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  return parallel + 4 > cores - 1 ? parallel + 4 : cores - 1;
}

/* One of the pool's threads: a connection at a time, to its end. */
static void *pool_worker(void *arg) {
  http_pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    p->idle++;
    while (!p->head) pthread_cond_wait(&p->cv, &p->mu);
    p->idle--;
    fdq *q = p->head;
    p->head = q->next;
    if (!p->head) p->tail = NULL;
    p->queued--;
    pthread_mutex_unlock(&p->mu);
    int fd = q->fd;
    free(q);
    serve_connection(p->srv, fd);
  }
  return NULL;
}

http_pool *pool_new(server *s, long max_threads) {
  http_pool *p = calloc(1, sizeof *p);
  if (!p) abort();
  p->srv = s;
  p->max = max_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  pthread_attr_init(&p->attr);
  pthread_attr_setdetachstate(&p->attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&p->attr, 1u << 20); /* cJSON recurses on nesting */
  return p;
}

/* Queue an accepted connection. The threads are started as connections
 * need them (more queued than idle), up to the pool's size, and never end
 * (httplib's base threads, started with the server): past them a queued
 * connection waits for one. Returns -1 (fd not taken) when out of memory. */
int pool_submit(http_pool *p, int fd) {
  fdq *q = malloc(sizeof *q);
  if (!q) return -1;
  q->fd = fd;
  q->next = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->tail) p->tail->next = q;
  else p->head = q;
  p->tail = q;
  p->queued++;
  pthread_t t;
  if (p->queued > p->idle && p->threads < p->max && pthread_create(&t, &p->attr, pool_worker, p) == 0) p->threads++;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return 0;
}
