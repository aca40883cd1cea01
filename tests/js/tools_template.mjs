// tools_template.mjs URL TEMPLATE.jinja EOS: cumulo's prompt for conversations
// with tools, a tool call and a tool result (POST /apply-template) against the
// official chat template rendered by @huggingface/jinja (transformers'
// conventions: a call's arguments are an object, the template gets the
// request's tools as given; bos_token "" since cumulo's prompt leaves BOS to
// the tokenizer). Prints "N passed, M failed"; a difference is shown where it
// starts.
import {readFileSync} from "node:fs";
import {Template} from "@huggingface/jinja";

const [url, file, eos] = process.argv.slice(2);
const tools = [
  {type: "function", function: {name: "get_weather", description: "Get the weather in a city, in °C",
    parameters: {type: "object", properties: {city: {type: "string", description: "City name, e.g. \"Paris\""},
      days: {type: "integer", minimum: 1}}, required: ["city"]}}},
  {type: "function", function: {name: "get_time", description: "The time now", parameters: {type: "object", properties: {}}}},
];
const call = {id: "abc123def", type: "function", function: {name: "get_weather", arguments: "{\"city\":\"Paris\",\"days\":2}"}};
const convs = {
  "ends with the result": [
    {role: "system", content: "You are a helpful assistant."},
    {role: "user", content: "What is the weather in Paris?"},
    {role: "assistant", content: null, tool_calls: [call]},
    {role: "tool", tool_call_id: "abc123def", content: "Sunny, 24 °C\nwind: \"light\""},
  ],
  "then a reply and a question": [
    {role: "system", content: "You are a helpful assistant."},
    {role: "user", content: "What is the weather in Paris?"},
    {role: "assistant", content: null, tool_calls: [call]},
    {role: "tool", tool_call_id: "abc123def", content: "Sunny, 24 °C"},
    {role: "assistant", content: "It is sunny in Paris, 24 °C."},
    {role: "user", content: "And what time is it?"},
  ],
  "no system message": [
    {role: "user", content: "Weather in Rome?"},
    {role: "assistant", content: null, tool_calls: [{...call, function: {name: "get_weather", arguments: "{\"city\": \"Rome\"}"}}]},
    {role: "tool", tool_call_id: "abc123def", content: "Rain"},
  ],
};
const tpl = new Template(readFileSync(file, "utf8"));
let pass = 0, fail = 0;
for (const [name, messages] of Object.entries(convs)) {
  const hf = messages.map(m => m.tool_calls ? {...m, tool_calls: m.tool_calls.map(c => ({...c,
    function: {...c.function, arguments: JSON.parse(c.function.arguments)}}))} : m);
  // date_string: cumulo writes the template's own default date (chat.h), not strftime_now's
  const want = tpl.render({messages: hf, tools, bos_token: "", eos_token: eos, add_generation_prompt: true,
    date_string: "26 Jul 2024"});
  const r = await fetch(url + "/apply-template", {method: "POST", body: JSON.stringify({messages, tools})});
  const j = await r.json();
  const got = j.prompt;
  if (got === want) { pass++; continue; }
  fail++;
  let i = 0;
  while (got && i < got.length && got[i] === want[i]) i++;
  console.error(`FAIL [${file.split("/").pop()}] ${name}: ${r.status} ${got === undefined ? JSON.stringify(j) : ""}` +
    `\n  differs at ${i}:\n  got:  ${JSON.stringify((got || "").slice(Math.max(0, i - 60), i + 80))}` +
    `\n  want: ${JSON.stringify(want.slice(Math.max(0, i - 60), i + 80))}`);
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
