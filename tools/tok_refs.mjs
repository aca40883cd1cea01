// tok_refs.mjs: reference token ids from llama.cpp (node-llama-cpp 3.21.1) for
// tests/unit/test_tokenizer.c. Run from a folder with node-llama-cpp installed
// (see ../shared/oracle/README.md):
//   node tok_refs.mjs VOCAB.gguf INPUT.inp OUT.jsonl [parseSpecial=0|1]
// INPUT uses the llama.cpp test format (strings separated by
// "\n__ggml_vocab_test__\n", the last one empty). OUT gets one JSON line per
// string: {"ids":[...no BOS...],"detok":"llama_detokenize(ids) as text"}.
import {getLlama} from "node-llama-cpp";
import fs from "node:fs";
const [,, vocab, inpPath, outPath, ps = "0"] = process.argv;
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: vocab, vocabOnly: true});
const inp = fs.readFileSync(inpPath, "utf8").split("\n__ggml_vocab_test__\n"); inp.pop();
const lines = inp.map((text) => {
  const ids = Array.from(model.tokenize(text, ps === "1"));
  return JSON.stringify({ids, detok: model.detokenize(ids, false)});
});
fs.writeFileSync(outPath, lines.join("\n") + "\n");
console.log(`${vocab.split("/").pop()}: ${lines.length} strings -> ${outPath}`);
await llama.dispose();
