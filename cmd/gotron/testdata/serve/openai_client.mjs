// Drives `gotron serve` with the official openai npm client and prints a
// JSON report for serve_test.go to check (TestServeOpenAINodeClient).
// Environment: BASE_URL (http://127.0.0.1:PORT/v1), MODEL, PROMPT,
// MAX_TOKENS, CHAT (a user message).
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: "unused", maxRetries: 0 });
const model = process.env.MODEL;
const maxTokens = Number(process.env.MAX_TOKENS);
const report = { errors: {} };

const models = await client.models.list();
report.models = models.data.map((m) => m.id);

// Completions: greedy, then the same streamed.
const c = await client.completions.create({ model, prompt: process.env.PROMPT, max_tokens: maxTokens, temperature: 0 });
report.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage, object: c.object };
let streamed = "", chunks = 0, finish = null;
for await (const chunk of await client.completions.create({ model, prompt: process.env.PROMPT, max_tokens: maxTokens, temperature: 0, stream: true })) {
  chunks++;
  streamed += chunk.choices[0]?.text ?? "";
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
report.completionStream = { text: streamed, chunks, finish };

// Chat: greedy, then streamed.
const messages = [{ role: "user", content: process.env.CHAT }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: maxTokens, temperature: 0 });
report.chat = { text: chat.choices[0].message.content, role: chat.choices[0].message.role, finish: chat.choices[0].finish_reason, usage: chat.usage, object: chat.object };
let chatStreamed = "", roles = [];
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
  const d = chunk.choices[0]?.delta;
  if (d?.role) roles.push(d.role);
  chatStreamed += d?.content ?? "";
  if (chunk.usage) report.chatStreamUsage = chunk.usage;
}
report.chatStream = { text: chatStreamed, roles };

// Fields gotron does not implement but that only concern bookkeeping are
// accepted (and ignored), as vLLM does.
const stored = await client.chat.completions.create({ model, messages, max_tokens: maxTokens, temperature: 0, store: false, metadata: { run: "serve_test" } });
report.storeMetadata = { text: stored.choices[0].message.content, finish: stored.choices[0].finish_reason };

// response_format json_object: the text is a JSON object, or (cut by
// max_tokens) the beginning of one.
const js = await client.chat.completions.create({ model, messages, max_tokens: 48, temperature: 2, seed: 3, n: 3, response_format: { type: "json_object" } });
report.jsonObject = js.choices.map((c) => {
  let parsed = false;
  try { parsed = typeof JSON.parse(c.message.content) === "object"; } catch {}
  return { text: c.message.content, finish: c.finish_reason, parsed };
});

// Errors arrive as the client's typed API errors.
async function expectError(name, f) {
  try {
    await f();
    report.errors[name] = { thrown: false };
  } catch (e) {
    report.errors[name] = { thrown: true, apiError: e instanceof OpenAI.APIError, status: e.status, class: e.constructor.name, message: e.message };
  }
}
await expectError("unknownModel", () => client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 2 }));
await expectError("zeroMaxTokens", () => client.completions.create({ model, prompt: process.env.PROMPT, max_tokens: 0 }));
await expectError("contextExceeded", () => client.chat.completions.create({ model, messages, max_tokens: 100000 }));
await expectError("badTemperature", () => client.chat.completions.create({ model, messages, temperature: 5 }));
await expectError("hugeMaxTokens", () => client.completions.create({ model, prompt: process.env.PROMPT, max_tokens: Number.MAX_SAFE_INTEGER }));
await expectError("jsonSchema", () => client.chat.completions.create({ model, messages, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } } }));

console.log(JSON.stringify(report));
