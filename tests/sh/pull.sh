#!/bin/sh
# pull.sh: `cumulo pull`, `models`, `rm` and model names in run, against a
# local server that answers like the Hugging Face Hub (tests/sh/lib/mock_hub.py:
# listing, 302 to a CDN, ranges) with its faults: a connection dropped
# mid-file (resumed in the same run), a pull killed midway (resumed by the
# next pull with a Range request), a wrong sha256 (refused, deleted), a gated
# repository (HF_TOKEN, never sent to the CDN), a server that ignores Range,
# a paged listing, multi-part files. Ends with "N passed, N failed".
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-../shared}
M=$SHARED/models
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
for f in stories260K-q8_0.gguf stories260K-q4_0.gguf stories260K-f32.gguf; do
    [ -f "$M/$f" ] || need_skip "$M/$f is not there (../shared models)"
done
need python3

TMP=$(mktemp -d)
HUBPID=""
NODEPID=""
cleanup() { [ -n "$HUBPID" ] && kill "$HUBPID" 2>/dev/null; [ -n "$NODEPID" ] && kill "$NODEPID" 2>/dev/null; [ -n "$KEEP" ] && echo "kept $TMP" >&2 || rm -rf "$TMP"; }
trap cleanup EXIT INT TERM

# The repositories the mock hub serves.
R=$TMP/hub
mkdir -p "$R/test-org/tiny-GGUF" "$R/test-org/one-GGUF" "$R/test-org/split-GGUF" "$R/test-org/broken-split" \
    "$R/test-org/gated-GGUF" "$R/test-org/no-gguf"
cp "$M/stories260K-q8_0.gguf" "$R/test-org/tiny-GGUF/tiny-Q8_0.gguf"
cp "$M/stories260K-q4_0.gguf" "$R/test-org/tiny-GGUF/tiny-Q4_0.gguf"
cp "$M/stories260K-f32.gguf" "$R/test-org/tiny-GGUF/tiny-F32.gguf"
echo "# tiny" > "$R/test-org/tiny-GGUF/README.md"
cp "$M/stories260K-f32.gguf" "$R/test-org/one-GGUF/model.gguf"
cp "$M/stories260K-q8_0.gguf" "$R/test-org/gated-GGUF/g-Q8_0.gguf"
echo "weights elsewhere" > "$R/test-org/no-gguf/README.md"
# multi-part: the Q8_0 model split in three as llama.cpp's gguf-split does (an
# independent Python writer); broken-split lacks part 2
python3 tests/sh/lib/gguf_split.py "$M/stories260K-q8_0.gguf" "$R/test-org/split-GGUF/big-Q8_0" 3
cp "$R/test-org/split-GGUF/big-Q8_0-00001-of-00003.gguf" "$R/test-org/split-GGUF/big-Q8_0-00003-of-00003.gguf" "$R/test-org/broken-split/"

LOG=$TMP/hub.log
start_hub() { # extra mock_hub.py options
    [ -n "$HUBPID" ] && { kill "$HUBPID" 2>/dev/null; wait "$HUBPID" 2>/dev/null; }
    : > "$LOG"
    HUBN=$((${HUBN:-0} + 1)) # a new port file each time: never read the last hub's
    python3 tests/sh/lib/mock_hub.py --root "$R" --log "$LOG" "$@" > "$TMP/hub$HUBN.port" 2> "$TMP/hub.err" &
    HUBPID=$!
    i=0
    while [ $i -lt 300 ] && ! grep -q PORT "$TMP/hub$HUBN.port" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    PORT=$(sed -n 's/^PORT //p' "$TMP/hub$HUBN.port")
    [ -n "$PORT" ] || { echo "mock hub did not start: $(cat "$TMP/hub.err")" >&2; bad "mock hub start"; }
    export HF_ENDPOINT=http://127.0.0.1:$PORT
}
export CUMULO_MODELS=$TMP/models
unset HF_TOKEN
D=$CUMULO_MODELS/test-org/tiny-GGUF

# 1. a quant by name; the file is the hub's, byte for byte; run takes the name.
start_hub --drop tiny-Q8_0.gguf:100000 --page-size 2
out=$($BIN pull test-org/tiny-GGUF:Q8_0 2>"$TMP/err"); rc=$?
check "pull :Q8_0 exits 0 ($(tail -2 "$TMP/err"))" [ "$rc" = 0 ]
check "pull prints the file's path" [ "$out" = "$D/tiny-Q8_0.gguf" ]
check "pulled bytes equal the hub's" cmp -s "$D/tiny-Q8_0.gguf" "$M/stories260K-q8_0.gguf"
check "no .part left" [ ! -e "$D/tiny-Q8_0.gguf.part" ]
check "a dropped connection is resumed in the same run" grep -q 'resuming' "$TMP/err"
check "the resume asked for the rest with a Range" grep -q '"range": "bytes=100000-"' "$LOG"
check "the listing was read over pages" grep -q '"query": "recursive=true&cursor=2"' "$LOG"
a=$($BIN run test-org/tiny-GGUF:Q8_0 -p "Once upon a time" -n 12 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
b=$($BIN run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 12 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
check "run by name gives the file's ids ($a vs $b)" [ -n "$a" ] && [ "$a" = "$b" ]
check "info by name" sh -c "$BIN info test-org/tiny-GGUF:Q8_0 2>&1 | grep -q llama"

# 2. pulling again costs nothing (no download request); --check verifies
n0=$(grep -c '/cdn/' "$LOG")
$BIN pull test-org/tiny-GGUF:Q8_0 >/dev/null 2>&1
check "a second pull downloads nothing" [ "$(grep -c '/cdn/' "$LOG")" = "$n0" ]
check "pull --check verifies" $BIN pull test-org/tiny-GGUF:Q8_0 --check

# 3. no quant: the preferred one of several (Q4_0 before Q8_0); hf:// names a file
out=$($BIN pull test-org/tiny-GGUF 2>/dev/null)
check "org/repo picks Q4_0 among Q4_0/Q8_0/F32" [ "$out" = "$D/tiny-Q4_0.gguf" ]
out=$($BIN pull hf://test-org/tiny-GGUF/tiny-F32.gguf 2>/dev/null)
check "hf:// names one file" cmp -s "$out" "$M/stories260K-f32.gguf"
out=$($BIN pull test-org/one-GGUF 2>/dev/null)
check "a repository's only GGUF" cmp -s "$out" "$M/stories260K-f32.gguf"

# 4. errors that say what to do
out=$($BIN pull test-org/tiny-GGUF:Q5_K_M 2>&1); rc=$?
check "unknown quant lists what there is ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'no Q5_K_M file' && echo '$out' | grep -q 'tiny-Q4_0.gguf'"
out=$($BIN pull test-org/nothing-here 2>&1); rc=$?
check "missing repository is a 404 naming it ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'not found'"
out=$($BIN pull test-org/no-gguf 2>&1); rc=$?
check "a repository without GGUF ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'no GGUF'"
out=$($BIN pull 'bad name/x' 2>&1); rc=$?
check "a bad name ($out)" [ "$rc" = 1 ]
out=$($BIN run test-org/not-pulled:Q4_0 -p hi -n 2 2>&1); rc=$?
check "run of a name not pulled says pull ($out)" sh -c "[ $rc != 0 ] && echo '$out' | grep -q 'cumulo pull test-org/not-pulled:Q4_0'"

# 5. a wrong sha256: refused, nothing left behind
start_hub --wrong-hash tiny-Q8_0.gguf
out=$($BIN pull hf://test-org/tiny-GGUF/tiny-Q8_0.gguf --check 2>&1); rc=$?
check "an existing file with another hash is refused with --check ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q sha256"
rm -rf "$CUMULO_MODELS"
out=$($BIN pull test-org/tiny-GGUF:Q8_0 2>&1); rc=$?
check "a download with a wrong hash fails ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'sha256 is'"
check "and leaves neither the file nor a .part" [ ! -e "$D/tiny-Q8_0.gguf" ] && [ ! -e "$D/tiny-Q8_0.gguf.part" ]

# 6. killed midway, resumed by the next pull
start_hub --slow tiny-F32.gguf:400000
$BIN pull test-org/tiny-GGUF:F32 >/dev/null 2>&1 &
p=$!
i=0
while [ $i -lt 100 ] && [ "$(stat -c %s "$D/tiny-F32.gguf.part" 2>/dev/null || echo 0)" -lt 300000 ]; do sleep 0.1; i=$((i + 1)); done
kill -9 $p 2>/dev/null; wait $p 2>/dev/null
have=$(stat -c %s "$D/tiny-F32.gguf.part" 2>/dev/null || echo 0)
check "a killed pull leaves a .part ($have bytes)" [ "$have" -gt 0 ]
start_hub
$BIN pull test-org/tiny-GGUF:F32 >/dev/null 2>"$TMP/err"
check "the next pull resumes it with a Range" grep -q "\"range\": \"bytes=$have-\"" "$LOG"
check "and the result is the hub's file" cmp -s "$D/tiny-F32.gguf" "$M/stories260K-f32.gguf"

# 7. a server that ignores Range: the resume starts over and is still right
start_hub --no-range --drop tiny-Q4_0.gguf:50000
rm -f "$D/tiny-Q4_0.gguf"
$BIN pull test-org/tiny-GGUF:Q4_0 >/dev/null 2>&1
check "no-range server: resumed download is correct" cmp -s "$D/tiny-Q4_0.gguf" "$M/stories260K-q4_0.gguf"

# 8. gated: HF_TOKEN goes to the hub, never to the CDN
start_hub --gated test-org/gated-GGUF:s3cret
out=$($BIN pull test-org/gated-GGUF 2>&1); rc=$?
check "gated without a token names HF_TOKEN ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q HF_TOKEN"
out=$(HF_TOKEN=s3cret $BIN pull test-org/gated-GGUF 2>&1); rc=$?
check "gated with HF_TOKEN ($out)" [ "$rc" = 0 ]
check "the token was sent to the hub" grep -q '"path": "/api/models/test-org/gated-GGUF/tree/main".*"auth": true' "$LOG"
check "the token was never sent to the CDN" sh -c "! grep '/cdn/' '$LOG' | grep -q '\"auth\": true'"

# 9. multi-part files: every part, joined into one file that runs like the original
start_hub
out=$($BIN pull test-org/split-GGUF:Q8_0 2>"$TMP/err"); rc=$?
S=$CUMULO_MODELS/test-org/split-GGUF
check "multi-part pull ($(tail -1 "$TMP/err"))" [ "$rc" = 0 ] && [ "$out" = "$S/big-Q8_0.gguf" ]
check "three parts were downloaded" [ "$(grep -c '/cdn/.*big-Q8_0-0000[123]-of-00003' "$LOG")" = 3 ]
check "the parts are gone, joined into one" sh -c "[ -f '$S/big-Q8_0.gguf' ] && ! ls '$S'/*-of-* 2>/dev/null | grep -q ."
a=$($BIN run test-org/split-GGUF:Q8_0 -p "Once upon a time" -n 12 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
b=$($BIN run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 12 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
check "the joined file gives the original's ids ($a vs $b)" [ -n "$a" ] && [ "$a" = "$b" ]
out=$($BIN pull test-org/split-GGUF:Q8_0 2>&1); rc=$?
check "pulling it again downloads nothing ($out)" sh -c "[ $rc = 0 ] && echo '$out' | grep -q 'already here'"
out=$($BIN pull test-org/broken-split 2>&1); rc=$?
check "a missing part is named ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'part 2 of 3'"
# parts from elsewhere: a clear error, and `cumulo merge`
P=$TMP/parts
mkdir -p "$P"
python3 tests/sh/lib/gguf_split.py "$M/stories260K-f32.gguf" "$P/s-F32" 2
out=$($BIN run "$P/s-F32-00001-of-00002.gguf" -p hi -n 2 2>&1); rc=$?
check "running a part says how to join ($out)" sh -c "[ $rc != 0 ] && echo '$out' | grep -q 'cumulo merge'"
out=$($BIN merge "$P/s-F32-00002-of-00002.gguf" 2>&1); rc=$?
check "merge joins the parts ($out)" [ "$rc" = 0 ] && [ "$out" = "$P/s-F32.gguf" ]
a=$($BIN run "$P/s-F32.gguf" -p "Once upon a time" -n 12 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
b=$($BIN run "$M/stories260K-f32.gguf" -p "Once upon a time" -n 12 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
check "merged by hand gives the original's ids" [ -n "$a" ] && [ "$a" = "$b" ]
rm "$P/s-F32-00002-of-00002.gguf"
out=$($BIN merge "$P/s-F32-00001-of-00002.gguf" "$P/x.gguf" 2>&1); rc=$?
check "merge names a missing part ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'part 2 of 2 is missing'"
cp "$P/s-F32-00001-of-00002.gguf" "$P/s-F32-00002-of-00002.gguf"
out=$($BIN merge "$P/s-F32-00001-of-00002.gguf" "$P/x.gguf" 2>&1); rc=$?
check "merge refuses a part in the wrong place ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'is not part 2 of 2'"

# 10. a node without --models maps a pulled file instead of receiving it
export CUMULO_KEY_FILE=$TMP/cluster.key
$BIN key --new --force >/dev/null 2>&1
$BIN node --port 0 --port-file "$TMP/n1.port" --threads 1 --name n1 --cache "$TMP/cache-n1" >"$TMP/n1.log" 2>&1 &
NODEPID=$!
i=0
while [ ! -s "$TMP/n1.port" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
a=$($BIN run test-org/tiny-GGUF:Q4_0 --nodes "127.0.0.1:$(cat "$TMP/n1.port")" -p "Once upon a time" -n 12 --json --threads 1 2>"$TMP/run.err" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
b=$($BIN run "$M/stories260K-q4_0.gguf" -p "Once upon a time" -n 12 --json --threads 1 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
kill $NODEPID 2>/dev/null; wait $NODEPID 2>/dev/null
check "a pulled name over a node gives the local ids ($a vs $b; $(tail -1 "$TMP/run.err"))" [ -n "$a" ] && [ "$a" = "$b" ]
nstream=$(find "$TMP/cache-n1" -type f 2>/dev/null | wc -l)
check "the node mapped the pulled file: nothing streamed into its cache ($nstream files)" [ "$nstream" = 0 ]

# 11. models lists them; rm deletes
out=$($BIN models)
check "models lists the pulled files" sh -c "echo '$out' | grep -q 'test-org/tiny-GGUF/tiny-F32.gguf' && echo '$out' | grep -q 'test-org/gated-GGUF/g-Q8_0.gguf'"
check "models shows the architecture" sh -c "echo '$out' | grep 'tiny-F32' | grep -q llama"
check "models lists a joined file once" [ "$(echo "$out" | grep -c big-Q8_0)" = 1 ]
n=$($BIN models --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
check "models --json ($n entries)" [ "$n" = 4 ]
check "rm by listed name" sh -c "$BIN rm test-org/tiny-GGUF/tiny-F32.gguf >/dev/null"
check "the file is gone" [ ! -e "$D/tiny-F32.gguf" ]
check "rm by pulled name" sh -c "$BIN rm test-org/split-GGUF:Q8_0 >/dev/null"
check "nothing left of it" sh -c "! ls '$S'/*.gguf 2>/dev/null | grep -q ."
out=$($BIN rm test-org/tiny-GGUF/nope.gguf 2>&1); rc=$?
check "rm of something not there ($out)" [ "$rc" = 1 ]
check "help" sh -c "$BIN pull --help >/dev/null"
check "models --help" sh -c "$BIN models --help >/dev/null"
check "rm --help" sh -c "$BIN rm --help >/dev/null"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
