/*
 * conn.c - connections per server: a finished request's connection
 * carries the next request to its server or is closed.
 *
 * libcurl keeps a finished transfer's connection for reuse (its connection
 * cache), and a server that gives each connection a thread for as long as
 * it lives (llama-server's HTTP pool, its 5 s keep-alive waits included)
 * then holds a thread on the idle connection while our requests queued
 * behind that pool get none: 64 items @64 to llama-server -np 4 (8
 * threads) took 35 s, the idle connections freed 8 at a time by the
 * server's keep-alive timeout. So a transfer's connection, once the
 * transfer is done, is noted here (its socket, its server, its local
 * address, the time), and looked at MZ_IDLE_GRACE_S later, time for the
 * script to send its next request (a batch task sends its next item as
 * soon as it has recorded the last): in use again (a new transfer watches
 * its socket), it is left alone; idle while a request to the same server
 * that was already waiting for its response head when the transfer ended
 * still waits, it is shut down, and the server's thread is free at once
 * (libcurl finds the connection dead and closes it, as one the server
 * closed); else it stays for the next request. A request opened since
 * does not count: it is on its way (counting it, a batch of short items
 * reconnected most of them). Each connection is looked at once; nothing is
 * noted while no transfer ends: streaming costs nothing.
 *
 * Each server's streams are listed in the order they opened; those no
 * longer waiting for their head leave the list's front when it is looked
 * at, so "the oldest request still waiting" costs O(1) amortized, not a
 * walk of every stream.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "client_int.h"

#define MZ_IDLE_GRACE_S 0.02

/* The server of a URL: a hash of its scheme and authority (the redacted
 * URL keeps host and port), never 0. */
static unsigned origin_of(const char *url) {
  const char *p = strstr(url, "://");
  size_t n = (size_t)(p ? p + 3 - url : 0);
  n += strcspn(url + n, "/?#");
  unsigned h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)url[i]) * 16777619u;
  return h ? h : 1;
}

static mz_origin *find(mz_client *c, unsigned hash) {
  for (size_t i = 0; i < c->norigins; i++)
    if (c->origins[i].hash == hash) return &c->origins[i];
  return NULL;
}

static void unlink_stream(mz_origin *o, mz_stream *s) {
  if (s->oprev) s->oprev->onext = s->onext;
  else o->head = s->onext;
  if (s->onext) s->onext->oprev = s->oprev;
  else o->tail = s->oprev;
  s->oprev = s->onext = NULL;
}

void mz_conn_open(mz_stream *s) {
  mz_client *c = s->c;
  s->origin = origin_of(s->url);
  mz_origin *o = find(c, s->origin);
  if (!o) {
    mz_origin *p = realloc(c->origins, (c->norigins + 1) * sizeof *p);
    if (!p) { /* not listed: its server's idle connections are left to libcurl */
      s->origin = 0;
      return;
    }
    c->origins = p;
    o = &p[c->norigins++];
    *o = (mz_origin){.hash = s->origin};
  }
  s->oprev = o->tail;
  if (o->tail) o->tail->onext = s;
  else o->head = s;
  o->tail = s;
}

void mz_conn_close(mz_stream *s) {
  mz_origin *o = s->origin ? find(s->c, s->origin) : NULL;
  if (o && (s->oprev || o->head == s)) unlink_stream(o, s);
}

/* A running transfer to origin, opened before `since`, still waits for
 * its head: queued at the server (for a slot, or for a thread that an
 * idle connection holds). One opened since is on its way: no reason. */
static int waited_on(mz_client *c, unsigned origin, double since) {
  mz_origin *o = find(c, origin);
  if (!o) return 0;
  mz_stream *s;
  while ((s = o->head) && (!s->easy || s->head_done || s->term)) unlink_stream(o, s);
  return s && s->t_open < since;
}

static void idle_drop(mz_client *c, size_t i) {
  memmove(&c->idle[i], &c->idle[i + 1], (c->nidle - i - 1) * sizeof *c->idle);
  c->nidle--;
}

/* Noted only when a request to the same server waits for its head (none:
 * none can be waiting when the note is looked at, and libcurl 7.88's
 * CURLINFO_ACTIVESOCKET costs a poll and 16 sigactions: a fifth more CPU
 * per short item). A note of the same socket number is an older
 * connection's, or this one's before its last transfer: dropped. */
void mz_conn_done(mz_client *c, CURL *e, mz_stream *s) {
  curl_socket_t fd = CURL_SOCKET_BAD;
  double now = mz_io_now(c);
  if (!s->origin || !waited_on(c, s->origin, now)) return;
  if (curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK || fd == CURL_SOCKET_BAD) return;
  for (size_t i = 0; i < c->nidle; i++)
    if (c->idle[i].fd == fd) idle_drop(c, i--);
  if (c->nidle == c->idle_cap) {
    size_t n = c->idle_cap ? 2 * c->idle_cap : 16;
    mz_idle *p = realloc(c->idle, n * sizeof *p);
    if (!p) return; /* not noted: kept by libcurl, as before */
    c->idle = p, c->idle_cap = n;
  }
  mz_idle *d = &c->idle[c->nidle];
  d->len = sizeof d->local;
  if (getsockname(fd, (struct sockaddr *)&d->local, &d->len)) return;
  d->fd = fd, d->origin = s->origin, d->at = now;
  c->nidle++;
}

static int in_use(const mz_client *c, curl_socket_t fd) {
  return fd >= 0 && (size_t)fd < c->nfd_rx && c->fd_owner[fd] && c->fd_owner[fd]->easy;
}

/* The same connection: the socket number still names our local address
 * (a number libcurl closed and reused names another, or none). */
static int same_socket(const mz_idle *d) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  return !getsockname(d->fd, (struct sockaddr *)&a, &len) && len == d->len && !memcmp(&a, &d->local, len);
}

double mz_conn_next(const mz_client *c) { return c->nidle ? c->idle[0].at + MZ_IDLE_GRACE_S : INFINITY; }

/* Each note whose time came, once (oldest first): in use again, or shut
 * down while a request to its server waits, or left to libcurl's cache. */
void mz_conn_run(mz_client *c, double now) {
  while (c->nidle && c->idle[0].at + MZ_IDLE_GRACE_S <= now) {
    mz_idle d = c->idle[0];
    idle_drop(c, 0);
    if (!in_use(c, d.fd) && waited_on(c, d.origin, d.at) && same_socket(&d)) shutdown(d.fd, SHUT_RDWR);
  }
}
