// synth_oracle.mjs: llama.cpp (node-llama-cpp 3.21.1) reference numbers for one
// synthetic model, in the form tests/data/synth/*.json stores them. Run by
// tools/gen_synth_refs.sh from the oracle folder (it imports node-llama-cpp).
//
// usage: node synth_oracle.mjs MODEL.gguf OUT.json "1;1,450,4996" N_GEN TOPK [META_JSON]
//
// For each prompt (token ids, ';'-separated prompts): N_GEN greedy tokens, one
// token per decode step after a batched prompt (the way an engine runs), with
// the full next-token distribution at every step: its argmax is the greedy
// token, its top-1 margin p1 - p2 is recorded, and for the first 8 positions
// of the sequence (prompt included, batched prompt positions are recomputed
// teacher-forced) the top TOPK probabilities and the sum of the rest.
// Then the first prompt + its greedy tokens again, teacher-forced in ONE
// batch: llama.cpp's batched path (for K-quants it may differ from the
// one-token path; the test accepts either).
// F32 KV cache (or KV_K/KV_V), 1 thread, no flash attention (or FA=1),
// temperature 1, no truncation.
import {getLlama} from "node-llama-cpp";
import fs from "node:fs";
const [,, modelPath, outPath, promptsArg, nGenArg = "32", topkArg = "16", metaArg = "{}"] = process.argv;
const nGen = Number(nGenArg), topk = Number(topkArg), NPOS = 8;
// ggml_cpu: the CPU variant llama.cpp loaded (haswell, icelake, sapphirerapids, ...): its BF16 dot order
// depends on it (vdpbf16ps only where the CPU has AVX512-BF16; test_synth_golden's BF16 bound reads it)
let ggmlCpu = "unknown";
const llama = await getLlama({gpu: false, build: "never", logLevel: "debug", logger: (level, message) => {
  const m = /loaded CPU backend from .*libggml-cpu-([a-z0-9_]+)\.so/.exec(message);
  if (m) ggmlCpu = m[1];
  else if (level === "warn" || level === "error" || level === "fatal") console.error(message.trimEnd());
}});
const model = await llama.loadModel({modelPath});
// KV_K / KV_V (e.g. Q8_0) and FA=1 choose the KV cache types and flash attention
// (llama.cpp needs flash attention for a quantized V cache).
const kvK = process.env.KV_K || "F32", kvV = process.env.KV_V || "F32", flash = process.env.FA === "1";
const context = await model.createContext({contextSize: 512, threads: 1, sequences: 1, flashAttention: flash,
  experimentalKvCacheKeyType: kvK, experimentalKvCacheValueType: kvV});
const seq = context.getSequence();
const opts = {temperature: 1, topK: 0, topP: 1, minP: 0};
const r6 = x => Number(x.toPrecision(6));

function summarize(probs) { // Map token -> prob
  const e = [...probs.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]);
  let rest = 0;
  for (let i = topk; i < e.length; i++) rest += e[i][1];
  return {ids: e.slice(0, topk).map(x => x[0]), p: e.slice(0, topk).map(x => r6(x[1])), rest: r6(rest),
          top: e[0][0], margin: e[0][1] - (e.length > 1 ? e[1][1] : 0)};
}

async function evalAll(ids) { // teacher-forced, one batch, probabilities at every position
  await seq.clearHistory();
  const res = await seq.controlledEvaluate(ids.map(t => [t, {generateNext: {probabilities: true, options: opts}}]));
  return res.map(r => summarize(r.next.probabilities));
}

const prompts = promptsArg.split(";").map(s => s.split(",").map(Number));
const out = {...JSON.parse(metaArg), model: modelPath.split("/").pop(), nodeLlamaCpp: "3.21.1", ggml_cpu: ggmlCpu, kv: kvK === kvV ? kvK : `${kvK}/${kvV}`, flash, threads: 1, topk, cases: []};
for (const prompt of prompts) {
  const pre = await evalAll(prompt); // the prompt's positions, one batch
  // greedy: the prompt as one batch, then one token per decode step; step k's
  // distribution is that of position prompt.length - 1 + k
  await seq.clearHistory();
  let r = await seq.controlledEvaluate(prompt.map((t, i) => i === prompt.length - 1
    ? [t, {generateNext: {probabilities: true, options: opts}}] : t));
  let s = summarize(r[prompt.length - 1].next.probabilities);
  const gen = [], margins = [], steps = [];
  for (let k = 0; k < nGen; k++) {
    gen.push(s.top);
    margins.push(r6(s.margin));
    if (prompt.length - 1 + k < NPOS) steps.push(s);
    if (k === nGen - 1) break;
    r = await seq.controlledEvaluate([[s.top, {generateNext: {probabilities: true, options: opts}}]]);
    s = summarize(r[0].next.probabilities);
  }
  const strip = x => ({ids: x.ids, p: x.p, rest: x.rest});
  const decode = [];
  for (let p = 0; p < NPOS; p++) decode.push(strip(p < prompt.length - 1 ? pre[p] : steps[p - prompt.length + 1]));
  const full = await evalAll([...prompt, ...gen].slice(0, NPOS));
  const batch = full.map(strip);
  const c = {prompt, greedy: gen, margins, probs_decode: decode};
  // prompt positions are batched in both runs; store the batch only where it
  // differs from the decode path by more than float noise (1e-5)
  const differs = batch.some((b, i) => b.ids.some((id, k) => id !== decode[i].ids[k] ||
    Math.abs(b.p[k] - decode[i].p[k]) > 1e-5));
  if (differs) c.probs_batch = batch;
  out.cases.push(c);
  console.log("prompt", prompt.join(","), "greedy", gen.join(","), "min margin", Math.min(...margins).toFixed(4));
}
fs.writeFileSync(outPath, JSON.stringify(out));
await llama.dispose();
