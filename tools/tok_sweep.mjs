// tok_sweep.mjs: llama.cpp's token ids (node-llama-cpp 3.21.1, no BOS, no
// special-token parsing, and with it: "special") of each text of TEXTS.json (a JSON array of strings)
// with each vocabulary given; one JSON line per vocabulary:
// {"vocab": FILE, "ids": [[...], ...]}. Run by tools/tok_sweep.sh.
// usage: node tok_sweep.mjs TEXTS.json VOCAB.gguf...
import {getLlama} from "node-llama-cpp";
import fs from "node:fs";
const [,, textsPath, ...vocabs] = process.argv;
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
for (const v of vocabs) {
  const model = await llama.loadModel({modelPath: v, vocabOnly: true});
  console.log(JSON.stringify({vocab: v, ids: texts.map(t => [...model.tokenize(t, false)]),
    special: texts.map(t => [...model.tokenize(t, true)])}));
  await model.dispose();
}
await llama.dispose();
