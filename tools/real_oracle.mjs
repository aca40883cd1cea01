// real_oracle.mjs: llama.cpp (node-llama-cpp 3.21.1) reference numbers for a
// real model, in the form tests/data/real/*.json stores them. Run by
// tools/gen_real_refs.sh from the oracle folder (it imports node-llama-cpp and
// @huggingface/jinja, which node-llama-cpp depends on).
//
// usage: node real_oracle.mjs MODEL.gguf OUT.json PROMPTS.json N_GEN TOPK [META_JSON]
//
// PROMPTS.json: [{"name": ..., "text": ...} | {"name": ..., "chat": USER_TEXT}].
// A text prompt is tokenized by llama.cpp (no special-token parsing), with
// BOS first when the model asks for it (tokenizer.ggml.add_bos_token). A chat
// prompt is rendered by the GGUF's own Jinja chat template (tokenizer.
// chat_template, through @huggingface/jinja: independent of cumulo's
// src/tokenizer/chat.c) as one user message with add_generation_prompt, then
// tokenized with special tokens parsed (no extra BOS: templates write it).
// For each: N_GEN greedy tokens, the prompt as one batch then one token per
// decode step (as an engine runs), with every step's top TOPK next-token
// probabilities, the rest's mass and the top-1 margin p1 - p2; generation
// stops early at an end-of-generation token (stored as the last id).
// F32 KV cache, 1 thread, no flash attention, temperature 1, no truncation.
import {getLlama} from "node-llama-cpp";
import {Template} from "@huggingface/jinja";
import fs from "node:fs";
const [,, modelPath, outPath, promptsPath, nGenArg = "64", topkArg = "10", metaArg = "{}"] = process.argv;
const nGen = Number(nGenArg), topk = Number(topkArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: "warn"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 1024, threads: 1, sequences: 1, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
const seq = context.getSequence();
const opts = {temperature: 1, topK: 0, topP: 1, minP: 0};
const r6 = x => Number(x.toPrecision(6));
const meta = model.fileInfo.metadata;

function summarize(probs) { // Map token -> prob
  const e = [...probs.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]);
  let rest = 0;
  for (let i = topk; i < e.length; i++) rest += e[i][1];
  return {ids: e.slice(0, topk).map(x => x[0]), p: e.slice(0, topk).map(x => r6(x[1])), rest: r6(rest),
          top: e[0][0], margin: e[0][1] - (e.length > 1 ? e[1][1] : 0)};
}

// Gemma 3 270M is the base model: its GGUF has no chat template. Then the
// -it models' template (google/gemma-3-*-it, one user message) stands in,
// and cumulo is run with --chat-template gemma.
const GEMMA_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}" +
  "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + " +
  "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";
const template = meta.tokenizer.chat_template ?? (meta.general.architecture === "gemma3" ? GEMMA_TEMPLATE : undefined);

function render(user) {
  const tpl = new Template(template);
  const tok = id => (id === undefined || id === null) ? "" : model.detokenize([id], true);
  return tpl.render({messages: [{role: "user", content: user}], add_generation_prompt: true,
    bos_token: tok(model.tokens.bos), eos_token: tok(model.tokens.eos)});
}

const prompts = JSON.parse(fs.readFileSync(promptsPath, "utf8"));
const out = {...JSON.parse(metaArg), model: modelPath.split("/").pop(), nodeLlamaCpp: "3.21.1", kv: "F32", threads: 1,
  topk, n_gen: nGen, chat_template: meta.tokenizer.chat_template ? "gguf" : "gemma (stand-in: the GGUF has none)", cases: []};
for (const pr of prompts) {
  let prompt, rendered;
  if (pr.chat !== undefined) {
    rendered = render(pr.chat);
    prompt = [...model.tokenize(rendered, true)];
  } else {
    prompt = [...model.tokenize(pr.text, false)];
    if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null) prompt.unshift(model.tokens.bos);
  }
  await seq.clearHistory();
  let r = await seq.controlledEvaluate(prompt.map((t, i) => i === prompt.length - 1
    ? [t, {generateNext: {probabilities: true, options: opts}}] : t));
  let s = summarize(r[prompt.length - 1].next.probabilities);
  const gen = [], margins = [], steps = [];
  for (let k = 0; k < nGen; k++) {
    gen.push(s.top);
    margins.push(r6(s.margin));
    steps.push({ids: s.ids, p: s.p, rest: s.rest});
    if (k === nGen - 1 || model.isEogToken(s.top)) break;
    r = await seq.controlledEvaluate([[s.top, {generateNext: {probabilities: true, options: opts}}]]);
    s = summarize(r[0].next.probabilities);
  }
  const c = {name: pr.name, prompt, greedy: gen, text: model.detokenize(gen), margins, steps};
  if (rendered !== undefined) { c.chat = pr.chat; c.rendered = rendered; } else c.text_prompt = pr.text;
  out.cases.push(c);
  console.log(pr.name, "prompt", prompt.length, "greedy", gen.length, "min margin", Math.min(...margins).toFixed(4),
    JSON.stringify(c.text).slice(0, 120));
}
fs.writeFileSync(outPath, JSON.stringify(out) + "\n");
await llama.dispose();
