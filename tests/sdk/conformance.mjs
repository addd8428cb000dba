// conformance.mjs - the official OpenAI SDK (npm `openai`, v6) against
// mirza-sim, in one dialect: a client nobody here wrote must work against
// the simulator as it does against a real daemon (issue 21).
//
// Run by tests/sdk/run.sh, which installs the SDK and starts the sims:
//   MIRZA_SDK_DIR        directory holding node_modules/openai
//   MIRZA_SDK_DIALECT    mtplx | llama
//   MIRZA_SDK_BASE       base URL (".../v1") of a sim started with --api-key,
//                        --tool-script tests/sdk/tools.json, --model-id sdk-model
//   MIRZA_SDK_KEY        that API key
//   MIRZA_SDK_RETRY_BASE base URL of a sim started with --fail-first 1
//
// Each check prints "ok - NAME" or "not ok - NAME: why"; the last line is
// "N passed, N failed"; the exit status is 1 when any failed. Every client
// has maxRetries 0 (but the retry check) and a 15 s timeout, and the whole
// run a 90 s watchdog: a broken sim fails the test, it never hangs it.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`conformance.mjs: ${k} is not set (run it through tests/sdk/run.sh)`);
  return v;
};
const require = createRequire(path.join(env('MIRZA_SDK_DIR'), 'package.json'));
const { default: OpenAI } = require('openai');
const DIALECT = env('MIRZA_SDK_DIALECT');
const BASE = env('MIRZA_SDK_BASE');
const KEY = env('MIRZA_SDK_KEY');
const MODEL = 'sdk-model';
const LLAMA = DIALECT === 'llama';

const watchdog = setTimeout(() => {
  console.log('not ok - watchdog: the run took more than 90 s');
  process.exit(1);
}, 90_000);

// MTPLX honours sampling/thinking fields only with this header; harmless
// on llama-server, so always sent (as mirza does).
const HEADERS = { 'X-MTPLX-Allow-Client-Controls': '1' };
const client = (opts = {}) =>
  new OpenAI({ baseURL: BASE, apiKey: KEY, maxRetries: 0, timeout: 15_000, defaultHeaders: HEADERS, ...opts });
const sdk = client();
// Per-request faults of the simulator (man mirza-sim, FAULTS).
const fault = (spec) => ({ headers: { 'X-Mirza-Sim-Fault': spec } });

// Thinking on or off, the way each dialect is asked (llama-server thinks
// by default with a reasoning model; MTPLX does not).
const thinking = (on) => (LLAMA ? { chat_template_kwargs: { enable_thinking: on } } : { enable_thinking: on });
const ask = (prompt, extra = {}) => ({
  model: MODEL,
  messages: [{ role: 'user', content: prompt }],
  ...thinking(false),
  ...extra,
});

let passed = 0,
  failed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok - ${DIALECT}: ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${DIALECT}: ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

// Await fn, which must reject with an instance of cls; returns the error.
async function rejects(cls, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e && e.constructor && e.constructor.name}: ${e}`);
    return e;
  }
  assert.fail(`expected ${cls.name}, nothing was thrown`);
}

function checkUsage(u) {
  assert.ok(u, 'no usage');
  assert.ok(u.prompt_tokens > 0 && u.completion_tokens > 0, `usage ${JSON.stringify(u)}`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
}

// Collect a raw stream: text, reasoning, the order of the two, the chunks.
async function collect(stream) {
  const out = { text: '', reasoning: '', order: [], chunks: [], usage: null, finish: null };
  for await (const chunk of stream) {
    out.chunks.push(chunk);
    if (chunk.usage) out.usage = chunk.usage;
    for (const ch of chunk.choices) {
      const d = ch.delta || {};
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      if (d.content) out.text += d.content;
      const kind = d.reasoning_content ? 'reasoning' : d.content ? 'content' : null;
      if (kind && out.order[out.order.length - 1] !== kind) out.order.push(kind);
      if (ch.finish_reason) out.finish = ch.finish_reason;
    }
  }
  return out;
}

// ---- models ---------------------------------------------------------------

await check('models.list() lists the served model', async () => {
  const ids = [];
  for await (const m of sdk.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [MODEL]);
});

// ---- chat: non-streamed and streamed ---------------------------------------

let plainText = null;
await check('a non-streamed answer: content, finish_reason, usage', async () => {
  const r = await sdk.chat.completions.create(ask('Bonjour !'));
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, MODEL);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].message.reasoning_content, undefined, 'reasoning without thinking');
  checkUsage(r.usage);
  plainText = r.choices[0].message.content;
});

await check('a streamed answer with include_usage: the same text, one id, usage at the end', async () => {
  const s = await sdk.chat.completions.create(ask('Bonjour !', { stream: true, stream_options: { include_usage: true } }));
  const out = await collect(s);
  assert.equal(out.text, plainText);
  assert.equal(out.finish, 'stop');
  assert.deepEqual(out.order, ['content']);
  checkUsage(out.usage);
  assert.equal(new Set(out.chunks.map((c) => c.id)).size, 1, 'one id for every chunk');
  assert.ok(out.chunks.every((c) => c.object === 'chat.completion.chunk'));
  assert.ok(out.chunks[out.chunks.length - 1].usage, 'usage rides on the last chunk');
});

await check('the stream helper: finalChatCompletion() has the text and usage', async () => {
  const s = sdk.chat.completions.stream(ask('Bonjour !', { stream_options: { include_usage: true } }));
  const deltas = [];
  s.on('content', (d) => deltas.push(d));
  const c = await s.finalChatCompletion();
  assert.equal(c.choices[0].message.content, plainText);
  assert.equal(deltas.join(''), plainText);
  assert.equal(c.choices[0].finish_reason, 'stop');
  checkUsage(c.usage);
});

await check('gzip bodies (fault gzip): the same answer, streamed and not', async () => {
  const r = await sdk.chat.completions.create(ask('Bonjour !'), fault('gzip'));
  assert.equal(r.choices[0].message.content, plainText);
  const out = await collect(await sdk.chat.completions.create(ask('Bonjour !', { stream: true }), fault('gzip')));
  assert.equal(out.text, plainText);
});

await check('max_tokens: finish_reason "length" and that many tokens', async () => {
  const r = await sdk.chat.completions.create(ask('Bonjour !', { max_tokens: 3 }));
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 3);
});

await check('abort() in the middle of a stream frees the slot: the next request is served at once', async () => {
  const slow = ask('Bonjour !', { stream: true, mirza_sim: { tok_rate: 20, answer_tokens: 400 } });
  const s = await sdk.chat.completions.create(slow);
  let n = 0;
  for await (const chunk of s) {
    if (chunk.choices[0]?.delta?.content && ++n === 2) s.controller.abort();
  }
  // chunks that came in the same read as the second are still handed over
  // (a loaded machine reads several at once): the abort ends the stream
  // there, long before its 400 tokens
  assert.ok(n >= 2 && n < 20, `${n} chunks after the abort at the second`);
  const t0 = Date.now();
  const r = await client({ timeout: 5_000 }).chat.completions.create(ask('Bonjour !'));
  assert.equal(r.choices[0].message.content, plainText);
  assert.ok(Date.now() - t0 < 3_000, `the next request waited ${Date.now() - t0} ms for the slot`);
});

// ---- reasoning -------------------------------------------------------------

await check('reasoning_content: streamed before the answer, and in a non-streamed message', async () => {
  const s = await sdk.chat.completions.create(ask('Pourquoi ?', { ...thinking(true), stream: true }));
  const out = await collect(s);
  assert.deepEqual(out.order, ['reasoning', 'content']);
  const r = await sdk.chat.completions.create(ask('Pourquoi ?', thinking(true)));
  assert.equal(r.choices[0].message.reasoning_content, out.reasoning);
  assert.equal(r.choices[0].message.content, out.text);
  assert.ok(r.usage.completion_tokens > 0);
});

// ---- tools: the SDK's runner, two rounds (tests/sdk/tools.json) -----------

const TOOL_ANSWER =
  'tool results: [call_w1] {"city":"Lyon","temp_c":4}; [call_t1] {"tz":"Europe/Paris","time":"12:00"}; ' +
  '[call_w2] {"city":"Saint-Étienne","temp_c":13}';

for (const stream of [true, false]) {
  await check(`runTools (${stream ? 'streamed' : 'non-streamed'}): two rounds of calls, then the answer`, async () => {
    const called = [];
    const tool = (name, props, fn) => ({
      type: 'function',
      function: {
        name,
        description: name,
        parameters: { type: 'object', properties: props, required: Object.keys(props) },
        parse: JSON.parse,
        function: (args) => {
          called.push(`${name}(${Object.values(args).join(',')})`);
          return fn(args);
        },
      },
    });
    const runner = sdk.chat.completions.runTools({
      ...ask('Quel temps ?'),
      stream,
      tools: [
        tool('get_weather', { city: { type: 'string' } }, (a) => ({ city: a.city, temp_c: a.city.length })),
        tool('get_time', { tz: { type: 'string' } }, (a) => ({ tz: a.tz, time: '12:00' })),
      ],
    });
    const answer = await runner.finalContent();
    assert.deepEqual(called, ['get_weather(Lyon)', 'get_time(Europe/Paris)', 'get_weather(Saint-Étienne)']);
    assert.equal(answer, TOOL_ANSWER);
    const calls = runner.messages.filter((m) => m.role === 'assistant' && m.tool_calls).map((m) => m.tool_calls);
    assert.deepEqual(
      calls.map((round) => round.map((c) => `${c.id} ${c.type} ${c.function.name}`)),
      [['call_w1 function get_weather'], ['call_t1 function get_time', 'call_w2 function get_weather']],
    );
  });
}

// ---- HTTP errors: each class the SDK maps ----------------------------------

await check('400 -> BadRequestError with the server message', async () => {
  const e = await rejects(OpenAI.BadRequestError, () => sdk.chat.completions.create(ask('x'), fault('http=400:bad input')));
  assert.equal(e.status, 400);
  assert.match(e.message, /^400 bad input/);
  const e2 = await rejects(OpenAI.BadRequestError, () => sdk.chat.completions.create({ model: MODEL, messages: [] }));
  assert.match(e2.message, /messages/);
  const streamed = ask('x', { stream: true });
  await rejects(OpenAI.BadRequestError, () => sdk.chat.completions.create(streamed, fault('http=400:bad input')));
});

await check('401 -> AuthenticationError for a wrong API key (--api-key)', async () => {
  const e = await rejects(OpenAI.AuthenticationError, () => client({ apiKey: 'wrong' }).chat.completions.create(ask('x')));
  assert.equal(e.status, 401);
  await rejects(OpenAI.AuthenticationError, () => client({ apiKey: 'wrong' }).models.list());
});

await check('404 -> NotFoundError for an unknown route', async () => {
  const e = await rejects(OpenAI.NotFoundError, () => sdk.models.retrieve('no-such-model'));
  assert.equal(e.status, 404);
});

await check('429 -> RateLimitError with Retry-After', async () => {
  const e = await rejects(OpenAI.RateLimitError, () => sdk.chat.completions.create(ask('x'), fault('http=429:slow down')));
  assert.equal(e.headers.get('retry-after'), '1');
  assert.match(e.message, /slow down/);
});

await check('429 then 200: the SDK waits Retry-After and retries (--fail-first 1)', async () => {
  let requests = 0;
  const counting = (url, init) => {
    requests++;
    return fetch(url, init);
  };
  const c = client({ baseURL: env('MIRZA_SDK_RETRY_BASE'), maxRetries: 2, fetch: counting });
  const t0 = Date.now();
  const r = await c.chat.completions.create(ask('Bonjour !'));
  const ms = Date.now() - t0;
  assert.equal(r.choices[0].message.content, plainText);
  assert.equal(requests, 2);
  assert.ok(ms >= 900, `retried after ${ms} ms, not the 1 s of Retry-After`);
});

if (!LLAMA) {
  await check('409 -> ConflictError for a second request on a busy MTPLX session', async () => {
    const session = { headers: { 'X-MTPLX-Session-Id': 'sdk-busy' } };
    const slow = ask('Bonjour !', { stream: true, mirza_sim: { tok_rate: 20, answer_tokens: 400 } });
    const s = await sdk.chat.completions.create(slow, session);
    try {
      const e = await rejects(OpenAI.ConflictError, () => sdk.chat.completions.create(ask('x'), session));
      assert.equal(e.status, 409);
    } finally {
      s.controller.abort();
    }
  });
}

await check('500 -> InternalServerError', async () => {
  const e = await rejects(OpenAI.InternalServerError, () => sdk.chat.completions.create(ask('x'), fault('http=500')));
  assert.equal(e.status, 500);
});

await check('an error in the middle of a stream -> APIError after the text before it', async () => {
  const s = await sdk.chat.completions.create(ask('Bonjour !', { stream: true }), fault('error-after=3'));
  let text = '';
  const e = await rejects(OpenAI.APIError, async () => {
    for await (const chunk of s) text += chunk.choices[0]?.delta?.content ?? '';
  });
  assert.match(e.message, /simulated failure after 3 tokens/);
  assert.ok(text.length > 0 && plainText.startsWith(text), `text before the error: ${JSON.stringify(text)}`);
});

// ---- embeddings and structured answers (issue 18) --------------------------

await check('embeddings.create: a unit vector per input, in order; base64 (the default) = float', async () => {
  const r = await sdk.embeddings.create({ model: MODEL, input: ['bonjour', 'au revoir', 'bonjour'] });
  assert.equal(r.object, 'list');
  assert.deepEqual(
    r.data.map((d) => [d.object, d.index, d.embedding.length]),
    [0, 1, 2].map((i) => ['embedding', i, 16]),
  );
  for (const d of r.data) {
    const norm = Math.sqrt(d.embedding.reduce((a, x) => a + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
  }
  assert.deepEqual(r.data[0].embedding, r.data[2].embedding, 'the same text, the same vector');
  assert.notDeepEqual(r.data[0].embedding, r.data[1].embedding);
  assert.ok(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens, JSON.stringify(r.usage));
  // the SDK asks for base64 unless told and decodes the float32 bytes itself
  const f = await sdk.embeddings.create({ model: MODEL, input: 'bonjour', encoding_format: 'float' });
  assert.deepEqual(f.data[0].embedding.map(Math.fround), r.data[0].embedding);
  const short = await sdk.embeddings.create({ model: MODEL, input: 'bonjour', dimensions: 4 });
  assert.equal(short.data[0].embedding.length, 4);
});

const WEATHER = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 2 },
    temp_c: { type: 'integer', minimum: -30, maximum: 45 },
    tags: { type: 'array', items: { type: 'string' }, maxItems: 2 },
  },
  required: ['city', 'temp_c', 'tags'],
  additionalProperties: false,
};
const asJSON = { response_format: { type: 'json_schema', json_schema: { name: 'weather', schema: WEATHER, strict: true } } };

await check('response_format json_schema: the content parses in shape, streamed the same; parse() decodes it', async () => {
  const r = await sdk.chat.completions.create(ask('Météo à Lyon ?', asJSON));
  const content = r.choices[0].message.content;
  const v = JSON.parse(content);
  assert.deepEqual(Object.keys(v), ['city', 'temp_c', 'tags']);
  assert.ok(typeof v.city === 'string' && v.city.length >= 2, content);
  assert.ok(Number.isInteger(v.temp_c) && v.temp_c >= -30 && v.temp_c <= 45, content);
  assert.ok(Array.isArray(v.tags) && v.tags.length === 2 && v.tags.every((t) => typeof t === 'string'), content);
  const out = await collect(await sdk.chat.completions.create(ask('Météo à Lyon ?', { ...asJSON, stream: true })));
  assert.equal(out.text, content);
  assert.ok(out.chunks.length > 5, `${out.chunks.length} chunks: not streamed in small deltas`);
  const p = await sdk.chat.completions.parse(ask('Météo à Lyon ?', asJSON));
  assert.deepEqual(p.choices[0].message.parsed, v);
});

clearTimeout(watchdog);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
