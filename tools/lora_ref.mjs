// llama.cpp (node-llama-cpp 3.21.1) greedy ids and teacher-forced next-token
// probabilities of a model with LoRA adapters applied: the reference that
// tests/unit/test_lora.c compares cumulo's --lora against.
// usage: NLC_DIR=/work/cache/nlc node tools/lora_ref.mjs MODEL.gguf "prompt" N OUT.json [ADAPTER.gguf[:SCALE] ...]
// Greedy: n ids after BOS + prompt. Probabilities (F32 KV cache, temperature 1,
// no truncation) at every position of BOS + prompt + generated, entries >= 1e-6 kept.
import {createRequire} from "node:module";
import fs from "node:fs";
const req = createRequire((process.env.NLC_DIR ?? "/work/cache/nlc") + "/");
const {getLlama} = await import(req.resolve("node-llama-cpp"));
const [,, modelPath, prompt, n, outPath, ...specs] = process.argv;
const adapters = specs.map(s => { const m = s.match(/^(.*):([-0-9.eE+]+)$/); return m ? {filePath: m[1], scale: Number(m[2])} : {filePath: s, scale: 1}; });
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const mk = () => model.createContext({contextSize: 256, threads: 1, sequences: 1, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
  ...(adapters.length ? {lora: {adapters}} : {})});
let ctx = await mk();
const input = [model.tokens.bos, ...model.tokenize(prompt)];
const gen = [];
for await (const tok of ctx.getSequence().evaluate(input, {temperature: 0})) {
  if (tok === model.tokens.eos) break;
  gen.push(tok);
  if (gen.length >= Number(n)) break;
}
await ctx.dispose();
ctx = await mk();
const ids = [...input, ...gen];
const res = await ctx.getSequence().controlledEvaluate(ids.map(t => [t, {generateNext: {token: true, probabilities: true,
  options: {temperature: 1, topK: 0, topP: 1, minP: 0}}}]));
const probs = res.map((r, i) => ({pos: i, input: ids[i],
  p: Object.fromEntries([...r.next.probabilities.entries()].filter(([, v]) => v >= 1e-6).map(([k, v]) => [k, Number(v.toPrecision(7))]))}));
fs.writeFileSync(outPath, JSON.stringify({model: modelPath.split("/").pop(), adapters: specs.map(s => s.split("/").pop()),
  nodeLlamaCpp: "3.21.1", prompt, prompt_tokens: input, generated_tokens: gen, probs_min: 1e-6, probs}));
console.log(JSON.stringify({prompt_tokens: input, generated_tokens: gen, text: model.detokenize(gen)}));
await llama.dispose();
