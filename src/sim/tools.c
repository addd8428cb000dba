/*
 * tools.c - tool calls: a request that carries `tools` can be answered with
 * calls instead of text, from a script, and then with text once the tool
 * results are in the messages.
 *
 * The script is a list of rounds, each a list of calls {name, arguments
 * (a JSON text or any JSON value), id (optional)}; a single list of calls
 * is one round. It comes from the body's mirza_sim.tool_calls, else from
 * --tool-script FILE. The round played is the number of assistant messages
 * with tool_calls since the last user message: a client that sends the
 * results back gets the next round, and once the rounds are over, text
 * echoing every tool result since the last user message:
 *   "tool results: [ID] CONTENT; [ID] CONTENT"
 * so a test can check what its tools answered.
 *
 * Calls are streamed as the real daemons (and OpenAI) send them: each
 * call's first fragment carries its id, type and whole name with empty
 * arguments, then the arguments come in pieces of 1, 4, 2, 7, 3 ... bytes
 * (on UTF-8 character boundaries), one call after another by index; then
 * finish_reason "tool_calls". Clients that keep the last name they see
 * (the OpenAI Node SDK) rely on the name being whole. The tool-name-split
 * fault cuts it on purpose, as before issue 21: the id, type and first
 * half of the name, then the rest of the name alone, to test clients that
 * join pieces. A non-streamed request gets the same calls in
 * message.tool_calls (content null), in the dialect's member order.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "stream.h"

struct sim_tools {
  cJSON *calls; /* this round's calls (a copy) */
  char *echo;   /* the answer text echoing the tool results */
};

static const char *str_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static cJSON *read_script(const char *path) {
  size_t n;
  char *text = sim_slurp(path, 0, &n);
  cJSON *s = text ? cJSON_ParseWithLength(text, n) : NULL;
  free(text);
  return s;
}

/* Round r of a script (a list of rounds, or one list of calls = 1 round). */
static const cJSON *script_round(const cJSON *script, int r) {
  if (!cJSON_IsArray(script) || cJSON_GetArraySize(script) == 0) return NULL;
  if (!cJSON_IsArray(cJSON_GetArrayItem(script, 0))) return r == 0 ? script : NULL;
  return cJSON_GetArrayItem(script, r);
}

/* Index of the last user message (-1 when none). */
static int last_user(const cJSON *messages) {
  int i = 0, last = -1;
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    const char *role = str_of(m, "role");
    if (role && strcmp(role, "user") == 0) last = i;
    i++;
  }
  return last;
}

/* Rounds of calls already answered since the last user message, and the
 * echo of the tool results (NULL when there are none). */
static int rounds_done(const cJSON *messages, char **echo) {
  int i = 0, from = last_user(messages), rounds = 0;
  sbuf b = {0};
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    const char *role = str_of(m, "role");
    if (i++ <= from || !role) continue;
    if (strcmp(role, "assistant") == 0 && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) > 0)
      rounds++;
    if (strcmp(role, "tool") != 0) continue;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    char *text = cJSON_IsString(c) ? NULL : cJSON_PrintUnformatted(c);
    const char *id = str_of(m, "tool_call_id");
    const char *t = cJSON_IsString(c) ? c->valuestring : text ? text : "";
    sbuf_printf(&b, "%s[%s] %s", b.len ? "; " : "tool results: ", id ? id : "?", t);
    free(text);
  }
  *echo = b.p;
  return rounds;
}

void tools_plan(job *j, const cJSON *body) {
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
  if (cJSON_GetArraySize(tools) == 0) return;
  const cJSON *ctl = cJSON_GetObjectItemCaseSensitive(body, "mirza_sim");
  cJSON *file = NULL;
  const cJSON *script = cJSON_GetObjectItemCaseSensitive(ctl, "tool_calls");
  if (!script) script = file = read_script(j->srv->cfg.tool_script);
  char *echo = NULL;
  int r = rounds_done(cJSON_GetObjectItemCaseSensitive(body, "messages"), &echo);
  const cJSON *calls = script_round(script, r);
  if (cJSON_GetArraySize(calls) > 0 || echo) {
    j->tools = calloc(1, sizeof *j->tools);
    if (!j->tools) abort();
  }
  if (cJSON_GetArraySize(calls) > 0) {
    j->tools->calls = cJSON_Duplicate(calls, 1);
    j->aseq.text = "", j->aseq.text_len = 0; /* no answer text: calls */
    j->aseq.pre_len = 0;
    free(echo);
  } else if (echo) {
    j->tools->echo = echo;
    j->aseq.text = echo, j->aseq.text_len = strlen(echo);
  }
  cJSON_Delete(file);
}

/* One fragment frame: {"tool_calls":[{"index":i, ...members}]}. Counted
 * as a token either way, so a non-streamed answer has the same usage. */
static void fragment(job *j, int index, const char *members) {
  if (j->stream) {
    frame_open(j, NULL);
    sbuf_printf(&j->out, "{\"tool_calls\":[{\"index\":%d%s}]}", index, members);
    frame_close(j, NULL, "");
  }
  j->ntok++;
  j->frames++;
  j->nanswer++;
}

/* The arguments as text: a string as is, any other value as JSON. */
static char *args_text(const cJSON *call) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(call, "arguments");
  if (cJSON_IsString(a)) return sim_strndup(a->valuestring, strlen(a->valuestring));
  return a ? cJSON_PrintUnformatted(a) : sim_strndup("{}", 2);
}

/* The call's id: the script's, else one made from the index and request. */
static const char *call_id(const job *j, int index, const cJSON *call, char *buf, size_t n) {
  const char *id = str_of(call, "id");
  if (id) return id;
  snprintf(buf, n, "call_%d_%s", index, j->id);
  return buf;
}

/* The first fragment: id, type and the name (whole, or its first half
 * under tool-name-split, the second half following in a fragment of its
 * own), arguments empty. */
static void head_fragments(job *j, int index, const char *id, const char *name) {
  size_t n = strlen(name), first = j->f.tool_name_split ? n / 2 : n;
  while (first > 0 && first < n && ((unsigned char)name[first] & 0xC0) == 0x80) first--; /* whole characters */
  sbuf m = {0};
  sbuf_adds(&m, ",\"id\":");
  sbuf_json_str(&m, id);
  sbuf_adds(&m, ",\"type\":\"function\",\"function\":{\"name\":\"");
  sbuf_json_esc(&m, name, first);
  sbuf_adds(&m, "\",\"arguments\":\"\"}");
  fragment(j, index, m.p);
  if (first < n) {
    m.len = 0;
    sbuf_adds(&m, ",\"function\":{\"name\":\"");
    sbuf_json_esc(&m, name + first, n - first);
    sbuf_adds(&m, "\"}");
    fragment(j, index, m.p);
  }
  sbuf_free(&m);
}

static void stream_call(job *j, int index, const cJSON *call) {
  static const size_t pieces[] = {1, 4, 2, 7, 3};
  const char *name = str_of(call, "name");
  char gen_id[240];
  head_fragments(j, index, call_id(j, index, call, gen_id, sizeof gen_id), name ? name : "");
  sbuf m = {0};
  char *args = args_text(call);
  for (size_t off = 0, k = 0, n = strlen(args); off < n; k++) {
    size_t len = pieces[k % 5];
    if (len > n - off) len = n - off;
    while (off + len < n && ((unsigned char)args[off + len] & 0xC0) == 0x80) len++; /* never inside a UTF-8 character */
    m.len = 0;
    sbuf_adds(&m, ",\"function\":{\"arguments\":\"");
    sbuf_json_esc(&m, args + off, len);
    sbuf_adds(&m, "\"}");
    fragment(j, index, m.p);
    off += len;
  }
  free(args);
  sbuf_free(&m);
}

const char *tools_emit(job *j) {
  if (!j->tools || !j->tools->calls) return "stop";
  if (j->stream && !j->role_sent) role_frame(j);
  int i = 0;
  const cJSON *call;
  cJSON_ArrayForEach(call, j->tools->calls) {
    stream_call(j, i++, call);
    job_flush(j);
    if (j->gone) return NULL;
  }
  return "tool_calls";
}

/* The calls of a non-streamed answer, as message.tool_calls: OpenAI's
 * member order (id, type, function) for MTPLX, llama-server's (type,
 * function, id) for llama. NULL when the answer is text. */
cJSON *tools_message_calls(const job *j) {
  if (!j->tools || !j->tools->calls) return NULL;
  cJSON *out = cJSON_CreateArray();
  bool llama = j->srv->cfg.dialect == DIALECT_LLAMA;
  int i = 0;
  const cJSON *call;
  cJSON_ArrayForEach(call, j->tools->calls) {
    char gen_id[240], *args = args_text(call);
    const char *id = call_id(j, i++, call, gen_id, sizeof gen_id), *name = str_of(call, "name");
    cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    if (!llama) cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(fn, "name", name ? name : "");
    cJSON_AddStringToObject(fn, "arguments", args);
    cJSON_AddItemToObject(c, "function", fn);
    if (llama) cJSON_AddStringToObject(c, "id", id);
    cJSON_AddItemToArray(out, c);
    free(args);
  }
  return out;
}

void tools_free(job *j) {
  if (!j->tools) return;
  cJSON_Delete(j->tools->calls);
  free(j->tools->echo);
  free(j->tools);
  j->tools = NULL;
}
