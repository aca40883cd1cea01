// bench/bench_table.js: the markdown table of `cumulo bench --vs-llamacpp
// --json` rows, shared by bench/run_table.sh and bench/moe_table.sh: a line
// naming the CPU, the kernel table and the anchor (from the first row), then
// one table row per JSON line.
//
//   node bench/bench_table.js RESULTS.jsonl PREFIX [--bytes-per-token]
//
// PREFIX: a regular expression for the start of the model file names that the
// model column drops (the rest, less ".gguf", upper-cased: the type);
// --bytes-per-token adds the GB a token reads (a MoE model's: the experts it
// uses, not the file).
const fs = require("fs");
const [file, prefix, ...opts] = process.argv.slice(2);
const gb = opts.includes("--bytes-per-token");
const rows = fs.readFileSync(file, "utf8").trim().split("\n").map(JSON.parse);
const f = (x, d = 1) => (x === undefined || x === null ? "-" : x.toFixed(d));
const c = rows[0].cpu || {}, a = (rows[0].llamacpp || {}).anchor || "none";
console.log(`CPU: ${c.name} (${c.vendor}, family ${c.family}, model ${c.model}, ${c.cpus} CPUs; ${(c.flags || []).join(" ")}); ` +
  `cumulo kernels ${rows[0].kernels}; anchor: ${a}\n`);
console.log(`| model | threads | ${gb ? "GB read/token | " : ""}prompt tok/s cumulo | llama.cpp | ratio | ` +
  "decode tok/s cumulo | llama.cpp | ratio | % roofline cumulo | llama.cpp | read GB/s |");
console.log(`|---|---|${gb ? "---|" : ""}---|---|---|---|---|---|---|---|---|`);
for (const r of rows) {
  const l = r.llamacpp || {};
  const type = r.model.replace(new RegExp("^" + prefix), "").replace(/\.gguf$/, "").toUpperCase();
  console.log(`| ${type} | ${r.threads} | ${gb ? f(r.bytes_per_token / 1e9, 3) + " | " : ""}${f(r.pp_tokens_per_s)} | ` +
    `${f(l.pp_tokens_per_s)} | ${f(r.pp_ratio, 2)} | ${f(r.tg_tokens_per_s)} | ${f(l.tg_tokens_per_s)} | ` +
    `${f(r.tg_ratio, 2)} | ${f(r.tg_roofline_pct)}% | ${f(l.tg_roofline_pct)}% | ${f(r.read_bw_gbs)} |`);
}
