/*
 * watch.h - the wait of the client's driver, behind one interface with one
 * backend per file (as libuv keeps src/unix/linux.c and kqueue.c apart):
 * watch_epoll.c (Linux) and watch_poll.c (anywhere POSIX; cmake
 * -DMIRZA_POLL=ON or -DMIRZA_PORTABLE=ON builds it on Linux too, as
 * scripts/test's sanitizer build does).
 * CMake picks the file; the driver and its structs never see which.
 *
 * The set holds the wake pipe's read end (given to mz_watch_new, never
 * removed) and the sockets libcurl asks for (mz_watch_set with its
 * CURL_POLL_* values, from the socket callback). A socket may be parked
 * (mz_watch_park): kept, not waited on; the driver reads it when a
 * parked stream's read is due (client.c's rule of when a stream is
 * read). Readiness is level-triggered: what is
 * not reported by one wait (more than MZ_FIRED_MAX sockets ready) is
 * reported by the next.
 */
#ifndef MIRZA_WATCH_H
#define MIRZA_WATCH_H

#include <curl/curl.h>
#include <poll.h>
#include <stddef.h>

typedef struct mz_watch mz_watch; /* backend-defined */

typedef struct mz_fired {
  curl_socket_t fd;
  int ev; /* CURL_CSELECT_* */
} mz_fired;

enum { MZ_FIRED_MAX = 64 }; /* sockets reported per wait */

/* "epoll" or "poll": the backend this build has (mirza.platform.wait). */
extern const char mz_watch_backend[];

/* A set watching wake_fd for reading; NULL when out of resources. */
mz_watch *mz_watch_new(int wake_fd);
void mz_watch_free(mz_watch *w); /* NULL is fine */
/* Watch fd for what (CURL_POLL_IN/OUT/INOUT), or forget it
 * (CURL_POLL_REMOVE: never fails). -1 when it cannot be watched. */
int mz_watch_set(mz_watch *w, curl_socket_t fd, int what);
/* Park fd (park 1: no wait reports it; it keeps what libcurl wants, and
 * mz_watch_set changes that while parked) or watch it again (0). -1 when
 * it cannot be moved (it stays where it was). */
int mz_watch_park(mz_watch *w, curl_socket_t fd, int park);
/* The parked sockets that got bytes (or were closed) since the last call,
 * up to max (no wait): which parked streams have something new to look
 * at. epoll: exactly those (edge-triggered); poll: those with bytes. */
size_t mz_watch_fresh(mz_watch *w, curl_socket_t *out, size_t max);
/* Wait up to ms (0: only what is ready now; <0: until something is) and
 * fill out with up to MZ_FIRED_MAX ready sockets; returns how many. Sets
 * *woken when the wake pipe is readable (it is not drained here), and
 * *eintr when a signal cut the wait short; never clears either. */
size_t mz_watch_wait(mz_watch *w, int ms, mz_fired *out, int *woken, int *eintr);

/* poll(2)'s flags and libcurl's, both ways: for watch_poll.c and for the
 * client's pause, which polls the fresh streams' sockets itself. */
static inline short mz_poll_events(int what) { /* CURL_POLL_* -> events */
  return (short)(((what & CURL_POLL_IN) ? POLLIN : 0) | ((what & CURL_POLL_OUT) ? POLLOUT : 0));
}
static inline int mz_poll_fired(short revents) { /* revents -> CURL_CSELECT_* */
  return ((revents & (POLLIN | POLLHUP)) ? CURL_CSELECT_IN : 0) | ((revents & POLLOUT) ? CURL_CSELECT_OUT : 0) |
         ((revents & (POLLERR | POLLNVAL)) ? CURL_CSELECT_ERR : 0);
}

#endif
