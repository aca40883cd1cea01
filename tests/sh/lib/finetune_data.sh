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
