// tests/js/openai_tools.mjs: tool calls and structured output through the
// official `openai` SDK against `cumulo serve` (argv: URL, model id, family
// label for messages). The model (stories260K) knows nothing about tools or
// JSON: whatever it writes under tool_choice "required"/named or a
// json_schema response_format must still come back valid, which only the
// grammar masks can guarantee. Also: streamed == non-streamed at
// temperature 0, the SDK's stream helper accumulating tool_call deltas, a
// conversation with tool results, and the 400s. Prints "N passed, N failed".
import OpenAI from "openai";

const [url, model, fam] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + "/v1", apiKey: "none", maxRetries: 0, timeout: 120000 });
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL [${fam}]: ${name}` + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
}

const person = { type: "object", additionalProperties: false, required: ["name", "age"],
  properties: { name: { type: "string", maxLength: 12 }, age: { type: "integer" },
                mood: { enum: ["happy", "sad"] }, tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 2 } } };
function personOk(o) {
  if (typeof o !== "object" || o === null || Array.isArray(o)) return false;
  const keys = Object.keys(o);
  if (!keys.every((k) => ["name", "age", "mood", "tags"].includes(k))) return false;
  if (typeof o.name !== "string" || [...o.name].length > 12 || !Number.isInteger(o.age)) return false;
  if ("mood" in o && !["happy", "sad"].includes(o.mood)) return false;
  if ("tags" in o && !(Array.isArray(o.tags) && o.tags.length <= 2 && o.tags.every((t) => typeof t === "string" && [...t].length <= 6))) return false;
  return true;
}
const weather = { type: "function", function: { name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 10 }, unit: { enum: ["c", "f"] } }, required: ["city"] } } };
const time = { type: "function", function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string", maxLength: 8 } }, required: ["zone"] } } };
function weatherArgsOk(s) {
  try { const a = JSON.parse(s); return typeof a.city === "string" && [...a.city].length <= 10 && (!("unit" in a) || ["c", "f"].includes(a.unit)) && Object.keys(a).every((k) => k === "city" || k === "unit"); }
  catch { return false; }
}

try {
  const messages = [{ role: "user", content: "Tell me about a person." }];
  const rf = { type: "json_schema", json_schema: { name: "person", strict: true, schema: person } };
  // json_schema, several seeds: every reply parses and validates
  let valid = 0, texts = [];
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({ model, messages, response_format: rf, temperature: 1, seed, max_tokens: 400 });
    const c = r.choices[0];
    let o = null;
    try { o = JSON.parse(c.message.content); } catch {}
    if (c.finish_reason === "stop" && personOk(o)) valid++;
    else check("json_schema reply valid", false, c);
    texts.push(c.message.content);
  }
  check("json_schema: 4 of 4 replies valid", valid === 4, texts);
  const g = await client.chat.completions.create({ model, messages, response_format: rf, temperature: 0, max_tokens: 400 });
  let s = "";
  const st = await client.chat.completions.create({ model, messages, response_format: rf, temperature: 0, max_tokens: 400, stream: true });
  for await (const ch of st) s += ch.choices[0]?.delta?.content ?? "";
  check("json_schema streamed == non-streamed", s === g.choices[0].message.content, [s, g.choices[0].message.content]);
  const jo = await client.chat.completions.create({ model, messages, response_format: { type: "json_object" }, temperature: 0.9, seed: 5, max_tokens: 400 });
  let joOk = false;
  try { const o = JSON.parse(jo.choices[0].message.content); joOk = typeof o === "object" && o !== null && !Array.isArray(o); } catch {}
  check("json_object reply is a JSON object (or cut by length)", joOk || jo.choices[0].finish_reason === "length", jo.choices[0]);

  // forced tool call
  const q = [{ role: "user", content: "What is the weather in Paris?" }];
  const tc = await client.chat.completions.create({ model, messages: q, tools: [weather, time], tool_choice: "required", temperature: 0, max_tokens: 300 });
  const m = tc.choices[0].message;
  check("required: finish_reason tool_calls", tc.choices[0].finish_reason === "tool_calls", tc.choices[0]);
  check("required: one call of a listed tool", m.tool_calls?.length === 1 && ["get_weather", "get_time"].includes(m.tool_calls[0].function.name) &&
        m.tool_calls[0].type === "function" && m.tool_calls[0].id.startsWith("call_") && m.content === null, m);
  const named = await client.chat.completions.create({ model, messages: q, tools: [weather, time], temperature: 0.8, seed: 7, max_tokens: 300,
                                                      tool_choice: { type: "function", function: { name: "get_weather" } } });
  const nc = named.choices[0].message.tool_calls?.[0];
  check("named: get_weather with valid arguments", nc?.function.name === "get_weather" && weatherArgsOk(nc.function.arguments), named.choices[0].message);
  for (const seed of [11, 12, 13]) {
    const r = await client.chat.completions.create({ model, messages: q, tools: [weather], tool_choice: "required", temperature: 1, seed, max_tokens: 300 });
    const c = r.choices[0].message.tool_calls?.[0];
    check(`required seed ${seed}: arguments valid under the schema`, c && weatherArgsOk(c.function.arguments), r.choices[0].message);
  }
  // streamed tool call, accumulated by the SDK's helper
  const fin = await client.chat.completions.stream({ model, messages: q, tools: [weather, time], tool_choice: "required", temperature: 0, max_tokens: 300 }).finalChatCompletion();
  const fm = fin.choices[0].message;
  check("stream helper: tool_calls == non-streamed", fm.tool_calls?.length === 1 && fm.tool_calls[0].function.name === m.tool_calls[0].function.name &&
        fm.tool_calls[0].function.arguments === m.tool_calls[0].function.arguments && fin.choices[0].finish_reason === "tool_calls", fm);
  // a conversation that carries a call and its result; auto may answer either way
  const conv = [...q, { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
                { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21}" }];
  const a = await client.chat.completions.create({ model, messages: conv, tools: [weather], temperature: 0, max_tokens: 30 });
  const am = a.choices[0].message;
  check("tool result turn accepted (auto)", a.choices[0].finish_reason !== undefined && (typeof am.content === "string" || am.tool_calls?.length > 0), a.choices[0]);
  const none = await client.chat.completions.create({ model, messages: q, tools: [weather], tool_choice: "none", temperature: 0, max_tokens: 8 });
  check("tool_choice none: plain content", typeof none.choices[0].message.content === "string" && !none.choices[0].message.tool_calls, none.choices[0]);

  async function bad(name, req, param, re) {
    try { await client.chat.completions.create({ model, messages: q, max_tokens: 4, ...req }); check(name + " throws", false); }
    catch (e) { check(name, e instanceof OpenAI.BadRequestError && e.param === param && re.test(e.message), [e.status, e.param, e.message]); }
  }
  await bad("unknown named tool", { tools: [weather], tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice", /nope/);
  await bad("unsupported keyword in parameters", { tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { d: { type: "string", format: "date" } } } } }], tool_choice: "required" }, "tools", /'format'/);
  await bad("bad tool name", { tools: [{ type: "function", function: { name: "a b" } }] }, "tools", /tools\[0\]/);
  await bad("response_format + forced tool", { tools: [weather], tool_choice: "required", response_format: { type: "json_object" } }, "response_format", /cannot be combined/);
} catch (e) {
  check("no unexpected exception", false, String(e && e.stack || e));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
