// tests/js/openai_sdk.mjs: the official `openai` npm package against
// `cumulo serve` (URL and model from argv): models.list, chat non-streaming
// and streaming, completions non-streaming and streaming, usage, and errors
// surfacing as the SDK's typed exceptions. At temperature 0 the streamed text
// equals the non-streamed one and equals `cumulo run` (its text in argv[4]).
// Prints "N passed, N failed". Runs on Node.js 18 (Debian 12's) and newer:
// openai 5 uses the runtime's own fetch, no polyfill (openai 4's node-fetch
// died with "Premature close" on the first stream under Debian's Node 18).
import OpenAI from "openai";

const [url, model, apiKey, runText] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + "/v1", apiKey: apiKey || "none", maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error("FAIL: " + name + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
}

try {
  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  check("models.list has the model", ids.includes(model), ids);

  const P = "Once upon a time";
  const c1 = await client.completions.create({ model, prompt: P, max_tokens: 40, temperature: 0 });
  check("completions text == cumulo run", c1.choices[0].text === runText, [c1.choices[0].text, runText]);
  check("completions usage", c1.usage.completion_tokens === 40 && c1.usage.prompt_tokens > 0, c1.usage);
  let s1 = "", fin1 = null;
  const cs = await client.completions.create({ model, prompt: P, max_tokens: 40, temperature: 0, stream: true });
  for await (const ch of cs) { s1 += ch.choices[0]?.text ?? ""; if (ch.choices[0]?.finish_reason) fin1 = ch.choices[0].finish_reason; }
  check("streamed completions == non-streamed", s1 === c1.choices[0].text, [s1, c1.choices[0].text]);
  check("streamed finish_reason length", fin1 === "length", fin1);

  const messages = [{ role: "system", content: "You tell short stories." }, { role: "user", content: "A story about a dog." }];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0 });
  const text = r.choices[0].message.content;
  check("chat non-streaming", typeof text === "string" && text.length > 0 && r.choices[0].message.role === "assistant", r);
  let s2 = "", usage = null, role = null, fin = null;
  const st = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0, stream: true,
                                                    stream_options: { include_usage: true } });
  for await (const ch of st) {
    if (ch.usage) usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) s2 += c.delta.content;
    if (c.finish_reason) fin = c.finish_reason;
  }
  check("chat streamed == non-streamed", s2 === text, [s2, text]);
  check("chat stream role + finish", role === "assistant" && fin === "length", [role, fin]);
  check("chat stream usage", usage && usage.completion_tokens === 32 && usage.total_tokens === usage.prompt_tokens + 32, usage);

  // The SDK's own stream helper (accumulates the message itself): chat.completions.stream
  // since openai 5, beta.chat.completions.stream before. Its absence is a failure, not a skip.
  const streamFn = client.chat.completions.stream ? client.chat.completions
    : client.beta?.chat?.completions?.stream ? client.beta.chat.completions : null;
  check("SDK has a chat stream helper", streamFn !== null, Object.keys(client.chat.completions));
  if (streamFn) {
    const final = await streamFn.stream({ model, messages, max_tokens: 32, temperature: 0 }).finalChatCompletion();
    check("SDK stream helper final message", final.choices[0].message.content === text, final.choices[0].message.content);
  }

  try {
    await client.chat.completions.create({ model: "no-such-model", messages });
    check("unknown model throws", false);
  } catch (e) {
    check("unknown model -> NotFoundError", e instanceof OpenAI.NotFoundError && e.status === 404, [e.status, e.message]);
  }
  try {
    await client.chat.completions.create({ model, messages, n: 3 });
    check("n=3 throws", false);
  } catch (e) {
    check("n=3 -> BadRequestError naming n", e instanceof OpenAI.BadRequestError && e.param === "n", [e.status, e.param]);
  }
  try {
    // a schema keyword the grammar cannot enforce (tests/js/openai_tools.mjs has the supported ones)
    await client.chat.completions.create({ model, messages, response_format: { type: "json_schema",
      json_schema: { name: "x", schema: { type: "string", pattern: "^a+$" } } } });
    check("unsupported schema keyword throws", false);
  } catch (e) {
    check("unsupported schema keyword refused by name", e.status === 400 && e.param === "response_format" && /'pattern'/.test(e.message), e.message);
  }
  if (apiKey) {
    const bad = new OpenAI({ baseURL: url + "/v1", apiKey: "wrong", maxRetries: 0 });
    try { await bad.models.list(); check("bad key throws", false); }
    catch (e) { check("bad key -> AuthenticationError", e instanceof OpenAI.AuthenticationError, e.status); }
  }
} catch (e) {
  check("no unexpected exception", false, String(e && e.stack || e));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
