// tools/embed_oracle.mjs: llama.cpp's embeddings (node-llama-cpp 3.21.1,
// LlamaEmbeddingContext) of token-id sequences, pooled three ways, for
// tests/sh/http_embed.sh. Run by hand from the folder where node-llama-cpp is
// installed (see tools/gen_embed_refs.sh); never in CI.
//   node embed_oracle.mjs MODEL.gguf OUT.json '[[1,2,3],[1,4]]' META_JSON [whole]
// With "whole" (a model whose GGUF declares its pooling): each sequence once,
// llama.cpp's own pooled vector (llama_get_embeddings_seq) as "vec".
// A model without `<arch>.pooling_type` gives llama.cpp's pooling "none":
// getEmbedding returns the LAST token's output-normed hidden state, not
// L2-normalised. Attention is causal, so the hidden state of row i of a
// sequence equals the last row of its prefix [0, i]: evaluating every
// prefix gives every row, and from them the three poolings: cls (row 0),
// last (row n-1) and mean (all rows, BOS included), all unnormalised.
// The KV cache is F32 (K and V): with llama.cpp's default F16 cache a
// last-bit difference in a sum can flip one F16 rounding of a cached K or V
// element and move an embedding by 1e-4, so an F16-cache reference would be a
// bit-for-bit check of llama.cpp's summation order, not of the model.
// createEmbeddingContext does not pass the cache types through, so the
// context is made here as it makes it (_embeddings: true) and wrapped in a
// LlamaEmbeddingContext. One thread, always (the sums' order).
import {getLlama, LlamaEmbeddingContext, GgmlType} from "node-llama-cpp";
import fs from "node:fs";
const [,, modelPath, outPath, inputsArg, metaArg = "{}", mode = "prefix"] = process.argv;
const inputs = JSON.parse(inputsArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: "warn"});
// flash attention off (as the other oracles): its CPU kernel accumulates V in F16
const model = await llama.loadModel({modelPath, defaultContextFlashAttention: false});
const lctx = await model.createContext({contextSize: 512, threads: 1, _embeddings: true,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
if (lctx.kvCacheKeyType !== GgmlType.F32 || lctx.kvCacheValueType !== GgmlType.F32)
  throw new Error(`KV cache types ${lctx.kvCacheKeyType}/${lctx.kvCacheValueType}, not F32`);
const ctx = new LlamaEmbeddingContext({_llamaContext: lctx});
const cases = [];
const r6 = (v) => v.map((x) => Number(x.toPrecision(7)));
for (const ids of inputs) {
  if (mode === "whole") { cases.push({ids, vec: r6(Array.from((await ctx.getEmbeddingFor(ids)).vector))}); continue; }
  const rows = [];
  for (let L = 1; L <= ids.length; L++) rows.push(Array.from((await ctx.getEmbeddingFor(ids.slice(0, L))).vector));
  const E = rows[0].length;
  const mean = new Array(E).fill(0);
  for (const r of rows) for (let k = 0; k < E; k++) mean[k] += r[k] / rows.length;
  cases.push({ids, cls: r6(rows[0]), last: r6(rows[rows.length - 1]), mean: r6(mean)});
}
const meta = JSON.parse(metaArg);
fs.writeFileSync(outPath, JSON.stringify({...meta, nodeLlamaCpp: "3.21.1", kv_cache: "f32", threads: 1, pooling_reference: mode === "whole" ? "llama.cpp's pooling as the GGUF declares it; unnormalised" : "llama.cpp pooling none (last row) per prefix; unnormalised", n_embd: (cases[0].cls || cases[0].vec).length, cases}) + "\n");
console.log(outPath, cases.length, "cases");
await ctx.dispose(); await model.dispose(); await llama.dispose();
