#!/bin/sh
# tests/sh/chat.sh: `cumulo chat` end to end on stories260K.
# (a) Piped stdin, --chat-template chatml, greedy: each reply equals what
#     `cumulo run` gives for the same conversation rendered here by hand
#     (ChatML written out in this script, not by our renderer), so the second
#     turn, which reuses the KV cache of the first (the --verbose line says how
#     many tokens), must agree with a fresh evaluation; /reset starts over.
# (b) In a terminal (tmux): the reply streams into the pane, Ctrl-C stops a
#     long reply and the prompt comes back with the program alive, Ctrl-D
#     exits with status 0.
# (c) Errors: an unknown template name: one line on stderr, exit status 1.
#     A model without a chat template (or with one we do not recognise) is
#     chatted with in ChatML, with a warning on stderr: the same fallback, in
#     the same words, as `serve` and `run --chat` (issue 19).
# Needs perl (JSON::PP) and tmux (scripts/setup.sh installs both).
cd "$(dirname "$0")/../.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
case "$BIN" in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
M=$SHARED/models/stories260K-f32.gguf
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
TMP=$(mktemp -d)
TM="tmux -L cumulo-chat-test-$$ -f /dev/null"
trap '$TM kill-server >/dev/null 2>&1; rm -rf "$TMP"' EXIT

# run_text PROMPT-FILE: the text `cumulo run` generates (greedy, 24 tokens) for the prompt's exact bytes.
run_text() {
    "$BIN" run "$M" -f "$1" -n 24 --temp 0 --threads 1 --json 2>"$TMP/run.err" |
        perl -MJSON::PP -e 'local $/; binmode STDOUT; print decode_json(<STDIN>)->{text}'
}

# ---- (a) piped: two turns, prefix reuse, agreement with `cumulo run`; /reset
printf '<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n' >"$TMP/p1"
run_text "$TMP/p1" >"$TMP/t1"
{ cat "$TMP/p1" "$TMP/t1"; printf '<|im_end|>\n<|im_start|>user\nwhat next?<|im_end|>\n<|im_start|>assistant\n'; } >"$TMP/p2"
run_text "$TMP/p2" >"$TMP/t2"
# chat shows each reply without its leading whitespace, then a newline.
perl -e 'binmode STDOUT; for (@ARGV) { open my $f, "<", $_ or die; local $/; my $t = <$f>; $t =~ s/^\s+//; print "$t\n" }' \
    "$TMP/t1" "$TMP/t2" "$TMP/t1" >"$TMP/want"
[ -s "$TMP/t1" ] && [ -s "$TMP/t2" ] && ok || bad "cumulo run gave no text: $(cat "$TMP/run.err")"
printf 'hello\nwhat next?\n/reset\nhello\n' |
    "$BIN" chat "$M" --chat-template chatml --temp 0 -n 24 --threads 1 -v >"$TMP/chat.out" 2>"$TMP/chat.err"
st=$?
[ "$st" -eq 0 ] && ok || bad "piped chat exited with $st: $(cat "$TMP/chat.err")"
cmp -s "$TMP/chat.out" "$TMP/want" && ok || {
    bad "chat replies differ from cumulo run on the same rendered prompts"
    echo "  chat:" >&2; sed 's/^/    /' "$TMP/chat.out" >&2
    echo "  run:" >&2; sed 's/^/    /' "$TMP/want" >&2
}
# Turn 2 evaluates only what is new: at least turn 1's whole prompt comes from the cache.
n1=$(sed -n 's/^chat: turn 1: prompt \([0-9]*\) tokens.*/\1/p' "$TMP/chat.err")
n2=$(sed -n 's/^chat: turn 2: prompt \([0-9]*\) tokens.*/\1/p' "$TMP/chat.err")
r1=$(sed -n 's/^chat: turn 1: prompt [0-9]* tokens, \([0-9]*\) reused.*/\1/p' "$TMP/chat.err")
r2=$(sed -n 's/^chat: turn 2: prompt [0-9]* tokens, \([0-9]*\) reused.*/\1/p' "$TMP/chat.err")
e2=$(sed -n 's/^chat: turn 2: .* reused from the cache, \([0-9]*\) evaluated.*/\1/p' "$TMP/chat.err")
p2n=$("$BIN" run "$M" -f "$TMP/p2" -n 1 --temp 0 --json 2>/dev/null | perl -MJSON::PP -e 'print scalar @{decode_json(<STDIN>)->{prompt_tokens}}')
if [ -n "$n1" ] && [ -n "$r2" ] && [ "$r1" = 0 ] && [ "$r2" -ge "$n1" ] && [ $((r2 + e2)) -eq "$n2" ] && [ "$n2" = "$p2n" ]; then
    ok
else
    bad "prefix reuse: turn 1 prompt $n1 (reused $r1), turn 2 prompt $n2 (run: $p2n) reused $r2 evaluated $e2: $(cat "$TMP/chat.err")"
fi
# After /reset the third turn is turn 1 again (same reply, checked above) with a fresh history.
n3=$(sed -n 's/^chat: turn 3: prompt \([0-9]*\) tokens.*/\1/p' "$TMP/chat.err")
[ -n "$n3" ] && [ "$n3" = "$n1" ] && ok || bad "after /reset the prompt has $n3 tokens, not $n1"
grep -q 'conversation cleared' "$TMP/chat.err" && ok || bad "/reset said nothing"
# A system message is rendered first (greedy: the reply is run's for that prompt).
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n' >"$TMP/ps"
run_text "$TMP/ps" | perl -e 'local $/; my $t = <STDIN>; $t =~ s/^\s+//; binmode STDOUT; print "$t\n"' >"$TMP/wants"
echo hello | "$BIN" chat "$M" --chat-template chatml --system "Be brief." --temp 0 -n 24 --threads 1 >"$TMP/s.out" 2>/dev/null
cmp -s "$TMP/s.out" "$TMP/wants" && ok || bad "--system: reply differs from run's"
"$BIN" chat --help | grep -q 'usage: cumulo chat' && ok || bad "chat --help"
# A small context: the oldest exchange is dropped to make room, and the reply
# is run's for the conversation without it.
printf 'hello\nwhat next?\n' | "$BIN" chat "$M" --chat-template chatml --temp 0 -n 24 --ctx 128 --threads 1 -v \
    >"$TMP/d.out" 2>"$TMP/d.err"
printf '<|im_start|>user\nwhat next?<|im_end|>\n<|im_start|>assistant\n' >"$TMP/p3"
run_text "$TMP/p3" >"$TMP/t3"
perl -e 'binmode STDOUT; for (@ARGV) { open my $f, "<", $_ or die; local $/; my $t = <$f>; $t =~ s/^\s+//; print "$t\n" }' \
    "$TMP/t1" "$TMP/t3" >"$TMP/want3"
grep -q 'dropped the oldest 1 exchange' "$TMP/d.err" && cmp -s "$TMP/d.out" "$TMP/want3" && ok ||
    bad "--ctx 128: no exchange dropped, or replies differ: $(cat "$TMP/d.err")"
# The shift keeps the system message: with --system the same small context
# drops the first exchange, and the second reply is run's for the system
# message + the second question (the system prompt's tokens reused from the cache).
printf 'hello\nwhat next?\n' | "$BIN" chat "$M" --chat-template chatml --system "Be brief." --temp 0 -n 24 --ctx 128 \
    --threads 1 -v >"$TMP/ds.out" 2>"$TMP/ds.err"
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nwhat next?<|im_end|>\n<|im_start|>assistant\n' >"$TMP/ps3"
run_text "$TMP/ps3" | perl -e 'local $/; my $t = <STDIN>; $t =~ s/^\s+//; binmode STDOUT; print "$t\n"' >"$TMP/wants3"
cat "$TMP/wants" "$TMP/wants3" >"$TMP/wants13"
grep -q 'dropped the oldest 1 exchange' "$TMP/ds.err" && cmp -s "$TMP/ds.out" "$TMP/wants13" &&
    grep -q 'turn 2: prompt [0-9]* tokens, [1-9][0-9]* reused' "$TMP/ds.err" && ok ||
    bad "--system --ctx 128: the shift lost the system message: $(cat "$TMP/ds.err") / $(cat "$TMP/ds.out")"
# A message that cannot fit: one line, the chat goes on, exit status 1 at the end.
printf 'hello\n/help\n' | "$BIN" chat "$M" --chat-template chatml --temp 0 -n 8 --ctx 40 --threads 1 >/dev/null 2>"$TMP/f.err"
st=$?
[ "$st" -eq 1 ] && grep -q 'more than the context of 40' "$TMP/f.err" && grep -q '^commands:' "$TMP/f.err" && ok ||
    bad "message larger than the context: status $st: $(cat "$TMP/f.err")"
# `cumulo run --chat-template` renders one user message the same way.
"$BIN" run "$M" --chat-template chatml -p hello -n 24 --temp 0 --threads 1 --json 2>/dev/null |
    perl -MJSON::PP -e 'local $/; binmode STDOUT; print decode_json(<STDIN>)->{text}' >"$TMP/rc"
cmp -s "$TMP/rc" "$TMP/t1" && ok || bad "run --chat-template chatml differs from run on the rendered prompt"

# with_template OUT TEMPLATE: stories260K with a tokenizer.chat_template key
# inserted first; the text is padded with spaces so the insertion is a
# multiple of 32 bytes (GGUF's default alignment) and the tensor data stays
# aligned.
with_template() {
    perl -e 'my ($in, $out, $t) = @ARGV;
        open my $f, "<", $in or die; binmode $f; local $/; my $d = <$f>;
        my $k = "tokenizer.chat_template";
        $t .= " " while (8 + length($k) + 4 + 8 + length($t)) % 32;
        my $kv = pack("Q<", length $k) . $k . pack("V", 8) . pack("Q<", length $t) . $t;
        substr($d, 16, 8) = pack("Q<", unpack("Q<", substr($d, 16, 8)) + 1);
        substr($d, 24, 0) = $kv;
        open my $o, ">", $out or die; binmode $o; print $o $d' "$M" "$1" "$2"
}
# The model's own ChatML template (a Qwen-style Jinja text) is recognised: same replies as above.
with_template "$TMP/chatml.gguf" "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
printf 'hello\nwhat next?\n' | "$BIN" chat "$TMP/chatml.gguf" --temp 0 -n 24 --threads 1 >"$TMP/m.out" 2>"$TMP/m.err"
perl -e 'binmode STDOUT; for (@ARGV) { open my $f, "<", $_ or die; local $/; my $t = <$f>; $t =~ s/^\s+//; print "$t\n" }' \
    "$TMP/t1" "$TMP/t2" >"$TMP/want2"
cmp -s "$TMP/m.out" "$TMP/want2" && ok || bad "the model's ChatML template: replies differ: $(cat "$TMP/m.err")"
with_template "$TMP/odd.gguf" "{{ messages | tojson }}"

# ---- (c) errors: one line, status 1
expect_error() { # NAME PATTERN -- command...
    name=$1 pat=$2
    shift 2
    "$@" </dev/null >"$TMP/e.out" 2>"$TMP/e.err"
    st=$?
    lines=$(wc -l <"$TMP/e.err")
    if [ "$st" -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q -e "$pat" "$TMP/e.err"; then
        bad "$name: status $st, stderr: $(cat "$TMP/e.err")"
    else
        ok
    fi
}
expect_error "unknown template" "unknown chat template 'nope'.*chatml" "$BIN" chat "$M" --chat-template nope
# --chat-template overrides a template the model has but we do not recognise.
echo hello | "$BIN" chat "$TMP/odd.gguf" --chat-template chatml --temp 0 -n 24 --threads 1 >"$TMP/o.out" 2>/dev/null
perl -e 'local $/; my $t = <STDIN>; $t =~ s/^\s+//; binmode STDOUT; print "$t\n"' <"$TMP/t1" >"$TMP/want1"
cmp -s "$TMP/o.out" "$TMP/want1" && ok || bad "--chat-template over an unrecognised template"
expect_error "missing model" "no such file" "$BIN" chat "$TMP/none.gguf" --chat-template chatml
expect_error "no model" "needs a MODEL" "$BIN" chat
expect_error "bad option" "unknown option" "$BIN" chat "$M" --bogus
# no template / an unrecognised one: ChatML (the replies of --chat-template chatml), and a warning
fallback() { # NAME PATTERN MODEL
    echo hello | "$BIN" chat "$3" --temp 0 -n 24 --threads 1 >"$TMP/fb.out" 2>"$TMP/fb.err"
    st=$?
    if [ "$st" -eq 0 ] && cmp -s "$TMP/fb.out" "$TMP/want1" && grep -q -e "$2" "$TMP/fb.err"; then ok
    else bad "$1: status $st, stdout $(cat "$TMP/fb.out"), stderr $(cat "$TMP/fb.err")"; fi
}
fallback "no template" "warning: 'stories260K-f32.gguf': the model has no chat template.*; using chatml" "$M"
fallback "unrecognised template" "warning: 'odd.gguf': .*unrecognised chat template.*; using chatml" "$TMP/odd.gguf"
"$BIN" run "$M" --chat -p hello -n 24 --temp 0 --threads 1 --json 2>"$TMP/rn.err" |
    perl -MJSON::PP -e 'local $/; binmode STDOUT; print decode_json(<STDIN>)->{text}' >"$TMP/rn"
cmp -s "$TMP/rn" "$TMP/t1" && grep -q "no chat template.*; using chatml" "$TMP/rn.err" && ok ||
    bad "run --chat without a template: not chatml with a warning: $(cat "$TMP/rn.err")"
# serve says it in the same words
"$BIN" serve "$M" --port 0 --threads 1 2>"$TMP/sv.err" &
SV=$!
i=0
while ! grep -q 'ready:' "$TMP/sv.err" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill "$SV" 2>/dev/null
wait "$SV" 2>/dev/null
grep -q "warning: 'stories260K-f32': the model has no chat template.*; using chatml" "$TMP/sv.err" && ok ||
    bad "serve's fallback warning differs: $(cat "$TMP/sv.err")"

# ---- (b) tmux
if ! command -v tmux >/dev/null 2>&1; then
    bad "tmux is not installed (scripts/setup.sh installs it)"
    echo "$pass passed, $fail failed"
    exit 1
fi
pane() { $TM capture-pane -p -t "$1" -S -200 2>/dev/null; }
# wait_for SESSION SECONDS PERL-REGEX: until the pane matches (its whole text, trailing blanks
# removed, so a prompt "> " waiting for input is a final ">").
wait_for() {
    i=0
    while [ $i -lt $(($2 * 10)) ]; do
        pane "$1" | perl -e 'local $/; my $t = <STDIN>; $t =~ s/\s+\z//; exit($t =~ /$ARGV[0]/ ? 0 : 1)' "$3" && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# last_line SESSION: the pane's last non-blank line.
last_line() { pane "$1" | grep -v '^ *$' | tail -1; }

# The wrapper shell outlives a Ctrl-C (its trap) to record the exit status.
# Session A: a short greedy reply streams into the pane; Ctrl-D exits with status 0.
$TM new-session -d -s a -x 160 -y 50 \
    "sh -c 'trap : INT; \"$BIN\" chat \"$M\" --chat-template chatml --temp 0 -n 24 --threads 1; echo \$? >\"$TMP/a.status\"; sleep 60'"
if wait_for a 30 '\n>\z'; then ok; else bad "tmux: no prompt: $(pane a)"; fi
$TM send-keys -t a 'hello' Enter
first=$(perl -e 'local $/; my $t = <STDIN>; $t =~ s/^\s+//; print((split /\n/, $t)[0])' <"$TMP/t1")
first_re=$(printf '%s' "$first" | perl -pe '$_ = quotemeta')
if wait_for a 30 '(?s)> hello\n'"$first_re"'.*\n>\z'; then ok; else bad "tmux: reply '$first' not in the pane: $(pane a)"; fi
$TM send-keys -t a C-d
i=0
while [ ! -s "$TMP/a.status" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(cat "$TMP/a.status" 2>/dev/null)" = 0 ] && ok || bad "tmux: Ctrl-D: exit status '$(cat "$TMP/a.status" 2>/dev/null)'"

# Session B: a long sampled reply; Ctrl-C stops it, the program lives on and answers again; Ctrl-D exits 0.
$TM new-session -d -s b -x 160 -y 50 \
    "sh -c 'trap : INT; \"$BIN\" chat \"$M\" --chat-template chatml --temp 1 --seed 3 -n 10000 --ignore-eos --ctx 12000 --threads 1; echo \$? >\"$TMP/b.status\"; sleep 60'"
wait_for b 30 '\n>\z' && ok || bad "tmux b: no prompt: $(pane b)"
$TM send-keys -t b 'tell me a story' Enter
# The reply is streaming: text after the message, and more of it a moment later.
if wait_for b 30 '> tell me a story\n(.*\n){2}'; then
    before=$(pane b | wc -c)
    sleep 1
    after=$(pane b | wc -c)
    [ ! -s "$TMP/b.status" ] && ok || bad "tmux b: the program ended during the reply"
    [ "$after" -ne "$before" ] || [ "$(pane b | wc -l)" -ge 45 ] && ok || bad "tmux b: the reply did not keep streaming"
else
    bad "tmux b: no streamed reply: $(pane b)"
fi
$TM send-keys -t b C-c
if wait_for b 20 '\(stopped\)\n>\z'; then ok; else bad "tmux b: no prompt after Ctrl-C: $(last_line b)"; fi
sleep 0.5
[ ! -s "$TMP/b.status" ] && ok || bad "tmux b: Ctrl-C ended the program (status $(cat "$TMP/b.status"))"
# Still alive and answering: /help goes through the same loop.
$TM send-keys -t b '/help' Enter
wait_for b 20 'commands:(.*\n)+>\z' && ok || bad "tmux b: no answer after Ctrl-C: $(last_line b)"
# Ctrl-C at the prompt drops the half-typed line, and the program stays.
$TM send-keys -t b 'half a line' C-c
wait_for b 20 '\(Ctrl-D quits\)\n>\z' && ok || bad "tmux b: Ctrl-C at the prompt: $(last_line b)"
[ ! -s "$TMP/b.status" ] && ok || bad "tmux b: Ctrl-C at the prompt ended the program"
$TM send-keys -t b C-d
i=0
while [ ! -s "$TMP/b.status" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(cat "$TMP/b.status" 2>/dev/null)" = 0 ] && ok || bad "tmux b: Ctrl-D: exit status '$(cat "$TMP/b.status" 2>/dev/null)'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
