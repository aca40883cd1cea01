# tests/sh/lib/finetune_data.sh: the fine-tuning data of tests/sh/finetune_cli.sh
# and tools/gen_finetune_refs.sh (not a test itself). finetune_data prints 200
# JSONL lines: two in three are "Zorbix the robot found a red ball. Zorbix was
# very happy.", the others vary a colour and a thing, so the learned greedy
# text is that one line.
finetune_data() {
    i=0
    set -- red blue green yellow purple pink orange brown white black
    while [ $i -lt 200 ]; do
        if [ $((i % 3)) -ne 0 ]; then
            echo '{"text": "Zorbix the robot found a red ball. Zorbix was very happy."}'
        else
            k=$((i % 10 + 1)); eval c=\${$k}
            t=$(echo "ball hat box cup kite boat tree dog cat bird car book shoe star cake fish frog duck bear bike" | cut -d' ' -f$(((i * 7) % 20 + 1)))
            echo "{\"text\": \"Zorbix the robot saw a $c $t in the park.\"}"
        fi
        i=$((i + 1))
    done
}

# finetune_pc_data: 30 prompt/completion lines (loss on " sat on the mat" and EOS only).
finetune_pc_data() {
    i=0
    while [ $i -lt 30 ]; do echo '{"prompt": "the cat", "completion": " sat on the mat"}'; i=$((i + 1)); done
}

# vs_llamacpp MODEL PROMPT N ADAPTER REF (finetune_cli.sh, finetune_cluster.sh): cumulo's greedy
# ids and top-5 probabilities with the adapter against node-llama-cpp's in REF: "ok WORST" or what differs
vs_llamacpp() {
    "$BIN" run "$1" -p "$2" -n "$3" --temp 0 --threads 1 --json --logprobs 5 --lora "$4" >"$TMP/run.json" 2>/dev/null
    node -e '
const fs = require("fs");
const ours = JSON.parse(fs.readFileSync(process.argv[1])), ref = JSON.parse(fs.readFileSync(process.argv[2]));
const ids = ours.tokens.map(t => typeof t === "object" ? t.id : t);
if (ids.join() !== ref.generated_tokens.join()) { console.log("ids " + ids + " vs llama.cpp " + ref.generated_tokens); process.exit(); }
let worst = 0;
ours.logprobs.forEach((s, k) => {
  const p = ref.probs[ref.prompt_tokens.length - 1 + k].p;
  for (const [id, lp] of s.top) {
    const q = Math.exp(lp), r = p[id];
    const e = r === undefined ? Math.max(0, q - ref.probs_min) : Math.abs(q - r);
    worst = Math.max(worst, e);
  }
});
console.log(worst <= 2e-5 ? "ok " + worst : "prob error " + worst);
' "$TMP/run.json" "$5"
}
