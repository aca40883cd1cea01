// tests/js/anthropic_sdk.mjs: Anthropic's official TypeScript SDK
// (@anthropic-ai/sdk) against `cumulo serve`'s POST /v1/messages. argv: URL,
// API key, and the text /v1/chat/completions gave for the same conversation
// at temperature 0 with 32 tokens (the same prompt through the same
// template, so the Messages reply must equal it). Checks: non-streaming
// shape and text; system as a string and as text blocks; streaming, with
// the exact event order; the SDK's stream helper; stop_sequences;
// prefill; errors as the SDK's typed exceptions with Anthropic error
// bodies. Prints "N passed, N failed". Pinned SDK 0.60.0: no dependencies,
// the runtime's own fetch (as openai 5 in openai_sdk.mjs).
import Anthropic from "@anthropic-ai/sdk";

const [url, apiKey, chatText] = process.argv.slice(2);
const client = new Anthropic({ baseURL: url, apiKey: apiKey || "none", maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error("FAIL: " + name + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
}
const model = "claude-sonnet-4-5"; // any name: the server answers with its own model

try {
  const system = "You tell stories.";
  const messages = [{ role: "user", content: "Tell me about a cat." }];
  const base = { model, max_tokens: 32, temperature: 0, system, messages };

  const r = await client.messages.create(base);
  const text = r.content[0]?.text;
  check("message shape", r.type === "message" && r.role === "assistant" && r.id.startsWith("msg_") &&
        r.content.length === 1 && r.content[0].type === "text", r);
  check("text == /v1/chat/completions text", text === chatText, [text, chatText]);
  check("stop_reason max_tokens", r.stop_reason === "max_tokens" && r.stop_sequence === null, [r.stop_reason, r.stop_sequence]);
  check("usage", r.usage.output_tokens === 32 && r.usage.input_tokens > 0, r.usage);

  const rb = await client.messages.create({ ...base, system: [{ type: "text", text: "You tell " }, { type: "text", text: "stories." }] });
  check("system as text blocks == system string", rb.content[0].text === text, rb.content[0].text);
  const rc = await client.messages.create({ ...base, messages: [{ role: "user", content: [{ type: "text", text: "Tell me about a cat." }] }] });
  check("content as text blocks == string", rc.content[0].text === text, rc.content[0].text);

  // Raw stream: the exact event sequence.
  const stream = await client.messages.create({ ...base, stream: true });
  const types = [];
  let s = "", start = null, delta = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "message_start") start = ev.message;
    if (ev.type === "content_block_delta") {
      if (ev.delta.type === "text_delta" && ev.index === 0) s += ev.delta.text;
    }
    if (ev.type === "message_delta") delta = ev;
  }
  const seq = types.filter((t, i) => !(t === "content_block_delta" && types[i - 1] === "content_block_delta")).join(",");
  // The SDK drops "ping" events itself (core/streaming.js); tests/sh/http_anthropic.sh sees them raw.
  check("event sequence", seq === "message_start,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop", types);
  check("streamed text == non-streamed", s === text, [s, text]);
  check("message_start", start && start.role === "assistant" && start.content.length === 0 && start.usage.input_tokens === r.usage.input_tokens, start);
  check("message_delta stop_reason + usage", delta && delta.delta.stop_reason === "max_tokens" && delta.usage.output_tokens === 32, delta);

  // The SDK's helper accumulates the message itself.
  let ontext = "";
  const h = client.messages.stream(base).on("text", (t) => { ontext += t; });
  const fin = await h.finalMessage();
  check("stream helper finalMessage", fin.content[0].text === text && fin.stop_reason === "max_tokens" && fin.usage.output_tokens === 32, fin);
  check("stream helper text events", ontext === text, ontext);

  // stop_sequences: a word from the middle of the reply ends it there.
  const words = text.split(" ").filter((w) => /^[a-z]{3,}$/.test(w));
  const stopWord = words.find((w) => text.indexOf(" " + w) > 0);
  check("a stop word found in the reply", !!stopWord, text);
  if (stopWord) {
    const ss = " " + stopWord;
    const want = text.slice(0, text.indexOf(ss));
    const rs = await client.messages.create({ ...base, stop_sequences: ["zzzqqq", ss] });
    check("stop_sequence reply", rs.stop_reason === "stop_sequence" && rs.stop_sequence === ss && rs.content[0].text === want,
          [rs.stop_reason, rs.stop_sequence, rs.content[0].text, want]);
    const hs = await client.messages.stream({ ...base, stop_sequences: [ss] }).finalMessage();
    check("stop_sequence streamed", hs.stop_reason === "stop_sequence" && hs.stop_sequence === ss && hs.content[0].text === want, hs);
  }

  // Prefill: a last assistant message is continued.
  const head = text.slice(0, text.indexOf(" ", 8)); // at a word end, so the prefix tokenizes as in the reply
  const rp = await client.messages.create({ ...base, messages: [...messages, { role: "assistant", content: head }] });
  check("prefill continues the assistant turn", text.startsWith(head + rp.content[0].text.slice(0, 5)), [head, rp.content[0].text]);

  // Sampling knobs are accepted; seeded randomness is not an Anthropic parameter, so only the shape is checked.
  const rk = await client.messages.create({ ...base, temperature: 0.7, top_p: 0.9, top_k: 20, max_tokens: 8 });
  check("top_p/top_k accepted", rk.usage.output_tokens >= 1 && rk.usage.output_tokens <= 8, rk.usage);

  // Tool use: tool_choice any / tool forces a call whose input is valid under input_schema
  // (stories260K knows nothing of tools: the grammar does it), as a tool_use block.
  const weather = { name: "get_weather", description: "Weather in a city",
    input_schema: { type: "object", properties: { city: { type: "string", maxLength: 10 }, unit: { enum: ["c", "f"] } }, required: ["city"] } };
  const inputOk = (x) => x && typeof x.city === "string" && [...x.city].length <= 10 && (!("unit" in x) || ["c", "f"].includes(x.unit)) &&
    Object.keys(x).every((k) => k === "city" || k === "unit");
  const tq = { model, max_tokens: 300, temperature: 0, tools: [weather], messages: [{ role: "user", content: "Weather in Paris?" }] };
  const tu = await client.messages.create({ ...tq, tool_choice: { type: "any" } });
  const ub = tu.content.find((b) => b.type === "tool_use");
  check("tool_choice any: stop_reason tool_use", tu.stop_reason === "tool_use", tu);
  check("tool_use block: id, name, input valid", ub && ub.id.startsWith("toolu_") && ub.name === "get_weather" && inputOk(ub.input), tu.content);
  for (const seed of [1, 2]) { // Anthropic has no seed: vary the temperature path instead
    const r = await client.messages.create({ ...tq, temperature: 1, tool_choice: { type: "tool", name: "get_weather" } });
    const b = r.content.find((x) => x.type === "tool_use");
    check(`tool_choice tool (${seed}): valid input`, b && b.name === "get_weather" && inputOk(b.input), r.content);
  }
  const ts = await client.messages.stream({ ...tq, tool_choice: { type: "any" } }).finalMessage();
  const sb = ts.content.find((b) => b.type === "tool_use");
  check("streamed tool_use == non-streamed", sb && JSON.stringify(sb.input) === JSON.stringify(ub?.input) && ts.stop_reason === "tool_use", ts.content);
  // the result goes back as a tool_result block; the model may answer in text or call again
  const back = await client.messages.create({ ...tq, max_tokens: 16, messages: [...tq.messages,
    { role: "assistant", content: [{ type: "tool_use", id: ub?.id ?? "toolu_1", name: "get_weather", input: ub?.input ?? { city: "Paris" } }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: ub?.id ?? "toolu_1", content: "21 C, sunny" }] }] });
  check("tool_result turn accepted", back.type === "message" && back.content.length >= 1, back);
  const tn = await client.messages.create({ ...tq, max_tokens: 8, tool_choice: { type: "none" } });
  check("tool_choice none: text only", tn.content.every((b) => b.type === "text") && tn.stop_reason !== "tool_use", tn);

  async function expectError(name, req, cls, status, re, opts) {
    try {
      await client.messages.create(req, opts);
      check(name + " throws", false);
    } catch (e) {
      check(name, e instanceof cls && e.status === status && e.error?.type === "error" && re.test(e.error?.error?.message ?? ""),
            [e.constructor.name, e.status, e.error]);
    }
  }
  await expectError("missing max_tokens", { model, messages }, Anthropic.BadRequestError, 400, /max_tokens/);
  await expectError("temperature > 1", { ...base, temperature: 1.5 }, Anthropic.BadRequestError, 400, /temperature/);
  await expectError("image block refused by name", { ...base, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }] }] },
                    Anthropic.BadRequestError, 400, /messages\.0\.content\.0\.type.*image/);
  await expectError("system role in messages", { ...base, messages: [{ role: "system", content: "x" }] }, Anthropic.BadRequestError, 400, /messages\.0\.role/);
  try {
    const bad = new Anthropic({ baseURL: url, apiKey: "wrong", maxRetries: 0 });
    await bad.messages.create(base);
    check("wrong key throws", false);
  } catch (e) {
    check("wrong key -> AuthenticationError", e instanceof Anthropic.AuthenticationError && e.error?.error?.type === "authentication_error", [e.status, e.error]);
  }
} catch (e) {
  check("no unexpected exception", false, String(e && e.stack || e));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
