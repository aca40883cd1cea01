// tools/serve_bench.mjs: aggregate generation speed of a running `cumulo serve`
// (or any OpenAI-compatible server) at several numbers of concurrent
// streaming clients. Each client streams one completion of MAX tokens at
// temperature 0 with stream_options.include_usage; the aggregate is the sum
// of completion tokens over the wall time of the whole round (first request
// sent to last [DONE]). Prints one line per concurrency and a JSON line.
//
//   node tools/serve_bench.mjs URL [MAX_TOKENS=200] [CONCURRENCY=1,4,16] [ROUNDS=3]
//
// A benchmark, not a test: numbers on a shared machine are noisy; the best
// of ROUNDS rounds is reported.
const [url, maxArg, concArg, roundsArg] = process.argv.slice(2);
if (!url) { console.error("usage: node tools/serve_bench.mjs URL [MAX_TOKENS] [1,4,16] [ROUNDS]"); process.exit(2); }
const max = Number(maxArg || 200), rounds = Number(roundsArg || 3);
const concs = (concArg || "1,4,16").split(",").map(Number);
const key = process.env.CUMULO_API_KEY;
const headers = { "Content-Type": "application/json", ...(key ? { Authorization: "Bearer " + key } : {}) };
const prompts = ["Once upon a time", "The little dog", "Lily and Ben", "One day, a bird"];

async function one(i) {
  const r = await fetch(url + "/v1/completions", { method: "POST", headers, body: JSON.stringify({
    prompt: prompts[i % prompts.length], max_tokens: max, temperature: 0, stream: true,
    stream_options: { include_usage: true } }) });
  if (!r.ok) throw new Error("HTTP " + r.status + ": " + await r.text());
  const text = await r.text();
  let tokens = 0;
  for (const ev of text.split("\n\n")) {
    if (!ev.startsWith("data: {")) continue;
    const j = JSON.parse(ev.slice(6));
    if (j.usage) tokens = j.usage.completion_tokens;
  }
  return tokens;
}

const out = {};
for (const c of concs) {
  let best = 0, bestTok = 0, bestS = 0;
  for (let k = 0; k < rounds; k++) {
    const t0 = performance.now();
    const toks = await Promise.all(Array.from({ length: c }, (_, i) => one(i)));
    const s = (performance.now() - t0) / 1000, n = toks.reduce((a, b) => a + b, 0);
    if (n / s > best) { best = n / s; bestTok = n; bestS = s; }
  }
  out[c] = +best.toFixed(1);
  console.log(`${String(c).padStart(3)} concurrent streams: ${best.toFixed(1)} tokens/s aggregate (${bestTok} tokens in ${bestS.toFixed(2)} s, best of ${rounds})`);
}
console.log(JSON.stringify({ bench: "serve", url, max_tokens: max, tokens_per_s: out }));
