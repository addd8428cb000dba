/*
 * main.c - mirza-sim's command line, startup behaviour and accept loop.
 *
 * Startup mimics the two real daemons so the supervisor can be tested:
 * MTPLX binds only once the model is loaded (--load-delay-ms: connection
 * refused until then) and may fail to load (--fail-start); llama-server binds
 * at once and answers 503 while loading (--health-delay-ms). Once bound, one
 * line "mirza-sim listening on http://HOST:PORT" goes to stdout; tests parse
 * the port from it (or from --port-file).
 *
 * SIGTERM/SIGINT end the process at once with status 0: _exit() is
 * async-signal-safe and the kernel closes every connection, which is what a
 * client sees when a real daemon is stopped.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nofile.h"
#include "os.h"
#include "sim.h"

static const struct option long_opts[] = {{"host", 1, 0, 'H'},
                                          {"port", 1, 0, 'p'},
                                          {"port-file", 1, 0, 'P'},
                                          {"dialect", 1, 0, 'd'},
                                          {"model-id", 1, 0, 'm'},
                                          {"context-window", 1, 0, 'c'},
                                          {"api-key", 1, 0, 'k'},
                                          {"parallel", 1, 0, 'j'},
                                          {"tok-rate", 1, 0, 'r'},
                                          {"ttft-ms", 1, 0, 't'},
                                          {"heartbeat-ms", 1, 0, 'b'},
                                          {"progress-every", 1, 0, 'g'},
                                          {"reasoning-tokens", 1, 0, 'R'},
                                          {"answer-tokens", 1, 0, 'A'},
                                          {"load-delay-ms", 1, 0, 'L'},
                                          {"health-delay-ms", 1, 0, 'D'},
                                          {"fail-start", 1, 0, 'F'},
                                          {"crash-after", 1, 0, 'C'},
                                          {"fault", 1, 0, 'f'},
                                          {"seed", 1, 0, 's'},
                                          {"keepalive-ms", 1, 0, 'K'},
                                          {"quiet", 0, 0, 'q'},
                                          {"verbose", 0, 0, 'v'},
                                          {"help", 0, 0, 'h'},
                                          {"health-pid", 1, 0, 0x100},
                                          {"fail-first", 1, 0, 'X'},
                                          {"retry-after", 1, 0, 'Y'},
                                          {"tool-script", 1, 0, 0x101},
                                          {"replay-dir", 1, 0, 0x102},
                                          {"replay-match", 1, 0, 0x103},
                                          {"frames-per-chunk", 1, 0, 0x104},
                                          {"route", 1, 0, 0x105},
                                          {"no-route", 1, 0, 0x106},
                                          {"embedding-dims", 1, 0, 0x107},
                                          {"no-embeddings", 0, 0, 0x108},
                                          {"coalesce-writes", 0, 0, 0x109},
                                          {"prompt-cache", 1, 0, 0x10a},
                                          {"slot-prompt-similarity", 1, 0, 0x10b},
                                          {"prefill-rate", 1, 0, 0x10c},
                                          {"threads-http", 1, 0, 0x10d},
                                          {"metrics", 0, 0, 0x10e},
                                          {"step-growth", 1, 0, 0x10f},
                                          {"vllm-metrics", 0, 0, 0x110},
                                          {0, 0, 0, 0}};

static void usage(FILE *out) {
  fputs("usage: mirza-sim [options]\n"
        "A simulated local LLM daemon (MTPLX or llama-server dialect), for tests and\n"
        "demos.\n\n"
        "  --host ADDR             address to bind (default 127.0.0.1)\n"
        "  --port N                port to bind; 0 picks a free one (default 8766)\n"
        "  --port-file PATH        write the bound port there (atomically) once listening\n"
        "  --dialect mtplx|llama   protocol dialect to speak (default mtplx)\n"
        "  --model-id ID           model id reported everywhere (default mirza-sim)\n"
        "  --context-window N      context window in tokens (default 32768)\n"
        "  --api-key KEY           require 'Authorization: Bearer KEY' on every route\n"
        "  --parallel N            concurrent generations (slots); others queue\n"
        "                          (default 1)\n"
        "  --prompt-cache slots|endpoint  the prompt cache (default slots): slots is\n"
        "                          llama-server's, each slot holding one prompt; a\n"
        "                          request takes the idle slot sharing the longest\n"
        "                          prefix with it (else the least recently used, or\n"
        "                          the body's id_slot in the llama dialect), reuses\n"
        "                          that prefix, and its prompt is the slot's once its\n"
        "                          prefill is done (two requests starting together\n"
        "                          with a new preamble both miss); endpoint: every\n"
        "                          prompt is cached for the whole endpoint as soon as\n"
        "                          it arrives (an ideal cache, no server's)\n"
        "  --slot-prompt-similarity F  a slot is chosen for its prompt when it shares\n"
        "                          more than F of the request (0..1; 0: least recently\n"
        "                          used only; default 0.1)\n"
        "  --prefill-rate R        prompt tokens evaluated per second: prefill takes\n"
        "                          --ttft-ms plus the tokens not found cached / R;\n"
        "                          0 = cached or not, no cost (default 0)\n"
        "  --tok-rate R            tokens per second; 0 = as fast as possible\n"
        "                          (default 50)\n"
        "  --ttft-ms N             delay before the first token (default 200)\n"
        "  --heartbeat-ms N        MTPLX heartbeat frame after N ms of silence; 0 = none\n"
        "                          (default 10000)\n"
        "  --progress-every N      MTPLX mtplx_progress frame every N tokens; 0 = none\n"
        "                          (default 32)\n"
        "  --reasoning-tokens N    reasoning length when thinking (default 48)\n"
        "  --answer-tokens N       answer length (default 32)\n"
        "  --load-delay-ms N       sleep N ms before binding (connections refused\n"
        "                          meanwhile)\n"
        "  --health-delay-ms N     bind at once but answer 503 'Loading model' for N ms\n"
        "  --fail-start MSG        after the load delay print 'error: MSG' and exit 1\n"
        "  --crash-after N         the Nth chat request served (errors not counted)\n"
        "                          kills the process mid-stream (exit 3)\n"
        "  --fault SPEC            fault applied to every chat request (see below)\n"
        "  --seed N                seed of the text generator (default 0)\n"
        "  --keepalive-ms N        close idle keep-alive connections after N ms\n"
        "                          (default 5000, as llama-server's cpp-httplib)\n"
        "  --threads-http N        N threads serve the connections, each one connection\n"
        "                          for its whole life, keep-alive waits included; more\n"
        "                          connections wait unserved (llama dialect default:\n"
        "                          max(parallel + 4, cores - 1), as llama-server; 0, the\n"
        "                          MTPLX dialect's: a thread per connection)\n"
        "  --metrics               llama dialect: GET /metrics answers (Prometheus text:\n"
        "                          llamacpp:requests_processing, requests_deferred...);\n"
        "                          without it 501, as llama-server without --metrics\n"
        "  --vllm-metrics          GET /metrics answers vLLM's Prometheus text in either\n"
        "                          dialect: vllm:num_requests_running (generating or\n"
        "                          prefilling) and vllm:num_requests_waiting (queued for\n"
        "                          one of the --parallel slots, vLLM's --max-num-seqs)\n"
        "  --step-growth A[,B[,K]] the decode step grows with the batch, as on a GPU\n"
        "                          server: every generation's token takes\n"
        "                          base + A*m + B*m^2 ms, m = max(0, n - K), n the\n"
        "                          sequences generating at that moment (a sequence\n"
        "                          joining or leaving changes the others' pace at\n"
        "                          once), base = 1000 / --tok-rate. B = 0: the\n"
        "                          aggregate rate n / step rises and flattens toward\n"
        "                          1000 / A tokens/s; B > 0: it peaks, then falls.\n"
        "                          Presets: vllm (0.25: saturating toward 4,000\n"
        "                          tokens/s; 1,778 at 64 with the default 50 tok/s);\n"
        "                          h100 (0.6,0.0015,6 and --tok-rate 256 unless given:\n"
        "                          llama-server CUDA on an H100, 256 tokens/s at 1,\n"
        "                          ~1,590 at 16 (the peak), 1,460 at 64, 1,030 at 256).\n"
        "                          No effect with --tok-rate 0 or on a request that sets\n"
        "                          its own mirza_sim.tok_rate (it still counts in n)\n"
        "  --quiet                 log nothing to stderr but fatal startup errors\n"
        "  --verbose               log one line per request (method, path, status, time)\n"
        "  --help                  show this help\n"
        "  --health-pid N          report N as /health startup.pid (a foreign pid)\n"
        "  --fail-first N          the first N chat requests answer 429 (retry tests)\n"
        "  --retry-after S         Retry-After seconds sent with 429 and 503 (default 1)\n"
        "  --tool-script FILE      JSON tool calls to answer requests with tools: a list\n"
        "                          of rounds, each a list of {name, arguments, id?}\n"
        "                          (also per request: mirza_sim.tool_calls); then text\n"
        "                          echoing the tool results\n"
        "  --replay-dir DIR        answer from a directory recorded by mirza\n"
        "                          (MIRZA_RECORD): requests of a recorded method and\n"
        "                          path get the recorded responses, byte for byte\n"
        "  --replay-match order|body  which recording answers: the next in order\n"
        "                          (default) or the next with a byte-identical body\n"
        "  --frames-per-chunk N    with --tok-rate 0: one HTTP chunk every N token\n"
        "                          frames; 0 = up to 32 KiB per chunk (default 0)\n"
        "  --coalesce-writes       with --tok-rate 0: gather the chunks into writes of\n"
        "                          256 KiB (each still its own HTTP chunk): a source\n"
        "                          as fast as a pre-rendered file, for benchmarks\n"
        "  --route PATH=JSON       GET PATH answers 200 with that JSON body, to pose as\n"
        "                          another server (Ollama:\n"
        "                          --route '/api/version={\"version\":\"0.12.6\"}', vLLM:\n"
        "                          --route '/version={\"version\":\"0.11.0\"}');\n"
        "                          repeatable, up to 16\n"
        "  --no-route PATH         PATH answers 404 as if the server had no such route\n"
        "                          (--no-route /health: a server without a health\n"
        "                          check); repeatable, up to 16\n"
        "  --embedding-dims N      length of the vectors of POST /v1/embeddings\n"
        "                          (default 16)\n"
        "  --no-embeddings         POST /v1/embeddings answers as llama-server without\n"
        "                          --embeddings (501), or 404 in the MTPLX dialect\n\n"
        "Fault SPEC: comma-separated items, also per request with header\n"
        "'X-Mirza-Sim-Fault: SPEC' or body {\"mirza_sim\":{\"fault\":\"SPEC\"}}:\n"
        "  http=STATUS[:MSG]  http-text=STATUS  error-after=N  cut-after=N\n"
        "  stall-after=N[:MS]  malformed-after=N  utf8-split  loop[=TEXT]\n"
        "  oversized=BYTES  replay=PATH  crash-after=N\n"
        "  no-done            finish normally but never send data: [DONE]\n"
        "  bad-utf8-after=N   after N tokens a frame with invalid UTF-8 in its content\n"
        "  nul-after=N        after N tokens a frame whose content holds \\u0000\n"
        "  slow-head=MS       pause MS ms before each line of the response head\n"
        "  slow-head-bytes=MS send the response head one byte every MS ms\n"
        "  head-delay=MS      send nothing for MS ms (a queued request), then answer\n"
        "  redirect=STATUS[:LOCATION]  answer 301/302/303/307/308 with Location\n"
        "                     (default: the request path + /moved)\n"
        "  http-html=STATUS[:MSG]   nginx-style HTML error page with a <title>\n"
        "  http-plain=STATUS[:MSG]  plain-text error body\n"
        "  html-page[=TITLE]  answer 200 text/html: a web UI's page (a proxy's login\n"
        "                     page) with TITLE in its <title> (default: mirza-sim\n"
        "                     web UI), where the API was asked\n"
        "  retry-after=N|date+N     Retry-After of http faults: seconds, or an\n"
        "                     HTTP-date N seconds ahead\n"
        "  gzip               Content-Encoding: gzip on every answer\n"
        "  tool-name-split    stream each tool call's name in two fragments (real\n"
        "                     daemons send it whole in the first)\n"
        "  schema-ignore      answer a response_format with prose, no JSON\n"
        "  schema-break       answer it with JSON that misses a required member\n"
        "  schema-cut         cut the JSON answer in the middle, then finish normally\n"
        "A response_format (json_schema or json_object) is answered with JSON valid\n"
        "against its schema (see mirza-sim(1), STRUCTURED ANSWERS).\n"
        "Per-request body overrides: \"mirza_sim\":{\"text\",\"reasoning\",\"answer_tokens\",\n"
        "  \"reasoning_tokens\",\"tok_rate\",\"ttft_ms\",\"fault\",\"tool_calls\",\n"
        "  \"frames_per_chunk\",\"coalesce_writes\",\"prefill_rate\"}; llama dialect: \"id_slot\"\n",
        out);
}

static void die(const char *fmt, const char *arg) {
  fputs("error: ", stderr);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  exit(fmt[0] == 'p' ? 1 : 2); /* "port ... in use" is a runtime failure */
}

static long num(const char *name, const char *v, long lo, long hi) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || end == v || *end || n < lo || n > hi) die("invalid value for --%s", name);
  return n;
}

/* A number from 0 to hi. */
static double real(const char *name, const char *v, double hi) {
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end || !(x >= 0 && x <= hi)) die("invalid value for --%s", name);
  return x;
}

static void parse_args(server *s, int argc, char **argv) {
  sim_config *c = &s->cfg;
  *c = (sim_config){.host = "127.0.0.1",
                    .port = 8766,
                    .model_id = "mirza-sim",
                    .context_window = 32768,
                    .tok_rate = 50,
                    .ttft_ms = 200,
                    .heartbeat_ms = 10000,
                    .progress_every = 32,
                    .reasoning_tokens = 48,
                    .answer_tokens = 32,
                    .verbosity = 1,
                    .parallel = 1,
                    .slot_similarity = 0.1,
                    .keepalive_ms = 5000,
                    .threads_http = -1,
                    .retry_after = 1,
                    .embedding_dims = 16};
  faults_clear(&s->faults);
  const long BIG = 1L << 40;
  bool rate_given = false;
  double preset_rate = 0; /* the tok-rate a --step-growth preset implies */
  int o, idx = 0;
  while ((o = getopt_long(argc, argv, "h", long_opts, &idx)) != -1) {
    const char *nm = long_opts[idx].name;
    switch (o) {
    case 'H': c->host = optarg; break;
    case 'p': c->port = (int)num("port", optarg, 0, 65535); break;
    case 'P': c->port_file = optarg; break;
    case 'd':
      if (strcmp(optarg, "mtplx") && strcmp(optarg, "llama")) die("--dialect must be mtplx or llama, not '%s'", optarg);
      c->dialect = optarg[0] == 'l' ? DIALECT_LLAMA : DIALECT_MTPLX;
      break;
    case 'm': c->model_id = optarg; break;
    case 'c': c->context_window = num(nm, optarg, 1, BIG); break;
    case 'k': c->api_key = optarg; break;
    case 'j': c->parallel = num(nm, optarg, 1, 4096); break;
    case 'r':
      c->tok_rate = real(nm, optarg, 1e12);
      rate_given = true;
      break;
    case 0x10a:
      if (strcmp(optarg, "slots") && strcmp(optarg, "endpoint"))
        die("--prompt-cache must be slots or endpoint, not '%s'", optarg);
      c->prompt_cache = optarg[0] == 'e' ? CACHE_ENDPOINT : CACHE_SLOTS;
      break;
    case 0x10b: c->slot_similarity = real(nm, optarg, 1); break;
    case 0x10c: c->prefill_rate = real(nm, optarg, 1e12); break;
    case 0x10d: c->threads_http = num(nm, optarg, 0, 65536); break;
    case 0x10e: c->metrics = true; break;
    case 0x10f:
      if (step_parse(optarg, &c->curve, &preset_rate))
        die("--step-growth must be A[,B[,KNEE]] (ms, KNEE a count) or vllm or h100, not '%s'", optarg);
      c->step_growth = true;
      break;
    case 0x110: c->vllm_metrics = true; break;
    case 't': c->ttft_ms = num(nm, optarg, 0, BIG); break;
    case 'b': c->heartbeat_ms = num(nm, optarg, 0, BIG); break;
    case 'g': c->progress_every = num(nm, optarg, 0, BIG); break;
    case 'R': c->reasoning_tokens = num(nm, optarg, 0, BIG); break;
    case 'A': c->answer_tokens = num(nm, optarg, 0, BIG); break;
    case 'L': c->load_delay_ms = num(nm, optarg, 0, BIG); break;
    case 'D': c->health_delay_ms = num(nm, optarg, 0, BIG); break;
    case 'F': c->fail_start = optarg; break;
    case 'C': c->crash_after = num(nm, optarg, 0, BIG); break;
    case 'f': c->fault = optarg; break;
    case 's': c->seed = (uint64_t)num(nm, optarg, 0, 0x7fffffffffffffffL); break;
    case 'K': c->keepalive_ms = num(nm, optarg, 1, 86400000L); break;
    case 'q': c->verbosity = 0; break;
    case 'v': c->verbosity = 2; break;
    case 'X': c->fail_first = num(nm, optarg, 0, BIG); break;
    case 'Y': c->retry_after = num(nm, optarg, 0, 86400); break;
    case 'h': usage(stdout); exit(0);
    case 0x100: c->health_pid = num(nm, optarg, 1, 0x7fffffffL); break;
    case 0x101: c->tool_script = optarg; break;
    case 0x102: c->replay_dir = optarg; break;
    case 0x103:
      if (strcmp(optarg, "order") && strcmp(optarg, "body"))
        die("--replay-match must be order or body, not '%s'", optarg);
      c->replay_by_body = optarg[0] == 'b';
      break;
    case 0x104: c->frames_per_chunk = num(nm, optarg, 0, BIG); break;
    case 0x109: c->coalesce_writes = true; break;
    case 0x105:
      if (optarg[0] != '/' || !strchr(optarg, '='))
        die("--route must be PATH=JSON with PATH starting with /, not '%s'", optarg);
      if (c->n_routes == SIM_MAX_ROUTES) die("too many --route options (at most 16): '%s'", optarg);
      c->routes[c->n_routes++] = optarg;
      break;
    case 0x106:
      if (optarg[0] != '/') die("--no-route must be a path starting with /, not '%s'", optarg);
      if (c->n_no_routes == SIM_MAX_ROUTES) die("too many --no-route options (at most 16): '%s'", optarg);
      c->no_routes[c->n_no_routes++] = optarg;
      break;
    case 0x107: c->embedding_dims = num(nm, optarg, 1, 65536); break;
    case 0x108: c->no_embeddings = true; break;
    default: usage(stderr); exit(2);
    }
  }
  if (optind < argc) die("unexpected argument '%s'", argv[optind]);
  if (c->step_growth && preset_rate > 0 && !rate_given) c->tok_rate = preset_rate;
  c->curve.base_ms = c->tok_rate > 0 ? 1000.0 / c->tok_rate : 0;
  if (c->threads_http < 0) c->threads_http = c->dialect == DIALECT_LLAMA ? pool_default_threads(c->parallel) : 0;
  char err[300];
  if (c->fault && faults_parse(&s->faults, c->fault, err, sizeof err)) die("%s", err);
}

static void on_signal(int sig) {
  (void)sig;
  _exit(0);
}

static void install_signals(void) {
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR)
    ;
}

/* Bind and listen on host:port (IPv4 or IPv6 literal); exits on failure. */
static int bind_listener(server *s, char *url_host, size_t n) {
  struct sockaddr_storage ss = {0};
  socklen_t len;
  const char *h = s->cfg.host;
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  if (strcmp(h, "localhost") == 0) h = "127.0.0.1";
  if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)s->cfg.port);
    len = sizeof *a4;
    snprintf(url_host, n, "%s", h);
  } else if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)s->cfg.port);
    len = sizeof *a6;
    snprintf(url_host, n, "[%s]", h);
  } else {
    die("--host must be an IPv4 or IPv6 address, not '%s'", h);
  }
  int fd = mz_os_socket(ss.ss_family, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* A long accept queue (the kernel caps it at net.core.somaxconn): a
   * client opening 1,024 streams at once (--parallel 1024) connects faster
   * than connections are accepted, a thread each, and a SYN dropped from a
   * full queue is sent again only after a second. */
  if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) || listen(fd, SOMAXCONN > 4096 ? SOMAXCONN : 4096)) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    if (errno == EADDRINUSE) die("port %s is already in use", port);
    die("cannot listen: %s", strerror(errno));
  }
  getsockname(fd, (struct sockaddr *)&ss, &len);
  s->port = ntohs(ss.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
  return fd;
}

static void write_port_file(const server *s) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", s->cfg.port_file, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", s->port) < 0 || fclose(f) || rename(tmp, s->cfg.port_file))
    die("cannot write --port-file %s", s->cfg.port_file);
}

typedef struct conn_arg {
  server *srv;
  int fd;
} conn_arg;

static void *conn_thread(void *p) {
  conn_arg a = *(conn_arg *)p;
  free(p);
  serve_connection(a.srv, a.fd);
  return NULL;
}

/* Accept connections: to the HTTP pool when there is one (pool.c, the
 * llama dialect), else a thread each. */
static void accept_loop(server *s) {
  http_pool *pool = s->cfg.threads_http > 0 ? pool_new(s, s->cfg.threads_http) : NULL;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 1u << 20); /* cJSON recurses on nesting */
  for (;;) {
    int fd = accept(s->listen_fd, NULL, NULL);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) sleep_ms(10); /* wait for connections to close rather than spin */
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* frames leave when due */
    if (pool) {
      if (pool_submit(pool, fd)) close(fd);
      continue;
    }
    conn_arg *a = malloc(sizeof *a);
    pthread_t t;
    if (!a || (a->srv = s, a->fd = fd, pthread_create(&t, &attr, conn_thread, a))) {
      free(a);
      close(fd);
    }
  }
}

int main(int argc, char **argv) {
  static server srv;
  parse_args(&srv, argc, argv);
  mz_nofile_raise(); /* a thread and a socket per connection: 1,024 streams need more than 1,024 files */
  install_signals();
  state_init(&srv);
  if (srv.cfg.replay_dir && recorded_load(&srv, srv.cfg.replay_dir, srv.cfg.replay_by_body))
    die("cannot read the recording in --replay-dir %s", srv.cfg.replay_dir);
  srv.t_start = sim_now();
  snprintf(srv.launch_id, sizeof srv.launch_id, "sim-%d-%lx", (int)getpid(), (unsigned long)time(NULL));
  if (srv.cfg.load_delay_ms) sleep_ms(srv.cfg.load_delay_ms);
  if (srv.cfg.fail_start) {
    fprintf(stderr, "error: %s\n", srv.cfg.fail_start);
    return 1;
  }
  char url_host[128];
  srv.listen_fd = bind_listener(&srv, url_host, sizeof url_host);
  srv.t_start = sim_now(); /* --health-delay-ms counts from the bind */
  if (srv.cfg.port_file) write_port_file(&srv);
  printf("mirza-sim listening on http://%s:%d\n", url_host, srv.port);
  fflush(stdout);
  if (srv.cfg.verbosity >= 2)
    fprintf(stderr, "mirza-sim: %s dialect, model %s, %g tok/s, pid %d\n",
            srv.cfg.dialect == DIALECT_LLAMA ? "llama" : "mtplx", srv.cfg.model_id, srv.cfg.tok_rate, (int)getpid());
  accept_loop(&srv);
  return 0;
}
