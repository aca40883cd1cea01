// real_tok_refs.mjs: llama.cpp's token ids (node-llama-cpp 3.21.1, no BOS, no
// special-token parsing) of every text of a test-tokenizer-0 corpus (.inp)
// with a real model's vocabulary, as tests/data/real/MODEL.tok.json.
// usage: node real_tok_refs.mjs MODEL.gguf CORPUS.inp OUT.json
import {getLlama} from "node-llama-cpp";
import fs from "node:fs";
const [,, modelPath, inpPath, outPath] = process.argv;
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, vocabOnly: true});
const inp = fs.readFileSync(inpPath, "utf8").split("\n__ggml_vocab_test__\n");
inp.pop();
const cases = inp.map(text => ({text, ids: [...model.tokenize(text, false)]}));
fs.writeFileSync(outPath, JSON.stringify({model: modelPath.split("/").pop(), corpus: inpPath.split("/").pop(),
  nodeLlamaCpp: "3.21.1", cases}) + "\n");
console.log(`${cases.length} texts`);
await llama.dispose();
