/*
 * sim.h - shared declarations of mirza-sim, the simulated LLM daemon.
 *
 * mirza-sim is a small thread-per-connection HTTP/1.1 server that speaks the
 * MTPLX dialect (default) or llama-server's dialect of the OpenAI chat API,
 * streams deterministic text at a chosen rate and injects faults on demand,
 * so that mirza's client, supervisor and policies can be tested and
 * benchmarked offline. The files:
 *   main.c    options, startup behaviour, signals, accept loop
 *   pool.c    llama-server's HTTP thread pool (--threads-http)
 *   metrics.c GET /metrics (llama dialect, --metrics; vLLM's, --vllm-metrics)
 *   step.c    the decode step that grows with the batch (--step-growth)
 *   buf.c     growable byte buffer and JSON string escaping
 *   http.c    request parsing, plain and chunked responses, socket waits
 *   state.c   sessions, the slots and their prompt caches, the scheduler, the
 *             in-flight request registry
 *   slots.c   which slot a request takes, the endpoint-wide prompt store
 *   gen.c     deterministic words, sentences and the token sequences
 *   fault.c   parsing of fault specs
 *   serve.c   routes and chat request validation
 *   stream.c  the generation loop: frames, pacing, heartbeats, faults
 *   finish.c  usage, mtplx_stats, timings, final frames, non-streamed bodies
 *             (stream.h holds what stream.c, finish.c and replay.c share)
 *   replay.c  replaying a recorded .sse body over HTTP
 *   tools.c   tool calls from a script, streamed in fragments
 *   embed.c   POST /v1/embeddings: deterministic unit vectors
 *   schema.c  JSON answers that validate against a response_format schema
 *   recorded.c  serving a directory recorded by mirza (--replay-dir)
 * Nothing here is shared with the mirza engine: the simulator must stay an
 * independent implementation of the protocol so it can catch client bugs.
 */
#ifndef MIRZA_SIM_H
#define MIRZA_SIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_MAX_HEADER_BYTES (64u << 10)
#define SIM_MAX_BODY_BYTES (16u << 20)
#define SIM_MAX_HEADERS 100
#define SIM_FLUSH_BYTES (32u << 10)     /* batch size when the rate is unlimited */
#define SIM_COALESCE_BYTES (256u << 10) /* --coalesce-writes: bytes per write */
#define SIM_SLICE_MS 50                 /* longest blind sleep: cancel/disconnect latency */
#define SIM_LEAVES_MS 200               /* --step-growth: a batch that shrank is seen within this */
#define SIM_MAX_ROUTES 16               /* --route and --no-route, each */
#define SIM_STORE_MAX 256               /* --prompt-cache endpoint: prompts kept */
#define SIM_MAX_CHOICES 16              /* the most choices a request may ask for (n) */
#define SIM_MAX_TOP_LOGPROBS 20         /* top_logprobs, as OpenAI's limit */

enum sim_dialect { DIALECT_MTPLX, DIALECT_LLAMA };

/* --step-growth: the decode step of n generating sequences, in ms (step.c) */
typedef struct step_curve {
  double base_ms; /* 1000 / --tok-rate */
  double a, b;    /* ms per sequence past the knee, and per its square */
  long knee;      /* sequences that cost nothing more */
} step_curve;
enum sim_prompt_cache { CACHE_SLOTS, CACHE_ENDPOINT }; /* --prompt-cache */

typedef struct sim_config {
  const char *host;
  int port;
  const char *port_file;
  enum sim_dialect dialect;
  const char *model_id;
  long context_window;
  const char *api_key;
  double tok_rate; /* 0 = as fast as possible */
  long ttft_ms, heartbeat_ms, progress_every;
  long reasoning_tokens, answer_tokens;
  long load_delay_ms, health_delay_ms;
  const char *fail_start;
  long crash_after; /* Nth chat request crashes the process; 0 = never */
  const char *fault;
  uint64_t seed;
  int verbosity; /* 0 quiet, 1 default, 2 verbose */
  long parallel;
  enum sim_prompt_cache prompt_cache; /* slots (llama-server's) or endpoint */
  double slot_similarity;             /* --slot-prompt-similarity (0.1) */
  double prefill_rate;                /* --prefill-rate: prompt tokens/s; 0 = free */
  long keepalive_ms;
  long threads_http;       /* --threads-http: the llama dialect's HTTP pool (pool.c); 0: a thread per connection */
  bool metrics;            /* --metrics: GET /metrics answers (llama dialect), else 501 */
  bool vllm_metrics;       /* --vllm-metrics: GET /metrics answers vLLM's names, either dialect */
  bool step_growth;        /* --step-growth: the step grows with the batch (step.c) */
  step_curve curve;        /* its curve (base_ms set once --tok-rate is known) */
  long health_pid;         /* pid reported by /health; 0 = our own */
  long fail_first;         /* the first N chat requests answer 429 */
  long retry_after;        /* Retry-After seconds on 429/503 (default 1) */
  const char *tool_script; /* --tool-script: tool calls per round (tools.c) */
  const char *replay_dir;  /* --replay-dir: serve a mirza recording (recorded.c) */
  bool replay_by_body;     /* --replay-match body (default: order) */
  long frames_per_chunk;   /* tok_rate 0: flush every N token frames; 0 = by size */
  bool coalesce_writes;    /* tok_rate 0: chunks gathered into large writes */
  /* --route PATH=BODY: GET PATH answers 200 with BODY (JSON); --no-route PATH:
   * PATH answers 404 as if the server had no such route (serve.c) */
  const char *routes[SIM_MAX_ROUTES], *no_routes[SIM_MAX_ROUTES];
  int n_routes, n_no_routes;
  long embedding_dims; /* --embedding-dims (embed.c) */
  bool no_embeddings;  /* --no-embeddings: as llama-server without --embeddings */
} sim_config;

/* ---- buf.c ---------------------------------------------------------- */
typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

void sbuf_reserve(sbuf *b, size_t extra);
void sbuf_add(sbuf *b, const void *s, size_t n);
void sbuf_adds(sbuf *b, const char *s);
void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbuf_json_esc(sbuf *b, const char *s, size_t n);
void sbuf_json_str(sbuf *b, const char *s); /* quoted, or null for NULL */
void sbuf_free(sbuf *b);
char *sim_strndup(const char *s, size_t n);
char *sim_slurp(const char *path, size_t max, size_t *n); /* NULL: cannot open */
size_t sim_event_len(const char *p, size_t n);            /* SSE event + blank line */
double sim_now(void);                                     /* monotonic seconds */
double sim_round(double x, int digits);

/* ---- fault.c -------------------------------------------------------- */
enum { LOOP_NONE, LOOP_LINE, LOOP_PHRASE };

typedef struct sim_faults {
  int http_status; /* 0 = none */
  bool http_text;  /* plain text body instead of JSON */
  char http_msg[256];
  long error_after, cut_after, stall_after, malformed_after, crash_after; /* -1 = off */
  long stall_ms;                                                          /* -1 = forever */
  long oversized;                                                         /* bytes of the data line; 0 = off */
  bool utf8_split;
  int loop;
  char replay[1024];
  /* faults of the response head and body (mirza issue 8) */
  bool no_done;         /* normal end without data: [DONE] */
  long bad_utf8_after;  /* frame with invalid UTF-8 after N tokens; -1 = off */
  long nul_after;       /* frame with "\u0000" in its content after N; -1 = off */
  long slow_head_ms;    /* pause before each line of the response head */
  long head_bytes_ms;   /* slow-head-bytes: pause before each byte of it */
  long head_delay_ms;   /* no response byte for this long (queued) */
  int redirect;         /* 301/302/303/307/308; 0 = none */
  char location[256];   /* redirect target (default: the same path + "/moved") */
  int http_body;        /* http=/http-text=: HTTP_BODY_* below */
  bool gzip;            /* Content-Encoding: gzip on every response */
  char retry_after[64]; /* Retry-After value of error answers ("" = default) */
  bool tool_name_split; /* a tool call's name in two fragments (tools.c) */
  bool schema_ignore;   /* response_format: prose, no JSON (schema.c) */
  bool schema_break;    /* response_format: valid JSON violating the schema */
  bool schema_cut;      /* response_format: the JSON cut in the middle */
} sim_faults;

enum { HTTP_BODY_JSON, HTTP_BODY_TEXT_HTML, HTTP_BODY_HTML_PAGE, HTTP_BODY_PLAIN, HTTP_BODY_WEB_PAGE };

void faults_clear(sim_faults *f);
int faults_parse(sim_faults *f, const char *spec, char *err, size_t errlen);

/* ---- gen.c ---------------------------------------------------------- */
typedef struct sim_gen {
  uint64_t rng;
  long remaining; /* words left in the text */
  int words_left; /* words left in the current sentence */
  int cls;        /* word class of the previous word */
  bool has_verb, fr, reasoning, cap_next;
  char end_sep; /* separator after the very last word (0 = none) */
  char tok[96];
} sim_gen;

/* A token source: an optional exact prefix text, then generated words or an
 * exact text, then (loop faults) one phrase repeated forever. */
typedef struct tokseq {
  const char *pre;
  size_t pre_len, pre_pos;
  const char *text; /* exact text; NULL = generated */
  size_t text_len, text_pos;
  sim_gen gen;
  const char *loop; /* repeated after the main part; NULL = none */
  size_t loop_len, loop_pos;
} tokseq;

uint64_t gen_hash(uint64_t seed, const char *s, size_t n);
void gen_init(sim_gen *g, uint64_t seed, long words, bool reasoning, char end_sep);
size_t text_next(const char *s, size_t len, size_t *pos, const char **tok);
size_t tokseq_next(tokseq *t, const char **tok);
extern const char SIM_UTF8_PREFIX[];
extern const char SIM_LOOP_LINE[];
extern const char SIM_LOOP_PHRASE[];

/* ---- http.c --------------------------------------------------------- */
struct cJSON;

typedef struct http_header {
  const char *name, *value;
} http_header;

typedef struct http_request {
  const char *method, *target;
  char path[512]; /* target without the query string */
  int minor;      /* HTTP/1.minor */
  http_header h[SIM_MAX_HEADERS];
  int nh;
  char *body;
  size_t body_len;
  bool keep_alive;
} http_request;

struct server;

typedef struct conn {
  int fd;
  struct server *srv;
  char *buf; /* read buffer: the current request, then pipelined bytes */
  size_t len, cap, used;
  bool must_close;   /* the connection cannot carry another request */
  long slow_head_ms; /* faults of the current response: slow head, gzip */
  long head_bytes_ms;
  bool gzip;
  uint32_t gz_crc, gz_size;
  /* --coalesce-writes: the chunks of a response (framing included) are
   * gathered here and written SIM_COALESCE_BYTES at a time, before any
   * wait and at the end, instead of one write per chunk: a source as fast
   * as a pre-rendered file, each frame still its own HTTP chunk. */
  bool coalesce;
  sbuf wire;
} conn;

int http_read_request(conn *c, http_request *r);
const char *http_get_header(const http_request *r, const char *name);
const char *http_reason(int status);
int http_write_all(conn *c, const void *p, size_t n);
int http_send(conn *c, int status, const char *ctype, const char *extra, const char *body, size_t n);
int http_begin_chunked(conn *c, int status, const char *ctype, const char *extra);
int http_chunk(conn *c, const char *p, size_t n);
int http_end_chunked(conn *c);
int http_flush(conn *c);                        /* what --coalesce-writes gathered, now */
void http_faults(conn *c, const sim_faults *f); /* slow head, gzip: per response */
bool conn_gone(conn *c);
int conn_wait_until(conn *c, double deadline, atomic_bool *cancel);

/* ---- state.c -------------------------------------------------------- */
typedef struct inflight {
  char id[200];
  atomic_bool cancel;
  struct inflight *next;
} inflight;

typedef struct session {
  char *id;
  char *prompt;
  size_t prompt_len;
  bool busy;
  struct session *next;
} session;

typedef struct waiter {
  struct waiter *next;
  int pin; /* the slot named by id_slot; -1: any */
} waiter;

/* One of the --parallel generation slots and the prompt it holds (its KV
 * cache, as llama-server keeps one per slot): while a request prefills,
 * the prefix it shares with the slot's previous prompt; from its first
 * token on, its whole prompt. */
typedef struct slot {
  char *prompt;
  size_t prompt_len;
  bool busy;
  double last_used; /* when it was last released (llama-server's t_last_used) */
} slot;

/* A prompt of the endpoint-wide store (--prompt-cache endpoint). */
typedef struct cached_prompt {
  char *p;
  size_t n;
  double used;
} cached_prompt;

/* The batch's step clock (step.c): n sequences generating since t, when
 * the batch had made `steps` steps. */
typedef struct step_clock {
  long n;
  double t, steps;
} step_clock;

typedef struct server {
  sim_config cfg;
  sim_faults faults; /* --fault, applied to every chat request */
  int listen_fd;
  int port;
  double t_start;
  char launch_id[64];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long busy_slots;
  slot *slots; /* cfg.parallel of them */
  waiter *queue_head, *queue_tail;
  long pinned_waiting;  /* queued requests that named their slot */
  cached_prompt *store; /* --prompt-cache endpoint: SIM_STORE_MAX of them */
  int store_n;
  session *sessions;
  inflight *inflight;
  atomic_long chat_count;
  atomic_long fail_count; /* chat requests seen, for --fail-first */
  atomic_long id_count;
  struct recorded_set *recorded; /* --replay-dir; NULL: none */
  step_clock decode;             /* --step-growth: the batch's steps (under mu) */
  atomic_long decode_leaves;     /* how many times sequences left it */
} server;

void state_init(server *s);
int session_begin(server *s, const char *id, bool exclusive, const char *prompt, size_t n, long *cached_bytes);
void session_end(server *s, const char *id);
long sessions_clear(server *s, const char *id);
void inflight_add(server *s, inflight *f);
void inflight_remove(server *s, inflight *f);
bool inflight_cancel(server *s, const char *id);
typedef int (*sched_tick)(void *arg);
int sched_acquire(server *s, sched_tick tick, void *arg, const char *prompt, size_t n, int pin, int *slot_index,
                  long *cached_bytes);
void sched_prefilled(server *s, int slot_index, const char *prompt, size_t n);
void sched_release(server *s, int slot_index);
void sched_counts(server *s, long *processing, long *deferred); /* /metrics */
/* --step-growth: weight sequences join the batch (returns the clock's
 * steps then), leave it; when the clock reaches target at the batch's
 * present size (<= now: it has). */
double decode_join(server *s, long weight);
void decode_leave(server *s, long weight);
double decode_due(server *s, double target);
long slots_clear(server *s);

/* ---- metrics.c ------------------------------------------------------ */
int route_metrics(conn *c); /* GET /metrics: llama dialect, or --vllm-metrics */

/* ---- step.c -------------------------------------------------------- */
double step_ms(const step_curve *c, long n);
void step_advance(step_clock *k, const step_curve *c, double now);
double step_due(const step_clock *k, const step_curve *c, double target);
/* "A[,B[,KNEE]]" or a preset's name (h100, vllm) into c's a, b and knee,
 * and the tok-rate the preset implies (0: none): 0, or -1 when malformed. */
int step_parse(const char *spec, step_curve *c, double *tok_rate);

/* ---- pool.c --------------------------------------------------------- */
typedef struct http_pool http_pool;
long pool_default_threads(long parallel); /* llama-server's max(parallel + 4, cores - 1) */
http_pool *pool_new(server *s, long max_threads);
int pool_submit(http_pool *p, int fd); /* -1: not queued (out of memory) */

/* ---- slots.c -------------------------------------------------------- */
size_t sim_common_prefix(const char *a, size_t an, const char *b, size_t bn);
/* The idle slot a request of prompt takes (llama-server's
 * get_available_slot); -1 when every slot is busy. */
int slot_pick(const slot *slots, int n, const char *prompt, size_t len, double similarity);
/* The stored prompt sharing the longest prefix with prompt (-1: none
 * shares any) and that prefix; the least recently used entry. */
int store_best(const cached_prompt *store, int n, const char *prompt, size_t len, size_t *common);
int store_victim(const cached_prompt *store, int n);

/* ---- serve.c -------------------------------------------------------- */
void serve_connection(server *s, int fd);
int send_error(conn *c, int status, const char *msg, const char *type, const char *code);
int serve_bad_json(conn *c);
int serve_faults(conn *c, const http_request *r, const struct cJSON *ctl, sim_faults *f);

/* ---- schema.c ------------------------------------------------------- */
/* The JSON answer to a response_format (json_schema or json_object), owned
 * by the caller; NULL when rf asks for none. brk: schema-break. */
char *schema_answer(const struct cJSON *rf, uint64_t seed, bool brk, size_t *len);
size_t schema_cut(const char *text, size_t n); /* where schema-cut ends it */

/* ---- embed.c -------------------------------------------------------- */
int route_embeddings(conn *c, const http_request *r);

/* ---- stream.c ------------------------------------------------------- */
/* A choice past the first (n > 1): its own text, streamed interleaved
 * with choice 0's, one token of each per round (stream.c). */
typedef struct sim_choice {
  tokseq rseq, aseq;
  bool reasoning;     /* still in its reasoning */
  const char *finish; /* its finish reason once over; NULL while it goes on */
  long ntok;
  sbuf content, reasoning_text; /* non-streamed: its message */
} sim_choice;

typedef struct job {
  server *srv;
  conn *c;
  bool stream, include_usage, thinking, client_controls;
  bool completion; /* POST /v1/completions: text frames, no messages */
  char id[200];
  long created;
  char session[256];
  const char *session_source;
  bool has_session, session_exclusive;
  long prompt_tokens, cached_tokens;
  long cap;          /* most completion tokens allowed */
  tokseq rseq, aseq; /* reasoning and answer sources */
  bool has_reasoning;
  double rate;
  long ttft_ms;
  long frames_per_chunk; /* see sim_config */
  bool coalesce_writes;  /* see sim_config */
  sim_faults f;
  inflight fl;
  /* runtime */
  sbuf out, pre, post, content, reasoning;
  long frames, ntok, nreason, nanswer;
  double t0, t_slot, t_first, t_last, t_hb;
  const char *split_p; /* second half of a token cut by utf8-split */
  size_t split_n;
  char *prompt; /* the messages as JSON (what the caches compare) */
  size_t prompt_len;
  int slot_index;      /* the slot held (when slot) */
  int id_slot;         /* the slot the body named (llama's id_slot); -1: any */
  double prefill_rate; /* prompt tokens evaluated per second; 0: no cost */
  bool slot, gone, cancelled, role_sent, oversized_done;
  long batched; /* --step-growth: the sequences it adds to the batch; 0: none */
  bool clocked; /* paced by the batch's step clock (its rate is --tok-rate's) */
  double step0; /* the clock's steps a step after it joined: token k is due at step0 + k */
  bool fired_error, fired_cut, fired_stall, fired_malformed, fired_crash;
  bool fired_bad_utf8, fired_nul;
  struct sim_tools *tools; /* tool calls or the echo of results; NULL: none */
  char *json_text;         /* the answer to a response_format (schema.c); NULL: none */
  /* n > 1 and logprobs (OpenAI's and vLLM's stream shape): ntok, frames,
   * the cap and the faults are choice 0's; the others' tokens count in
   * ntok_more (usage), and once choice 0 is over they go on paced by
   * rest (rounds after its end) */
  int n;            /* choices (n); 1: more is NULL */
  sim_choice *more; /* choices 1..n-1 */
  long ntok_more, rest;
  bool logprobs;    /* logprobs: true: each token frame carries its logprobs */
  int top_logprobs; /* alternatives per token (top_logprobs) */
} job;

int job_run(job *j);
void job_free(job *j);
int replay_run(job *j);

/* ---- tools.c -------------------------------------------------------- */
void tools_plan(job *j, const struct cJSON *body); /* after the text plan */
const char *tools_emit(job *j);                    /* at the end of the text: the calls, if any */
void tools_free(job *j);
struct cJSON *tools_message_calls(const job *j); /* non-streamed message.tool_calls; NULL: text */

/* ---- recorded.c ----------------------------------------------------- */
int recorded_load(server *s, const char *dir, bool by_body); /* 0, or -1 */
int recorded_route(conn *c, const http_request *r);          /* status, or -1: not recorded */

#endif
